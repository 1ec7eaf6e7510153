package tidemq.interop;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import org.apache.rocketmq.client.QueryResult;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.client.producer.TransactionSendResult;
import org.apache.rocketmq.common.MixAll;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;

/**
 * Delay levels, retry then dead-letter queue, and transactions with a check listener. The
 * broker runs with short delay levels ("1s 2s 1s 1s ...") and a 1 s transaction check, so
 * these take seconds, not minutes.
 */
final class ReliabilityScenarios {
    private ReliabilityScenarios() {
    }

    /** A level-2 message (2 s) arrives after the immediate one, on its own topic and tags. */
    static void delayLevels(Env env, Map<String, Object> observed) throws Exception {
        String topic = env.name("JavaDelay");
        env.createTopic(topic, 2);
        Map<String, MessageExt> received = new ConcurrentHashMap<>();
        Map<String, Long> receivedAt = new ConcurrentHashMap<>();
        DefaultMQPushConsumer consumer = env.pushConsumer(env.name("cg_delay"));
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.subscribe(topic, "*");
        consumer.registerMessageListener((MessageListenerConcurrently) (messages, context) -> {
            for (MessageExt message : messages) {
                received.put(ProduceScenarios.body(message), message);
                receivedAt.put(ProduceScenarios.body(message), System.currentTimeMillis());
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        consumer.start();
        DefaultMQProducer producer = env.producer(env.name("pg_delay"));
        Message delayed = ProduceScenarios.message(topic, "delayed", "TagD", "dkey");
        delayed.setDelayTimeLevel(2);
        long sentAt = System.currentTimeMillis();
        Check.equal(SendStatus.SEND_OK, producer.send(delayed).getSendStatus(), "delayed send");
        producer.send(ProduceScenarios.message(topic, "now", "TagD", "nkey"));
        Check.eventually(() -> received.containsKey("delayed"), env.timeoutMs, "the delayed one");
        Check.that(received.containsKey("now"), "the immediate one before the delayed one");
        MessageExt message = received.get("delayed");
        Check.equal(topic, message.getTopic(), "topic of the delivered delayed message");
        observed.put("delayedProperties", message.getProperties());
        Check.equal("TagD", message.getTags(), "tags of the delayed message");
        // A lower bound only (a level may fire late on a busy machine, never early by a second).
        long waited = receivedAt.get("delayed") - sentAt;
        Check.that(waited >= 1000, "level 2 (2 s) delivered after " + waited + " ms");
        observed.put("delayedAfterMs", waited);
    }

    /** RECONSUME_LATER three times with maxReconsumeTimes=2: then %DLQ%group holds it. */
    static void retryThenDlq(Env env, Map<String, Object> observed) throws Exception {
        String topic = env.name("JavaRetry");
        String group = env.name("cg_retry");
        env.createTopic(topic, 2);
        ConcurrentLinkedQueue<Integer> poisonDeliveries = new ConcurrentLinkedQueue<>();
        Set<String> good = ConcurrentHashMap.newKeySet();
        DefaultMQPushConsumer consumer = env.pushConsumer(group);
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.setMaxReconsumeTimes(2);
        consumer.subscribe(topic, "*");
        consumer.registerMessageListener((MessageListenerConcurrently) (messages, context) -> {
            for (MessageExt message : messages) {
                if (ProduceScenarios.body(message).equals("poison")) {
                    poisonDeliveries.add(message.getReconsumeTimes());
                    return ConsumeConcurrentlyStatus.RECONSUME_LATER;
                }
                good.add(ProduceScenarios.body(message));
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        consumer.setConsumeMessageBatchMaxSize(1);
        consumer.start();
        DefaultMQProducer producer = env.producer(env.name("pg_retry"));
        producer.send(ProduceScenarios.message(topic, "poison", "TagR", "poison-key"));
        for (int i = 0; i < 5; i++) {
            producer.send(ProduceScenarios.message(topic, "good-" + i, "TagR", "gkey-" + i));
        }
        DefaultMQAdminExt admin = env.admin();
        String dlq = MixAll.DLQ_GROUP_TOPIC_PREFIX + group;
        List<MessageExt> dead = new ArrayList<>();
        Check.eventually(() -> {
            try {
                QueryResult found = admin.queryMessage(dlq, "poison-key", 32, 0, Long.MAX_VALUE);
                dead.clear();
                dead.addAll(found.getMessageList());
                return !dead.isEmpty();
            } catch (Exception notYet) {
                return false;
            }
        }, env.timeoutMs, "the poison message in " + dlq);
        Check.equal(List.of(0, 1, 2), new ArrayList<>(poisonDeliveries),
                "reconsumeTimes of the poison message's deliveries");
        Check.equal(5, good.size(), "good messages consumed once each");
        MessageExt inDlq = dead.get(0);
        Check.equal("poison", ProduceScenarios.body(inDlq), "DLQ body");
        Check.equal(topic, inDlq.getProperty("RETRY_TOPIC"), "RETRY_TOPIC of the DLQ message");
        observed.put("dlqReconsumeTimes", inDlq.getReconsumeTimes());
        observed.put("dlqProperties", inDlq.getProperties());
    }

    /**
     * commit, rollback, unknown then check->commit, unknown then check->rollback: exactly the
     * committed two are delivered, and the broker asked the producer about the unknown two.
     */
    static void transactions(Env env, Map<String, Object> observed) throws Exception {
        String topic = env.name("JavaTx");
        env.createTopic(topic, 2);
        Set<String> checked = ConcurrentHashMap.newKeySet();
        TransactionMQProducer producer = env.transactionProducer(env.name("pg_tx"));
        producer.setTransactionListener(new TransactionListener() {
            @Override
            public LocalTransactionState executeLocalTransaction(Message message, Object arg) {
                String body = new String(message.getBody());
                if (body.startsWith("commit")) {
                    return LocalTransactionState.COMMIT_MESSAGE;
                }
                if (body.startsWith("rollback")) {
                    return LocalTransactionState.ROLLBACK_MESSAGE;
                }
                return LocalTransactionState.UNKNOW;
            }

            @Override
            public LocalTransactionState checkLocalTransaction(MessageExt message) {
                String body = ProduceScenarios.body(message);
                checked.add(body);
                return body.equals("unknown-then-commit") ? LocalTransactionState.COMMIT_MESSAGE
                        : LocalTransactionState.ROLLBACK_MESSAGE;
            }
        });
        producer.start();
        Set<String> received = ConcurrentHashMap.newKeySet();
        DefaultMQPushConsumer consumer = env.pushConsumer(env.name("cg_tx"));
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.subscribe(topic, "*");
        consumer.registerMessageListener(ConsumeScenarios.recorder(received));
        consumer.start();
        List<String> states = new ArrayList<>();
        for (String body : List.of("commit", "rollback", "unknown-then-commit",
                "unknown-then-rollback")) {
            TransactionSendResult result = producer.sendMessageInTransaction(
                    ProduceScenarios.message(topic, body, "TagT", "tx-" + body), null);
            Check.equal(SendStatus.SEND_OK, result.getSendStatus(), "half send of " + body);
            states.add(body + "=" + result.getLocalTransactionState());
        }
        observed.put("localStates", states);
        Check.eventually(() -> received.contains("unknown-then-commit")
                && checked.contains("unknown-then-rollback"), env.timeoutMs,
                "the check of both unknown transactions");
        // The committed ones are in; a rolled-back one would have been dispatched by now too
        // (the check that rolled back ran before or with the committing check).
        producer.send(ProduceScenarios.message(topic, "after", "TagT", "tx-after"));
        Check.eventually(() -> received.contains("after"), env.timeoutMs, "a plain message after");
        Check.equal(new TreeSet<>(List.of("commit", "unknown-then-commit", "after")),
                new TreeSet<>(received), "delivered bodies");
        Check.that(checked.contains("unknown-then-commit"), "check asked for the committed one");
        Check.that(!checked.contains("commit") && !checked.contains("rollback"),
                "no check for transactions already ended: " + checked);
    }
}
