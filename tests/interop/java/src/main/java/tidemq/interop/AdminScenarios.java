package tidemq.interop;

import java.util.HashSet;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.common.TopicConfig;
import org.apache.rocketmq.common.admin.ConsumeStats;
import org.apache.rocketmq.common.admin.OffsetWrapper;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.common.protocol.body.ClusterInfo;
import org.apache.rocketmq.common.protocol.body.Connection;
import org.apache.rocketmq.common.protocol.body.ConsumerConnection;
import org.apache.rocketmq.common.protocol.body.KVTable;
import org.apache.rocketmq.common.protocol.body.TopicList;
import org.apache.rocketmq.common.protocol.heartbeat.ConsumeType;
import org.apache.rocketmq.common.protocol.heartbeat.MessageModel;
import org.apache.rocketmq.common.protocol.route.QueueData;
import org.apache.rocketmq.common.protocol.route.TopicRouteData;
import org.apache.rocketmq.common.subscription.SubscriptionGroupConfig;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;

/** DefaultMQAdminExt, the library behind mqadmin, against the cluster. */
final class AdminScenarios {
    private AdminScenarios() {
    }

    /** Cluster list, broker runtime stats, broker config, subscription group create. */
    static void clusterAndBroker(Env env, Map<String, Object> observed) throws Exception {
        DefaultMQAdminExt admin = env.admin();
        ClusterInfo cluster = admin.examineBrokerClusterInfo();
        Check.equal(1, cluster.getBrokerAddrTable().size(), "brokers in the cluster");
        Check.that(!cluster.getClusterAddrTable().isEmpty(), "a cluster name");
        String addr = env.masterAddr(admin);
        KVTable runtime = admin.fetchBrokerRuntimeStats(addr);
        Check.that(runtime.getTable().containsKey("brokerVersionDesc"),
                "runtime stats name the version: " + runtime.getTable().keySet());
        Check.that(runtime.getTable().containsKey("commitLogMaxOffset"),
                "runtime stats hold commitLogMaxOffset");
        observed.put("runtimeKeys", new java.util.TreeSet<>(runtime.getTable().keySet()));
        java.util.Properties config = admin.getBrokerConfig(addr);
        Check.that(config.containsKey("brokerName"), "broker config names the broker");
        String group = env.name("cg_created");
        SubscriptionGroupConfig wanted = new SubscriptionGroupConfig();
        wanted.setGroupName(group);
        wanted.setRetryMaxTimes(5);
        admin.createAndUpdateSubscriptionGroupConfig(addr, wanted);
        SubscriptionGroupConfig stored = admin.examineSubscriptionGroupConfig(addr, group);
        Check.equal(5, stored.getRetryMaxTimes(), "retryMaxTimes of the created group");
    }

    /** Create a topic, find it in the topic list and its route, stats after sends, delete it. */
    static void topicCreateRouteStats(Env env, Map<String, Object> observed) throws Exception {
        DefaultMQAdminExt admin = env.admin();
        String addr = env.masterAddr(admin);
        String topic = env.name("JavaAdminTopic");
        admin.createAndUpdateTopicConfig(addr, new TopicConfig(topic, 3, 3, 6));
        Check.eventually(() -> {
            try {
                TopicList topics = admin.fetchAllTopicList();
                return topics.getTopicList().contains(topic);
            } catch (Exception notYet) {
                return false;
            }
        }, env.timeoutMs, topic + " in the name server's topic list");
        TopicRouteData route = admin.examineTopicRouteInfo(topic);
        Check.equal(1, route.getQueueDatas().size(), "queue datas");
        QueueData queues = route.getQueueDatas().get(0);
        Check.equal(3, queues.getReadQueueNums(), "read queues");
        Check.equal(3, queues.getWriteQueueNums(), "write queues");
        Check.equal(6, queues.getPerm(), "perm");
        Check.equal(1, route.getBrokerDatas().size(), "broker datas");
        ConsumeScenarios.send(env.producer(env.name("pg_admin")), topic, "m-", 9);
        Check.equal(9L, ProduceScenarios.storedCount(admin, topic), "stored per topic stats");
        Check.equal(3, admin.examineTopicStats(topic).getOffsetTable().size(), "queues in stats");
        Set<String> brokers = new HashSet<>();
        brokers.add(addr);
        admin.deleteTopicInBroker(brokers, topic);
        String clusterName = admin.examineBrokerClusterInfo().getClusterAddrTable().keySet()
                .iterator().next();
        // 4.9.x takes (name servers, topic, cluster name) whatever its parameter names say.
        admin.deleteTopicInNameServer(new HashSet<>(java.util.List.of(env.namesrv)), topic,
                clusterName);
        Check.eventually(() -> {
            try {
                return !admin.fetchAllTopicList().getTopicList().contains(topic);
            } catch (Exception notYet) {
                return false;
            }
        }, env.timeoutMs, topic + " gone from the topic list");
    }

