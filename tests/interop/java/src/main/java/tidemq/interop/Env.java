package tidemq.interop;

import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.rebalance.AllocateMessageQueueAveragely;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.common.TopicConfig;
import org.apache.rocketmq.common.protocol.body.ClusterInfo;
import org.apache.rocketmq.common.protocol.route.BrokerData;
import org.apache.rocketmq.common.protocol.route.TopicRouteData;
import org.apache.rocketmq.common.MixAll;
import org.apache.rocketmq.remoting.RPCHook;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;

/**
 * The cluster a scenario runs against and the clients it made. Names are unique per run (a
 * random suffix), so groups may share one cluster; every client made here is shut down after
 * its scenario, even when it failed.
 */
public final class Env {
    /**
     * The bound on one request of the clients made here (the client's defaults: 5 s for the
     * admin, 3 s for a send). A cold JVM on a busy machine (load average 12-20) took over 5 s
     * for its first admin request; a healthy answer takes milliseconds, so this is a bound.
     */
    static final int REQUEST_TIMEOUT_MS = 30_000;

    public final String namesrv;
    public final long timeoutMs;
    private final String runId = Integer.toHexString(new Random().nextInt(0x10000000));
    private final List<AutoCloseable> clients = new ArrayList<>();
    private int instances;
    /** Signs every client made from now on (null: unsigned); the ACL scenarios set it. */
    public RPCHook rpcHook;

    public Env(String namesrv, long timeoutMs) {
        this.namesrv = namesrv;
        this.timeoutMs = timeoutMs;
    }

    /** {@code prefix_<run id>}: a topic or group name unique to this run. */
    public String name(String prefix) {
        return prefix + "_" + runId;
    }

    private String nextInstance() {
        return "java-" + runId + "-" + (++instances);
    }

    public DefaultMQProducer producer(String group) throws Exception {
        DefaultMQProducer producer = new DefaultMQProducer(group, rpcHook);
        producer.setNamesrvAddr(namesrv);
        producer.setSendMsgTimeout(REQUEST_TIMEOUT_MS);
        producer.setInstanceName(nextInstance());
        producer.start();
        clients.add(producer::shutdown);
        return producer;
    }

    public TransactionMQProducer transactionProducer(String group) {
        TransactionMQProducer producer = new TransactionMQProducer(group, rpcHook);
        producer.setNamesrvAddr(namesrv);
        producer.setSendMsgTimeout(REQUEST_TIMEOUT_MS);
        producer.setInstanceName(nextInstance());
        clients.add(producer::shutdown);
        return producer;
    }

    /** A push consumer not yet started (the scenario subscribes and registers a listener). */
    public DefaultMQPushConsumer pushConsumer(String group) {
        DefaultMQPushConsumer consumer = new DefaultMQPushConsumer(group, rpcHook,
                new AllocateMessageQueueAveragely());
        consumer.setNamesrvAddr(namesrv);
        consumer.setInstanceName(nextInstance());
        clients.add(consumer::shutdown);
        return consumer;
    }

    public DefaultLitePullConsumer litePullConsumer(String group) {
        DefaultLitePullConsumer consumer = new DefaultLitePullConsumer(group, rpcHook);
        consumer.setNamesrvAddr(namesrv);
        consumer.setInstanceName(nextInstance());
        clients.add(consumer::shutdown);
        return consumer;
    }

    public DefaultMQAdminExt admin() throws Exception {
        DefaultMQAdminExt admin = new DefaultMQAdminExt(rpcHook, REQUEST_TIMEOUT_MS);
        admin.setNamesrvAddr(namesrv);
        admin.setInstanceName(nextInstance());
        admin.start();
        clients.add(admin::shutdown);
        return admin;
    }

    /** The first master's address in the cluster (scenarios here run one broker). */
    public String masterAddr(DefaultMQAdminExt admin) throws Exception {
        ClusterInfo cluster = admin.examineBrokerClusterInfo();
        for (BrokerData broker : cluster.getBrokerAddrTable().values()) {
            String addr = broker.getBrokerAddrs().get(MixAll.MASTER_ID);
            if (addr != null) {
                return addr;
            }
        }
        throw new AssertionError("the cluster lists no master: " + cluster.getBrokerAddrTable());
    }

    /** Creates {@code topic} with {@code queues} queues on every master; waits for its route. */
    public void createTopic(String topic, int queues) throws Exception {
        DefaultMQAdminExt admin = admin();
        ClusterInfo cluster = admin.examineBrokerClusterInfo();
        for (BrokerData broker : cluster.getBrokerAddrTable().values()) {
            String addr = broker.getBrokerAddrs().get(MixAll.MASTER_ID);
            if (addr != null) {
                admin.createAndUpdateTopicConfig(addr, new TopicConfig(topic, queues, queues, 6));
            }
        }
        Check.eventually(() -> routed(admin, topic), 30_000, "a route for " + topic);
    }

    private static boolean routed(DefaultMQAdminExt admin, String topic) {
        try {
            TopicRouteData route = admin.examineTopicRouteInfo(topic);
            return route != null && !route.getQueueDatas().isEmpty();
        } catch (Exception notYet) {
            return false;
        }
    }

    void closeAll() {
        for (int i = clients.size() - 1; i >= 0; i--) {
            try {
                clients.get(i).close();
            } catch (Exception ignored) {
                // a client that failed to start cannot shut down cleanly: nothing to keep
            }
        }
        clients.clear();
    }
}
