package tidemq.interop;

import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.MessageSelector;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.listener.MessageListenerOrderly;
import org.apache.rocketmq.client.impl.consumer.ProcessQueue;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.common.protocol.heartbeat.MessageModel;

/** Push (clustering, broadcasting, orderly), lite pull, and broker-side filters. */
final class ConsumeScenarios {
    private ConsumeScenarios() {
    }

    /** Records every delivered body (by consumer) and answers CONSUME_SUCCESS. */
    static MessageListenerConcurrently recorder(Collection<String> into) {
        return (messages, context) -> {
            for (MessageExt message : messages) {
                into.add(ProduceScenarios.body(message));
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        };
    }

    static Set<String> numbered(String prefix, int count) {
        Set<String> bodies = new TreeSet<>();
        for (int i = 0; i < count; i++) {
            bodies.add(prefix + i);
        }
        return bodies;
    }

    /** Queues of {@code topic} the consumer pulls from (its %RETRY% queue not counted). */
    static long heldQueues(DefaultMQPushConsumer consumer, String topic) {
        return consumer.getDefaultMQPushConsumerImpl().getRebalanceImpl()
                .getProcessQueueTable().keySet().stream()
                .filter(queue -> queue.getTopic().equals(topic)).count();
    }

    static void send(DefaultMQProducer producer, String topic, String prefix, int count)
            throws Exception {
        for (int i = 0; i < count; i++) {
            producer.send(ProduceScenarios.message(topic, prefix + i, "TagA", prefix + "key" + i));
        }
    }

    /** Two members of one group share 4 queues 2 + 2 and together get every message. */
    static void pushClustering(Env env, Map<String, Object> observed) throws Exception {
        String topic = env.name("JavaCluster");
        String group = env.name("cg_cluster");
        env.createTopic(topic, 4);
        List<ConcurrentLinkedQueue<String>> received = new ArrayList<>();
        List<DefaultMQPushConsumer> consumers = new ArrayList<>();
        for (int i = 0; i < 2; i++) {
            ConcurrentLinkedQueue<String> into = new ConcurrentLinkedQueue<>();
            DefaultMQPushConsumer consumer = env.pushConsumer(group);
            consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
            consumer.subscribe(topic, "*");
            consumer.registerMessageListener(recorder(into));
            consumer.start();
            received.add(into);
            consumers.add(consumer);
        }
        Check.eventually(() -> heldQueues(consumers.get(0), topic) == 2
                && heldQueues(consumers.get(1), topic) == 2, env.timeoutMs,
                "each of two consumers holding 2 of the 4 queues");
        send(env.producer(env.name("pg_cluster")), topic, "c-", 40);
        Check.eventually(() -> new HashSet<String>() {{
                addAll(received.get(0));
                addAll(received.get(1));
            }}.size() == 40, env.timeoutMs, "all 40 messages consumed by the group");
        Check.that(!received.get(0).isEmpty() && !received.get(1).isEmpty(),
                "both members consumed: " + received.get(0).size() + " + "
                + received.get(1).size());
        observed.put("perMember", List.of(received.get(0).size(), received.get(1).size()));
    }

    /** Two broadcasting members each get every message. */
    static void pushBroadcasting(Env env, Map<String, Object> observed) throws Exception {
        String topic = env.name("JavaBroadcast");
        String group = env.name("cg_broadcast");
        env.createTopic(topic, 2);
        List<Set<String>> received = new ArrayList<>();
        for (int i = 0; i < 2; i++) {
            Set<String> into = ConcurrentHashMap.newKeySet();
            DefaultMQPushConsumer consumer = env.pushConsumer(group);
            consumer.setMessageModel(MessageModel.BROADCASTING);
            consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
            consumer.subscribe(topic, "*");
            consumer.registerMessageListener(recorder(into));
            consumer.start();
            received.add(into);
        }
        send(env.producer(env.name("pg_broadcast")), topic, "b-", 20);
        Set<String> all = numbered("b-", 20);
        Check.eventually(() -> received.get(0).equals(all) && received.get(1).equals(all),
                env.timeoutMs, "both broadcasting members getting all 20");
    }

    /** subscribe + poll + commitSync; the committed offsets are the queues' max offsets. */
    static void litePullSubscribe(Env env, Map<String, Object> observed) throws Exception {
        String topic = env.name("JavaLite");
        env.createTopic(topic, 2);
        send(env.producer(env.name("pg_lite")), topic, "l-", 20);
        DefaultLitePullConsumer consumer = env.litePullConsumer(env.name("cg_lite"));
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.setAutoCommit(false);
        consumer.subscribe(topic, "*");
        consumer.start();
        Set<String> received = new TreeSet<>();
        long deadline = System.currentTimeMillis() + env.timeoutMs;
        while (received.size() < 20 && System.currentTimeMillis() < deadline) {
            for (MessageExt message : consumer.poll(1000)) {
                received.add(ProduceScenarios.body(message));
            }
        }
        Check.equal(numbered("l-", 20), received, "polled bodies");
        consumer.commitSync();
        long committed = 0;
        for (MessageQueue queue : consumer.fetchMessageQueues(topic)) {
            committed += consumer.committed(queue);
        }
        Check.equal(20L, committed, "committed offsets summed over the queues");
    }

    /** assign + seek: a queue read from offset 3; seekToBegin and seekToEnd. */
    static void litePullAssignSeek(Env env, Map<String, Object> observed) throws Exception {
        String topic = env.name("JavaAssign");
        env.createTopic(topic, 1);
        send(env.producer(env.name("pg_assign")), topic, "a-", 10);
        DefaultLitePullConsumer consumer = env.litePullConsumer(env.name("cg_assign"));
        consumer.setAutoCommit(false);
        consumer.start();
        List<MessageQueue> queues = new ArrayList<>(consumer.fetchMessageQueues(topic));
        Check.equal(1, queues.size(), "queues of a one-queue topic");
        consumer.assign(queues);
        consumer.seek(queues.get(0), 3);
        List<Long> offsets = pollOffsets(consumer, 7, env.timeoutMs);
        Check.equal(List.of(3L, 4L, 5L, 6L, 7L, 8L, 9L), offsets, "offsets after seek(3)");
        consumer.seekToBegin(queues.get(0));
        Check.equal(0L, pollOffsets(consumer, 10, env.timeoutMs).get(0), "first after seekToBegin");
        consumer.seekToEnd(queues.get(0));
        send(env.producer(env.name("pg_assign2")), topic, "z-", 1);
        Check.equal(List.of(10L), pollOffsets(consumer, 1, env.timeoutMs), "after seekToEnd");
    }

    static List<Long> pollOffsets(DefaultLitePullConsumer consumer, int count, long timeoutMs) {
        List<Long> offsets = new ArrayList<>();
        long deadline = System.currentTimeMillis() + timeoutMs;
        while (offsets.size() < count && System.currentTimeMillis() < deadline) {
            for (MessageExt message : consumer.poll(1000)) {
                offsets.add(message.getQueueOffset());
            }
        }
        return offsets;
    }

    /** "TagA || TagC": exactly the A and C messages arrive. */
    static void tagFilter(Env env, Map<String, Object> observed) throws Exception {
        String topic = env.name("JavaTags");
        env.createTopic(topic, 1);
        Set<String> received = ConcurrentHashMap.newKeySet();
        Set<String> tags = ConcurrentHashMap.newKeySet();
        DefaultMQPushConsumer consumer = env.pushConsumer(env.name("cg_tags"));
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.subscribe(topic, "TagA || TagC");
        consumer.registerMessageListener((MessageListenerConcurrently) (messages, context) -> {
            for (MessageExt message : messages) {
                received.add(ProduceScenarios.body(message));
                tags.add(message.getTags());
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        consumer.start();
        DefaultMQProducer producer = env.producer(env.name("pg_tags"));
        Set<String> wanted = new TreeSet<>();
        String[] cycle = {"TagA", "TagB", "TagC"};
        for (int i = 0; i < 30; i++) {
            String tag = cycle[i % 3];
            producer.send(ProduceScenarios.message(topic, "t-" + i, tag, "tkey-" + i));
            if (!tag.equals("TagB")) {
                wanted.add("t-" + i);
            }
        }
        // The last message (t-29, TagC) comes after every B in the one queue: once it is in,
        // every B has been filtered out or delivered.
        Check.eventually(() -> received.containsAll(wanted), env.timeoutMs, "the A and C messages");
        Check.equal(wanted, new TreeSet<>(received), "bodies delivered for TagA || TagC");
        Check.equal(Set.of("TagA", "TagC"), new HashSet<>(tags), "tags delivered");
    }

    /** A SQL92 selector on user properties, evaluated by the broker. */
    static void sql92Filter(Env env, Map<String, Object> observed) throws Exception {
        String topic = env.name("JavaSql");
        env.createTopic(topic, 1);
        Set<String> received = ConcurrentHashMap.newKeySet();
        DefaultMQPushConsumer consumer = env.pushConsumer(env.name("cg_sql"));
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.subscribe(topic, MessageSelector.bySql(
                "a BETWEEN 3 AND 12 AND region = 'eu' AND TAGS IS NOT NULL"));
        consumer.registerMessageListener(recorder(received));
        consumer.start();
        DefaultMQProducer producer = env.producer(env.name("pg_sql"));
        Set<String> wanted = new TreeSet<>();
        for (int i = 0; i < 20; i++) {
            Message message = ProduceScenarios.message(topic, "s-" + i, "TagS", "skey-" + i);
            String region = i % 2 == 0 ? "eu" : "us";
            message.putUserProperty("a", String.valueOf(i));
            message.putUserProperty("region", region);
            producer.send(message);
            if (i >= 3 && i <= 12 && region.equals("eu")) {
                wanted.add("s-" + i);
            }
        }
        Message last = ProduceScenarios.message(topic, "s-last", "TagS", "skey-last");
        last.putUserProperty("a", "12");
        last.putUserProperty("region", "eu");
        producer.send(last);
        wanted.add("s-last");
        Check.eventually(() -> received.contains("s-last"), env.timeoutMs, "the last match");
        Check.equal(wanted, new TreeSet<>(received), "bodies matching the SQL92 selector");
    }

    /**
     * Orderly: per-order steps in order, a SUSPEND answered once (redelivered in place), and
     * with a second member the 4 queues are locked by exactly one member each.
     */
    static void orderly(Env env, Map<String, Object> observed) throws Exception {
        String topic = env.name("JavaOrderly");
        String group = env.name("cg_orderly");
        env.createTopic(topic, 4);
        Map<String, List<Integer>> steps = new ConcurrentHashMap<>();
        AtomicBoolean suspended = new AtomicBoolean();
        MessageListenerOrderly listener = (messages, context) -> {
            for (MessageExt message : messages) {
                String[] parts = ProduceScenarios.body(message).split(":");
                if (parts[0].equals("order-2") && parts[1].equals("3")
                        && suspended.compareAndSet(false, true)) {
                    return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT;
                }
            }
            for (MessageExt message : messages) {
                String[] parts = ProduceScenarios.body(message).split(":");
                steps.computeIfAbsent(parts[0], k -> new ArrayList<>())
                        .add(Integer.parseInt(parts[1]));
            }
            return ConsumeOrderlyStatus.SUCCESS;
        };
        List<DefaultMQPushConsumer> members = new ArrayList<>();
        for (int i = 0; i < 2; i++) {
            DefaultMQPushConsumer consumer = env.pushConsumer(group);
            consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
            consumer.subscribe(topic, "*");
            consumer.registerMessageListener(listener);
            consumer.start();
            members.add(consumer);
        }
        Check.eventually(() -> lockedQueues(members.get(0), topic).size() == 2
                && lockedQueues(members.get(1), topic).size() == 2, env.timeoutMs,
                "each member holding the broker lock of 2 of the 4 queues");
        Set<MessageQueue> both = new HashSet<>(lockedQueues(members.get(0), topic));
        both.retainAll(lockedQueues(members.get(1), topic));
        Check.that(both.isEmpty(), "queues locked by both members: " + both);
        DefaultMQProducer producer = env.producer(env.name("pg_orderly"));
        Map<String, Integer> queueOf = new HashMap<>();
        for (int step = 0; step < 8; step++) {
            for (int order = 0; order < 5; order++) {
                String key = "order-" + order;
                SendResult result = producer.send(
                        ProduceScenarios.message(topic, key + ":" + step, "TagO", key),
                        (queues, message, arg) -> queues.get((Integer) arg % queues.size()),
                        order);
                Integer before = queueOf.putIfAbsent(key, result.getMessageQueue().getQueueId());
                Check.that(before == null || before == result.getMessageQueue().getQueueId(),
                        key + " moved between queues");
            }
        }
        Check.eventually(() -> steps.values().stream().mapToInt(List::size).sum() >= 40,
                env.timeoutMs, "all 40 orderly messages");
        for (Map.Entry<String, List<Integer>> order : steps.entrySet()) {
            Check.equal(List.of(0, 1, 2, 3, 4, 5, 6, 7), order.getValue(),
                    "steps of " + order.getKey() + " in consumption order");
        }
        Check.that(suspended.get(), "the SUSPEND answer was given");
    }

    static Set<MessageQueue> lockedQueues(DefaultMQPushConsumer consumer, String topic) {
        Set<MessageQueue> locked = new HashSet<>();
        for (Map.Entry<MessageQueue, ProcessQueue> entry : consumer.getDefaultMQPushConsumerImpl()
                .getRebalanceImpl().getProcessQueueTable().entrySet()) {
            if (entry.getKey().getTopic().equals(topic) && entry.getValue().isLocked()
                    && !entry.getValue().isLockExpired()) {
                locked.add(entry.getKey());
            }
        }
        return locked;
    }
}
