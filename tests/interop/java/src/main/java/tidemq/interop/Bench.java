package tidemq.interop;

import com.alibaba.fastjson.JSON;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * One benchmark figure with the official Java client, against whichever broker the name
 * server routes to (benchmarks/reference_bench.py runs it against Apache's broker and tidemq).
 *
 * <p>Usage: {@code Bench <figure> <namesrv> <topic> <messages> [rate]}; prints one JSON line.
 * Figures: {@code batch} (batches of 64 x 1 KiB, 16 batches in flight), {@code async}
 * (single 1 KiB messages, 64 in flight from 64 sending threads), {@code consume} (lite pull from the first offset of
 * every queue until {@code messages} arrived), {@code e2e} (a push consumer at the end of the
 * topic while a producer offers {@code rate} messages a second, after one second of it not
 * measured; now - send time per message).
 */
public final class Bench {
    private static final int SIZE = 1024;
    private static final int BATCH = 64;
    private static final int BATCHES_IN_FLIGHT = 16;
    private static final int SINGLES_IN_FLIGHT = 64;

    private Bench() {
    }

    public static void main(String[] args) {
        // Exit in every case: the client's threads would keep a JVM whose main threw alive.
        try {
            run(args);
            System.exit(0);
        } catch (Throwable failure) {
            failure.printStackTrace();
            System.exit(1);
        }
    }

    static void run(String[] args) throws Exception {
        String figure = args[0];
        String namesrv = args[1];
        String topic = args[2];
        int messages = Integer.parseInt(args[3]);
        Map<String, Object> result = new LinkedHashMap<>();
        result.put("figure", figure);
        result.put("messages", messages);
        switch (figure) {
            case "batch":
                result.putAll(produce(namesrv, topic, messages, true));
                break;
            case "async":
                result.putAll(produce(namesrv, topic, messages, false));
                break;
            case "consume":
                result.putAll(consume(namesrv, topic, messages));
                break;
            case "e2e":
                result.putAll(endToEnd(namesrv, topic, messages, Integer.parseInt(args[4])));
                break;
            default:
                throw new IllegalArgumentException("figure " + figure
                        + ": one of batch, async, consume, e2e");
        }
        System.out.println(JSON.toJSONString(result));
        System.out.flush();
    }

    static DefaultMQProducer producer(String namesrv) throws Exception {
        DefaultMQProducer producer = new DefaultMQProducer("bench_pg");
        producer.setNamesrvAddr(namesrv);
        producer.setInstanceName("bench-" + System.nanoTime());
        producer.setCompressMsgBodyOverHowmuch(Integer.MAX_VALUE);
        producer.setMaxMessageSize(8 * 1024 * 1024);
        producer.start();
        return producer;
    }

    /**
     * One send outside the measured time, repeated (60 s at most) until it goes through: on
     * a busy machine the first route lookup may time out.
     */
    static void warm(DefaultMQProducer producer, String topic, byte[] body) throws Exception {
        long deadline = System.currentTimeMillis() + 60_000;
        while (true) {
            try {
                producer.send(new Message(topic, "warm", body));
                return;
            } catch (Exception notYet) {
                if (System.currentTimeMillis() > deadline) {
                    throw notYet;
                }
                Thread.sleep(200);
            }
        }
    }

    static Map<String, Object> produce(String namesrv, String topic, int messages,
            boolean batches) throws Exception {
        DefaultMQProducer producer = producer(namesrv);
        byte[] body = new byte[SIZE];
        Arrays.fill(body, (byte) 'x');
        warm(producer, topic, body);
        int perRequest = batches ? BATCH : 1;
        int requests = messages / perRequest;
        int senders = batches ? BATCHES_IN_FLIGHT : SINGLES_IN_FLIGHT;
        List<MessageQueue> queues = producer.fetchPublishMessageQueues(topic);
        // Each sender thread sends synchronously: `senders` requests are in flight at any
        // time. (The client's callback-based async send stalled under load on this machine
        // with 4.9.8: no callback, no put, for minutes; threads keep the figure robust.)
        AtomicLong next = new AtomicLong();
        AtomicLong failures = new AtomicLong();
        List<Thread> threads = new ArrayList<>();
        long start = System.nanoTime();
        for (int t = 0; t < senders; t++) {
            Thread thread = new Thread(() -> {
                long i;
                while ((i = next.getAndIncrement()) < requests) {
                    try {
                        if (batches) {
                            List<Message> batch = new ArrayList<>(BATCH);
                            for (int j = 0; j < BATCH; j++) {
                                batch.add(new Message(topic, "bench", body));
                            }
                            producer.send(batch, queues.get((int) (i % queues.size())));
                        } else {
                            producer.send(new Message(topic, "bench", body));
                        }
                    } catch (Exception failure) {
                        failures.incrementAndGet();
                    }
                }
            });
            thread.start();
            threads.add(thread);
        }
        for (Thread thread : threads) {
            thread.join();
        }
        double seconds = (System.nanoTime() - start) / 1e9;
        producer.shutdown();
        Map<String, Object> result = new LinkedHashMap<>();
        result.put("msgPerS", (requests - failures.get()) * perRequest / seconds);
        result.put("seconds", seconds);
        result.put("failures", failures.get());
        return result;
    }

    static Map<String, Object> consume(String namesrv, String topic, int messages)
            throws Exception {
        DefaultLitePullConsumer consumer = new DefaultLitePullConsumer("bench_cg_"
                + System.nanoTime());
        consumer.setNamesrvAddr(namesrv);
        consumer.setAutoCommit(false);
        consumer.setPullBatchSize(32);
        consumer.start();
        List<MessageQueue> queues = new ArrayList<>(consumer.fetchMessageQueues(topic));
        consumer.assign(queues);
        for (MessageQueue queue : queues) {
            consumer.seek(queue, 0);
        }
        long received = 0;
        long start = System.nanoTime();
        long deadline = System.currentTimeMillis() + 600_000;
        while (received < messages && System.currentTimeMillis() < deadline) {
            received += consumer.poll(1000).size();
        }
        double seconds = (System.nanoTime() - start) / 1e9;
        consumer.shutdown();
        Map<String, Object> result = new LinkedHashMap<>();
        result.put("msgPerS", received / seconds);
        result.put("received", received);
        result.put("seconds", seconds);
        return result;
    }

    static Map<String, Object> endToEnd(String namesrv, String topic, int messages, int rate)
            throws Exception {
        long[] latenciesNs = new long[messages];
        AtomicLong count = new AtomicLong();
        CountDownLatch all = new CountDownLatch(messages);
        DefaultMQPushConsumer consumer = new DefaultMQPushConsumer("bench_e2e_" + System.nanoTime());
        consumer.setNamesrvAddr(namesrv);
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET);
        consumer.subscribe(topic, "*");
        consumer.registerMessageListener((MessageListenerConcurrently) (batch, context) -> {
            long now = System.nanoTime();
            for (MessageExt message : batch) {
                long sentNs = Long.parseLong(message.getUserProperty("sentNs"));
                long index = count.getAndIncrement();
                if (index < messages) {
                    latenciesNs[(int) index] = now - sentNs;
                    all.countDown();
                }
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        consumer.start();
        DefaultMQProducer producer = producer(namesrv);
        byte[] body = new byte[SIZE];
        warm(producer, topic, body);
        // The consumer starts at the end of the topic: give its rebalance time to take the
        // queues before the measured messages (the warm-up message shows it consuming).
        long settle = System.currentTimeMillis() + 30_000;
        while (consumer.getDefaultMQPushConsumerImpl().getRebalanceImpl()
                .getProcessQueueTable().isEmpty() && System.currentTimeMillis() < settle) {
            Thread.sleep(50);
        }
        Thread.sleep(1000);
        long intervalNs = 1_000_000_000L / rate;
        // One second at the rate first, not measured: the JIT compiles both sides' paths.
        offer(producer, topic, body, rate, intervalNs);
        long quiet = System.currentTimeMillis() + 30_000;
        while (count.get() < rate && System.currentTimeMillis() < quiet) {
            Thread.sleep(10);
        }
        count.set(0);
        offer(producer, topic, body, messages, intervalNs);
        all.await(120, TimeUnit.SECONDS);
        producer.shutdown();
        consumer.shutdown();
        int got = (int) Math.min(count.get(), messages);
        long[] sorted = Arrays.copyOf(latenciesNs, got);
        Arrays.sort(sorted);
        Map<String, Object> result = new LinkedHashMap<>();
        result.put("received", got);
        result.put("p50Ms", percentile(sorted, 0.50));
        result.put("p99Ms", percentile(sorted, 0.99));
        result.put("p999Ms", percentile(sorted, 0.999));
        return result;
    }

    /** Sends {@code messages} oneway, one every {@code intervalNs}, each stamped. */
    static void offer(DefaultMQProducer producer, String topic, byte[] body, int messages,
            long intervalNs) throws Exception {
        long next = System.nanoTime();
        for (int i = 0; i < messages; i++) {
            while (System.nanoTime() < next) {
                Thread.onSpinWait();
            }
            Message message = new Message(topic, "e2e", body);
            message.putUserProperty("sentNs", Long.toString(System.nanoTime()));
            producer.sendOneway(message);
            next += intervalNs;
        }
    }

    static double percentile(long[] sorted, double q) {
        if (sorted.length == 0) {
            return -1;
        }
        int index = (int) Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1);
        return sorted[Math.max(0, index)] / 1e6;
    }
}
