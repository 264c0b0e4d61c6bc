// The physical-limit anchor of bench/rocketmq.py: the broker's own Java client (the
// rocketmq-client jar of the broker being measured) sending as fast as it can, synchronously,
// from a few threads. RocketMQ's example benchmark producer is not published to Maven Central,
// so this is its loop without the statistics thread.
//
//   java -cp 'LIB/*:CLASSES' SendLoop NAMESRV TOPIC MESSAGES THREADS BODY_BYTES
//
// Prints one line: `sent N in S s: R msg/s`.

import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.message.Message;

public final class SendLoop {
    public static void main(String[] args) throws Exception {
        String namesrv = args[0];
        String topic = args[1];
        int messages = Integer.parseInt(args[2]);
        int threads = Integer.parseInt(args[3]);
        byte[] body = new byte[Integer.parseInt(args[4])];
        Arrays.fill(body, (byte) 'x');
        DefaultMQProducer producer = new DefaultMQProducer("bench-java-" + System.nanoTime());
        producer.setNamesrvAddr(namesrv);
        producer.setInstanceName("bench-java-" + System.nanoTime());
        producer.start();
        try {
            // warm up: routes, connections and the JIT
            for (int i = 0; i < 2000; i++) {
                producer.send(new Message(topic, "warm", ("w" + i).getBytes(StandardCharsets.UTF_8)));
            }
            AtomicInteger next = new AtomicInteger();
            AtomicInteger failed = new AtomicInteger();
            Thread[] pool = new Thread[threads];
            long started = System.nanoTime();
            for (int t = 0; t < threads; t++) {
                pool[t] = new Thread(() -> {
                    int i;
                    while ((i = next.getAndIncrement()) < messages) {
                        Message msg = new Message(topic, "bench", "id-" + i, body);
                        try {
                            SendResult result = producer.send(msg);
                            if (result.getSendStatus() != SendStatus.SEND_OK) {
                                failed.incrementAndGet();
                            }
                        } catch (Exception e) {
                            failed.incrementAndGet();
                        }
                    }
                });
                pool[t].start();
            }
            for (Thread t : pool) {
                t.join();
            }
            double seconds = (System.nanoTime() - started) / 1e9;
            System.out.printf("sent %d in %.3f s: %.0f msg/s (%d failed)%n", messages, seconds,
                              messages / seconds, failed.get());
        } finally {
            producer.shutdown();
        }
    }
}
