package tidemq.interop;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.apache.rocketmq.client.QueryResult;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendCallback;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.admin.TopicOffset;
import org.apache.rocketmq.common.admin.TopicStatsTable;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;

/** Sends of every kind, and the lookups a producer (MQAdmin) offers on what it stored. */
final class ProduceScenarios {
    private ProduceScenarios() {
    }

    static Message message(String topic, String body, String tags, String keys) {
        Message message = new Message(topic, tags, keys, body.getBytes(StandardCharsets.UTF_8));
        message.putUserProperty("origin", "java");
        return message;
    }

    static String body(MessageExt message) {
        return new String(message.getBody(), StandardCharsets.UTF_8);
    }

    /** Sync sends; each stored message read back by its offset msg id and its unique key. */
    static void syncSend(Env env, Map<String, Object> observed) throws Exception {
        String topic = env.name("JavaSync");
        env.createTopic(topic, 4);
        DefaultMQProducer producer = env.producer(env.name("pg_sync"));
        List<SendResult> results = new ArrayList<>();
        for (int i = 0; i < 12; i++) {
            SendResult result = producer.send(message(topic, "sync-" + i, "TagA", "key-" + i));
            Check.equal(SendStatus.SEND_OK, result.getSendStatus(), "send status of sync-" + i);
            Check.that(result.getMsgId().matches("[0-9A-F]{32,56}"), "unique key " + result);
            Check.that(result.getOffsetMsgId().matches("[0-9A-F]{32}"), "offset id " + result);
            results.add(result);
        }
        Set<String> seen = new HashSet<>();
        for (SendResult result : results) {
            Check.that(seen.add(result.getMessageQueue().getQueueId() + "@"
                    + result.getQueueOffset()), "queue offset handed out twice: " + result);
        }
        for (int i = 0; i < results.size(); i++) {
            SendResult result = results.get(i);
            MessageExt byOffsetId = producer.viewMessage(result.getOffsetMsgId());
            Check.equal("sync-" + i, body(byOffsetId), "body by offset msg id");
            Check.equal("TagA", byOffsetId.getTags(), "tags by offset msg id");
            Check.equal("key-" + i, byOffsetId.getKeys(), "keys by offset msg id");
            Check.equal("java", byOffsetId.getUserProperty("origin"), "user property");
            Check.equal(result.getQueueOffset(), byOffsetId.getQueueOffset(), "queue offset");
            Check.equal(result.getMessageQueue().getQueueId(), byOffsetId.getQueueId(), "queue");
            Check.equal(result.getMsgId(), byOffsetId.getMsgId(), "unique key as msg id");
            MessageExt byUniqueKey = producer.viewMessage(topic, result.getMsgId());
            Check.equal("sync-" + i, body(byUniqueKey), "body by unique key");
        }
        observed.put("queueOffsets", results.stream()
                .map(r -> r.getMessageQueue().getQueueId() + ":" + r.getQueueOffset()).toArray());
    }

    /** Async sends: every callback reports SEND_OK and the broker holds every one. */
    static void asyncSend(Env env, Map<String, Object> observed) throws Exception {
        String topic = env.name("JavaAsync");
        env.createTopic(topic, 4);
        DefaultMQProducer producer = env.producer(env.name("pg_async"));
        int count = 40;
        CountDownLatch done = new CountDownLatch(count);
        ConcurrentLinkedQueue<Object> outcomes = new ConcurrentLinkedQueue<>();
        for (int i = 0; i < count; i++) {
            producer.send(message(topic, "async-" + i, "TagA", "akey-" + i), new SendCallback() {
                @Override
                public void onSuccess(SendResult result) {
                    outcomes.add(result);
                    done.countDown();
                }

                @Override
                public void onException(Throwable failure) {
                    outcomes.add(failure);
                    done.countDown();
                }
            });
        }
        Check.that(done.await(env.timeoutMs, TimeUnit.MILLISECONDS), "every async callback");
        for (Object outcome : outcomes) {
            Check.that(outcome instanceof SendResult
                    && ((SendResult) outcome).getSendStatus() == SendStatus.SEND_OK,
                    "async send outcome " + outcome);
        }
        Check.equal((long) count, storedCount(env, topic), "messages stored");
    }

    /** Oneway sends get no answer; the broker's max offsets show every one was stored. */
    static void onewaySend(Env env, Map<String, Object> observed) throws Exception {
        String topic = env.name("JavaOneway");
        env.createTopic(topic, 4);
        DefaultMQProducer producer = env.producer(env.name("pg_oneway"));
        for (int i = 0; i < 20; i++) {
            producer.sendOneway(message(topic, "oneway-" + i, "TagA", "okey-" + i));
        }
        DefaultMQAdminExt admin = env.admin();
        Check.eventually(() -> {
            try {
                return storedCount(admin, topic) == 20;
            } catch (Exception notYet) {
                return false;
            }
        }, env.timeoutMs, "20 oneway messages stored");
    }