    static DefaultMQPushConsumer countingConsumer(Env env, String group, String topic,
            Map<String, AtomicInteger> counts) throws Exception {
        DefaultMQPushConsumer consumer = env.pushConsumer(group);
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.subscribe(topic, "*");
        consumer.registerMessageListener((MessageListenerConcurrently) (messages, context) -> {
            for (MessageExt message : messages) {
                counts.computeIfAbsent(ProduceScenarios.body(message), k -> new AtomicInteger())
                        .incrementAndGet();
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        consumer.start();
        return consumer;
    }

    /**
     * Wait until the broker holds the group's committed offsets for every message of topic
     * (consume stats: broker offsets sum to {@code messages}, no lag). A push consumer
     * commits what it consumed asynchronously: in its next pull's commitOffset, or every 5 s
     * (persistConsumerOffsetInterval), so "consumed" comes before "committed".
     */
    static void awaitCommitted(Env env, DefaultMQAdminExt admin, String group, String topic,
            long messages) throws Exception {
        Check.eventually(() -> {
            try {
                ConsumeStats stats = admin.examineConsumeStats(group);
                long lag = 0;
                long broker = 0;
                for (Map.Entry<MessageQueue, OffsetWrapper> entry
                        : stats.getOffsetTable().entrySet()) {
                    if (entry.getKey().getTopic().equals(topic)) {
                        broker += entry.getValue().getBrokerOffset();
                        lag += entry.getValue().getBrokerOffset()
                                - entry.getValue().getConsumerOffset();
                    }
                }
                return broker == messages && lag == 0;
            } catch (Exception notYet) {
                return false;
            }
        }, env.timeoutMs, "consume stats with broker offsets " + messages + " and no lag");
    }

    /** Consume stats reach zero lag; the group's connection shows its subscription. */
    static void consumeStats(Env env, Map<String, Object> observed) throws Exception {
        String topic = env.name("JavaStats");
        String group = env.name("cg_stats");
        env.createTopic(topic, 2);
        Map<String, AtomicInteger> counts = new ConcurrentHashMap<>();
        DefaultMQPushConsumer consumer = countingConsumer(env, group, topic, counts);
        ConsumeScenarios.send(env.producer(env.name("pg_stats")), topic, "s-", 10);
        Check.eventually(() -> counts.size() == 10, env.timeoutMs, "10 consumed");
        DefaultMQAdminExt admin = env.admin();
        awaitCommitted(env, admin, group, topic, 10);
        ConsumerConnection connection = admin.examineConsumerConnectionInfo(group);
        Check.equal(1, connection.getConnectionSet().size(), "connections of the group");
        Connection member = connection.getConnectionSet().iterator().next();
        Check.equal(consumer.getDefaultMQPushConsumerImpl().getmQClientFactory().getClientId(),
                member.getClientId(), "client id of the connection");
        Check.that(connection.getSubscriptionTable().containsKey(topic),
                "subscription table holds " + topic + ": " + connection.getSubscriptionTable());
        Check.equal(ConsumeType.CONSUME_PASSIVELY, connection.getConsumeType(), "consume type");
        Check.equal(MessageModel.CLUSTERING, connection.getMessageModel(), "message model");
        observed.put("language", String.valueOf(member.getLanguage()));
        observed.put("version", member.getVersion());
    }

    /** resetOffsetByTimestamp to before the first message: the live consumer gets all again. */
    static void offsetReset(Env env, Map<String, Object> observed) throws Exception {
        String topic = env.name("JavaReset");
        String group = env.name("cg_reset");
        env.createTopic(topic, 2);
        long before = System.currentTimeMillis() - 1000;
        Map<String, AtomicInteger> counts = new ConcurrentHashMap<>();
        countingConsumer(env, group, topic, counts);
        ConsumeScenarios.send(env.producer(env.name("pg_reset")), topic, "r-", 10);
        Check.eventually(() -> counts.size() == 10, env.timeoutMs, "10 consumed once");
        DefaultMQAdminExt admin = env.admin();
        // A reset needs the group's committed offsets on the broker (RocketMQ's broker
        // refuses a group with none for a queue), and the consumer commits asynchronously.
        awaitCommitted(env, admin, group, topic, 10);
        Map<MessageQueue, Long> reset = admin.resetOffsetByTimestamp(topic, group, before, true);
        long total = 0;
        for (Long offset : reset.values()) {
            total += offset;
        }
        Check.equal(0L, total, "offsets the reset went to: " + reset);
        Check.eventually(() -> counts.values().stream().allMatch(c -> c.get() >= 2),
                env.timeoutMs, "all 10 consumed again after the reset");
        observed.put("resetTo", reset.toString());
    }
}
