package tidemq.interop;

import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.rocketmq.acl.common.AclClientRPCHook;
import org.apache.rocketmq.acl.common.SessionCredentials;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.exception.MQBrokerException;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.RequestCallback;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.client.utils.MessageUtil;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;

/** Request-reply and ACL signing (features that landed after the first scenarios). */
final class ExtraScenarios {
    private ExtraScenarios() {
    }

    /**
     * DefaultMQProducer.request (sync and async): a push consumer answers each request with
     * MessageUtil.createReplyMessage, sent by a producer; the broker pushes the reply to the
     * requester's connection.
     */
    static void requestReply(Env env, Map<String, Object> observed) throws Exception {
        String topic = env.name("JavaRequest");
        env.createTopic(topic, 2);
        DefaultMQProducer replier = env.producer(env.name("pg_replier"));
        DefaultMQPushConsumer consumer = env.pushConsumer(env.name("cg_replier"));
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.subscribe(topic, "*");
        consumer.registerMessageListener((MessageListenerConcurrently) (messages, context) -> {
            for (MessageExt request : messages) {
                try {
                    byte[] answer = ("re:" + ProduceScenarios.body(request))
                            .getBytes(StandardCharsets.UTF_8);
                    Message reply = MessageUtil.createReplyMessage(request, answer);
                    replier.send(reply);
                } catch (Exception failure) {
                    return ConsumeConcurrentlyStatus.RECONSUME_LATER;
                }
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        consumer.start();
        DefaultMQProducer requester = env.producer(env.name("pg_requester"));
        Message reply = requester.request(
                ProduceScenarios.message(topic, "question-1", "TagQ", "q1"), 30_000);
        Check.that(reply != null, "a reply to the sync request");
        Check.equal("re:question-1", new String(reply.getBody(), StandardCharsets.UTF_8),
                "sync reply body");
        CountDownLatch answered = new CountDownLatch(1);
        AtomicReference<Object> outcome = new AtomicReference<>();
        requester.request(ProduceScenarios.message(topic, "question-2", "TagQ", "q2"),
                new RequestCallback() {
                    @Override
                    public void onSuccess(Message message) {
                        outcome.set(new String(message.getBody(), StandardCharsets.UTF_8));
                        answered.countDown();
                    }

                    @Override
                    public void onException(Throwable failure) {
                        outcome.set(failure);
                        answered.countDown();
                    }
                }, 30_000);
        Check.that(answered.await(env.timeoutMs, TimeUnit.MILLISECONDS), "the async reply");
        Check.equal("re:question-2", outcome.get(), "async reply body");
        observed.put("replyTopic", reply.getTopic());
    }

    /**
     * Against a broker with aclEnable=true (tests/interop/test_java_acl.py writes its
     * plain_acl.yml): signed with AclClientRPCHook, a producer sends and a consumer receives;
     * a wrong secret key is refused with NO_PERMISSION and nothing is stored.
     */
    static void acl(Env env, Map<String, Object> observed) throws Exception {
        String topic = "JavaSigned";
        env.rpcHook = new AclClientRPCHook(new SessionCredentials("operator", "operator-secret"));
        env.createTopic(topic, 2);
        env.rpcHook = new AclClientRPCHook(new SessionCredentials("java-producer",
                "java-producer-secret"));
        DefaultMQProducer producer = env.producer("pg_java_signed");
        for (int i = 0; i < 5; i++) {
            Check.equal(SendStatus.SEND_OK, producer.send(ProduceScenarios.message(
                    topic, "signed-" + i, "TagS", "sk" + i)).getSendStatus(), "signed send " + i);
        }
        env.rpcHook = new AclClientRPCHook(new SessionCredentials("java-consumer",
                "java-consumer-secret"));
        Set<String> received = ConcurrentHashMap.newKeySet();
        DefaultMQPushConsumer consumer = env.pushConsumer("cg_java_signed");
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.subscribe(topic, "*");
        consumer.registerMessageListener(ConsumeScenarios.recorder(received));
        consumer.start();
        Check.eventually(() -> received.equals(ConsumeScenarios.numbered("signed-", 5)),
                env.timeoutMs, "the 5 signed messages consumed with the consumer's keys");
        env.rpcHook = new AclClientRPCHook(new SessionCredentials("java-producer",
                "not-the-secret"));
        DefaultMQProducer wrong = env.producer("pg_java_wrong");
        try {
            wrong.send(ProduceScenarios.message(topic, "forged", "TagS", "forged"));
            throw new AssertionError("a send signed with a wrong secret was accepted");
        } catch (MQBrokerException refused) {
            Check.equal(16, refused.getResponseCode(), "response code of the forged send");
            observed.put("refusal", refused.getErrorMessage());
        } catch (MQClientException refused) {
            // the route lookup itself may be refused first: the name server checks too
            observed.put("refusal", refused.getErrorMessage());
        }
        env.rpcHook = new AclClientRPCHook(new SessionCredentials("operator", "operator-secret"));
        Check.equal(5L, ProduceScenarios.storedCount(env, topic), "messages stored");
    }
}