    /** One batch of 32 x 1 KiB: one queue, consecutive offsets, each readable by its id. */
    static void batchSend(Env env, Map<String, Object> observed) throws Exception {
        String topic = env.name("JavaBatch");
        env.createTopic(topic, 4);
        DefaultMQProducer producer = env.producer(env.name("pg_batch"));
        List<Message> batch = new ArrayList<>();
        String padding = "x".repeat(1000);
        for (int i = 0; i < 32; i++) {
            batch.add(message(topic, "batch-" + i + "-" + padding, "TagB", "bkey-" + i));
        }
        SendResult result = producer.send(batch);
        Check.equal(SendStatus.SEND_OK, result.getSendStatus(), "batch send status");
        String[] ids = result.getMsgId().split(",");
        Check.equal(32, ids.length, "unique keys in the batch's msg id");
        String[] offsetIds = result.getOffsetMsgId().split(",");
        Check.equal(32, offsetIds.length, "offset msg ids of the batch");
        for (int i = 0; i < 32; i++) {
            MessageExt stored = producer.viewMessage(offsetIds[i]);
            Check.equal("batch-" + i + "-" + padding, body(stored), "batch body " + i);
            Check.equal(result.getQueueOffset() + i, stored.getQueueOffset(), "batch offset " + i);
            Check.equal(ids[i], stored.getMsgId(), "batch unique key " + i);
            Check.equal("bkey-" + i, stored.getKeys(), "batch keys " + i);
        }
        observed.put("queueId", result.getMessageQueue().getQueueId());
        observed.put("firstOffset", result.getQueueOffset());
    }

    /** queryMessage by key within a time range; a key never sent finds nothing. */
    static void queryMessage(Env env, Map<String, Object> observed) throws Exception {
        String topic = env.name("JavaQuery");
        env.createTopic(topic, 2);
        DefaultMQProducer producer = env.producer(env.name("pg_query"));
        long begin = System.currentTimeMillis() - 60_000;
        for (int i = 0; i < 6; i++) {
            producer.send(message(topic, "query-" + i, "TagQ", "order-" + (i % 3)));
        }
        long end = System.currentTimeMillis() + 60_000;
        QueryResult found = producer.queryMessage(topic, "order-1", 32, begin, end);
        List<String> bodies = new ArrayList<>();
        for (MessageExt message : found.getMessageList()) {
            bodies.add(body(message));
        }
        bodies.sort(null);
        Check.equal(List.of("query-1", "query-4"), bodies, "messages with key order-1");
        try {
            QueryResult none = producer.queryMessage(topic, "no-such-key", 32, begin, end);
            Check.equal(0, none.getMessageList().size(), "messages with an unknown key");
        } catch (org.apache.rocketmq.client.exception.MQClientException expected) {
            // RocketMQ's client reports "query message by key finished, but no message" so
            observed.put("unknownKey", expected.getErrorMessage());
        }
    }

    /** searchOffset by time, and min / max offsets and earliest store time of a queue. */
    static void searchOffset(Env env, Map<String, Object> observed) throws Exception {
        String topic = env.name("JavaSearch");
        env.createTopic(topic, 1);
        DefaultMQProducer producer = env.producer(env.name("pg_search"));
        MessageQueue queue = producer.fetchPublishMessageQueues(topic).get(0);
        List<SendResult> results = new ArrayList<>();
        long before = System.currentTimeMillis() - 1;
        for (int i = 0; i < 5; i++) {
            results.add(producer.send(message(topic, "search-" + i, "TagS", "skey-" + i)));
        }
        MessageExt third = producer.viewMessage(results.get(2).getOffsetMsgId());
        Check.equal(0L, producer.minOffset(queue), "min offset");
        Check.equal(5L, producer.maxOffset(queue), "max offset");
        MessageExt first = producer.viewMessage(results.get(0).getOffsetMsgId());
        Check.equal(first.getStoreTimestamp(), producer.earliestMsgStoreTime(queue),
                "earliest store time");
        Check.equal(0L, producer.searchOffset(queue, before), "offset at a time before all");
        long atThird = producer.searchOffset(queue, third.getStoreTimestamp());
        Check.that(atThird <= 2, "offset at the third's store time is " + atThird);
        long future = producer.searchOffset(queue, System.currentTimeMillis() + 3_600_000);
        observed.put("searchFuture", future);
        Check.that(future == 4 || future == 5, "offset at a time after all is " + future);
    }

    static long storedCount(Env env, String topic) throws Exception {
        return storedCount(env.admin(), topic);
    }

    static long storedCount(DefaultMQAdminExt admin, String topic) throws Exception {
        TopicStatsTable stats = admin.examineTopicStats(topic);
        long total = 0;
        for (TopicOffset offset : stats.getOffsetTable().values()) {
            total += offset.getMaxOffset() - offset.getMinOffset();
        }
        return total;
    }
}
