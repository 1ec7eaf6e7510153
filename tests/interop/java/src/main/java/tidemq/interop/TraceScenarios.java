package tidemq.interop;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentLinkedQueue;
import org.apache.rocketmq.client.QueryResult;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.trace.TraceView;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.topic.TopicValidator;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;

/**
 * Message trace written by the client's own enableMsgTrace through tidemq: the producer's
 * Pub and the consumer's SubBefore/SubAfter land in RMQ_SYS_TRACE_TOPIC, the client's own
 * TraceView reads them back by the message id, and the id is reported so that the Python
 * side reads the same records with tidemq's reader.
 */
final class TraceScenarios {
    private TraceScenarios() {
    }

    static void tracedSendConsume(Env env, Map<String, Object> observed) throws Exception {
        String topic = env.name("JavaTraced");
        env.createTopic(topic, 2);
        String producerGroup = env.name("pg_traced");
        String consumerGroup = env.name("cg_traced");
        DefaultMQProducer producer = new DefaultMQProducer(producerGroup, true);
        producer.setNamesrvAddr(env.namesrv);
        producer.setInstanceName(env.name("traced-producer"));
        producer.start();
        try {
            SendResult result = producer.send(new Message(topic, "TagT", "java-trace-key",
                    "traced by java".getBytes(StandardCharsets.UTF_8)));
            String msgId = result.getMsgId();
            ConcurrentLinkedQueue<String> consumed = new ConcurrentLinkedQueue<>();
            DefaultMQPushConsumer consumer = new DefaultMQPushConsumer(consumerGroup, true);
            consumer.setNamesrvAddr(env.namesrv);
            consumer.setInstanceName(env.name("traced-consumer"));
            consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
            consumer.subscribe(topic, "*");
            consumer.registerMessageListener((MessageListenerConcurrently) (messages, context) -> {
                for (MessageExt message : messages) {
                    consumed.add(message.getMsgId());
                }
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            });
            consumer.start();
            try {
                Check.eventually(() -> consumed.contains(msgId), env.timeoutMs,
                        "the traced message consumed");
                DefaultMQAdminExt admin = env.admin();
                List<String> types = new ArrayList<>();
                Check.eventually(() -> {
                    types.clear();
                    types.addAll(traceTypes(admin, msgId));
                    return types.contains("Pub") && types.contains("SubAfter");
                }, env.timeoutMs, "Pub and SubAfter records read back by the client's TraceView");
                observed.put("msgId", msgId);
                observed.put("producerGroup", producerGroup);
                observed.put("consumerGroup", consumerGroup);
                observed.put("topic", topic);
                observed.put("traceTypes", types);
            } finally {
                consumer.shutdown();
            }
        } finally {
            producer.shutdown();
        }
    }

    private static List<String> traceTypes(DefaultMQAdminExt admin, String msgId) {
        List<String> types = new ArrayList<>();
        try {
            QueryResult found = admin.queryMessage(TopicValidator.RMQ_SYS_TRACE_TOPIC, msgId, 64,
                    0, Long.MAX_VALUE);
            for (MessageExt message : found.getMessageList()) {
                for (TraceView view : TraceView.decodeFromTraceTransData(msgId, message)) {
                    types.add(view.getMsgType());
                }
            }
        } catch (Exception notYet) {
            // the trace topic may not be routed or indexed yet
        }
        return types;
    }
}
