import java.io.BufferedReader;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.io.OutputStreamWriter;
import java.io.PrintStream;
import java.io.Writer;
import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.Callback;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.common.errors.ApiException;
import org.apache.kafka.common.errors.RetriableException;
import org.apache.kafka.common.errors.UnknownServerException;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.protocol.Errors;
import org.apache.kafka.common.utils.AppInfoParser;

/**
 * Lab client driver around the Java kafka-clients library (tests/lab drivers spec).
 *
 * One source for every pinned version (0.10.2 .. 4.x): calls whose signatures changed
 * between versions (poll, close) go through reflection. Events are JSON lines written by
 * hand; the library's own log goes through slf4j-simple to the --log file.
 *
 * System property kwire.errorNames: a "code TAB name" file (the project's error table),
 * so error_name uses the current protocol names whatever this client version calls them.
 */
public final class KwireDriver {

    // ------------------------------------------------------------------ arguments

    static final class Args {
        String bootstrap;
        String clientId;
        String topic;
        int produce = 0;
        double rate = 0;
        int size = 100;
        String acks = "all";
        Integer partition = null;
        boolean consume = false;
        String group = null;
        int expect = 0;
        double idleS = 5;
        double durationS = 60;
        final LinkedHashMap<String, String> props = new LinkedHashMap<>();
        String out;
        String log;

        Map<String, Object> asMap() {
            Map<String, Object> m = new LinkedHashMap<>();
            m.put("bootstrap", bootstrap);
            m.put("client_id", clientId);
            m.put("topic", topic);
            m.put("produce", produce);
            m.put("rate", rate);
            m.put("size", size);
            m.put("acks", acks);
            m.put("partition", partition);
            m.put("consume", consume);
            m.put("group", group);
            m.put("expect", expect);
            m.put("idle_s", idleS);
            m.put("duration_s", durationS);
            m.put("props", new LinkedHashMap<String, Object>(props));
            m.put("out", out);
            m.put("log", log);
            return m;
        }
    }

    static final class UsageError extends Exception {
        UsageError(String message) {
            super(message);
        }
    }

    static Args parseArgs(String[] argv) throws UsageError {
        Args a = new Args();
        for (int i = 0; i < argv.length; i++) {
            String flag = argv[i];
            if (flag.equals("--consume")) {
                a.consume = true;
                continue;
            }
            if (i + 1 >= argv.length) {
                throw new UsageError("missing value after " + flag);
            }
            String v = argv[++i];
            try {
                switch (flag) {
                    case "--bootstrap": a.bootstrap = v; break;
                    case "--client-id": a.clientId = v; break;
                    case "--topic": a.topic = v; break;
                    case "--produce": a.produce = Integer.parseInt(v); break;
                    case "--rate": a.rate = Double.parseDouble(v); break;
                    case "--size": a.size = Integer.parseInt(v); break;
                    case "--acks": a.acks = v; break;
                    case "--partition": a.partition = Integer.parseInt(v); break;
                    case "--group": a.group = v; break;
                    case "--expect": a.expect = Integer.parseInt(v); break;
                    case "--idle-s": a.idleS = Double.parseDouble(v); break;
                    case "--duration-s": a.durationS = Double.parseDouble(v); break;
                    case "--out": a.out = v; break;
                    case "--log": a.log = v; break;
                    case "--prop": {
                        int eq = v.indexOf('=');
                        if (eq <= 0) {
                            throw new UsageError("--prop wants KEY=VALUE, got " + v);
                        }
                        a.props.put(v.substring(0, eq), v.substring(eq + 1));
                        break;
                    }
                    default: throw new UsageError("unknown argument " + flag);
                }
            } catch (NumberFormatException e) {
                throw new UsageError("bad number for " + flag + ": " + v);
            }
        }
        if (a.bootstrap == null || a.clientId == null || a.topic == null || a.out == null) {
            throw new UsageError("--bootstrap, --client-id, --topic and --out are required");
        }
        if (!Arrays.asList("0", "1", "all", "-1").contains(a.acks)) {
            throw new UsageError("--acks must be 0, 1 or all");
        }
        if (a.produce < 0 || a.size < 0 || a.rate < 0 || a.durationS <= 0) {
            throw new UsageError("--produce, --size, --rate must be >= 0 and --duration-s > 0");
        }
        return a;
    }

    // ------------------------------------------------------------------ JSON lines

    static void json(StringBuilder sb, Object v) {
        if (v == null) {
            sb.append("null");
        } else if (v instanceof String) {
            sb.append('"');
            String s = (String) v;
            for (int i = 0; i < s.length(); i++) {
                char c = s.charAt(i);
                switch (c) {
                    case '"': sb.append("\\\""); break;
                    case '\\': sb.append("\\\\"); break;
                    case '\n': sb.append("\\n"); break;
                    case '\r': sb.append("\\r"); break;
                    case '\t': sb.append("\\t"); break;
                    default:
                        if (c < 0x20) {
                            sb.append(String.format("\\u%04x", (int) c));
                        } else {
                            sb.append(c);
                        }
                }
            }
            sb.append('"');
        } else if (v instanceof Double || v instanceof Float) {
            double d = ((Number) v).doubleValue();
            if (Double.isNaN(d) || Double.isInfinite(d)) {
                sb.append("null");
            } else {
                sb.append(d);
            }
        } else if (v instanceof Number || v instanceof Boolean) {
            sb.append(v);
        } else if (v instanceof Map) {
            sb.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
                if (!first) {
                    sb.append(',');
                }
                first = false;
                json(sb, String.valueOf(e.getKey()));
                sb.append(':');
                json(sb, e.getValue());
            }
            sb.append('}');
        } else if (v instanceof Collection) {
            sb.append('[');
            boolean first = true;
            for (Object o : (Collection<?>) v) {
                if (!first) {
                    sb.append(',');
                }
                first = false;
                json(sb, o);
            }
            sb.append(']');
        } else {
            json(sb, String.valueOf(v)); // classes, passwords, lists of config values
        }
    }

    /** The events file: one JSON object per line, flushed per line; nothing after "end". */
    static final class Events {
        private final Writer w;
        private boolean ended = false;

        Events(String path) throws IOException {
            w = new OutputStreamWriter(new FileOutputStream(path), StandardCharsets.UTF_8);
        }

        synchronized void emit(String event, Object... kv) {
            if (ended) {
                return;
            }
            StringBuilder sb = new StringBuilder(160);
            sb.append("{\"ts\":").append(String.format(java.util.Locale.ROOT, "%.6f", System.currentTimeMillis() / 1000.0));
            sb.append(",\"event\":");
            json(sb, event);
            for (int i = 0; i + 1 < kv.length; i += 2) {
                sb.append(',');
                json(sb, kv[i]);
                sb.append(':');
                json(sb, kv[i + 1]);
            }
            sb.append("}\n");
            try {
                w.write(sb.toString());
                w.flush();
            } catch (IOException e) {
                System.err.println("kwire-driver: cannot write events: " + e);
            }
            if (event.equals("end")) {
                ended = true;
            }
        }
    }

    // ------------------------------------------------------------------ error codes

    static final Map<Integer, String> ERROR_NAMES = new HashMap<>();

    static void loadErrorNames() {
        String path = System.getProperty("kwire.errorNames");
        if (path == null) {
            return;
        }
        try (BufferedReader r = Files.newBufferedReader(Paths.get(path), StandardCharsets.UTF_8)) {
            String line;
            while ((line = r.readLine()) != null) {
                String[] f = line.split("\t");
                if (f.length >= 2) {
                    try {
                        ERROR_NAMES.put(Integer.parseInt(f[0].trim()), f[1].trim());
                    } catch (NumberFormatException ignored) {
                        // header line
                    }
                }
            }
        } catch (IOException e) {
            System.err.println("kwire-driver: cannot read error names " + path + ": " + e);
        }
    }

    /** The Kafka error behind an exception (the library's own Errors.forException), or null. */
    static Errors kafkaError(Throwable t) {
        for (Throwable c = t; c != null; c = c.getCause()) {
            if (c instanceof ApiException) {
                Errors e = Errors.forException(c);
                // forException answers UNKNOWN(_SERVER_ERROR) for every class it does not know
                if (e.code() == -1 && !(c instanceof UnknownServerException)) {
                    return null;
                }
                return e;
            }
        }
        return null;
    }

    // ------------------------------------------------------------------ API differences

    /** poll(Duration) from 2.0 on (poll(long) is gone in 4.0), poll(long) before. */
    static ConsumerRecords<byte[], byte[]> poll(KafkaConsumer<byte[], byte[]> c, long ms) throws Exception {
        try {
            Class<?> duration = Class.forName("java.time.Duration");
            Method ofMillis = duration.getMethod("ofMillis", long.class);
            Method m = KafkaConsumer.class.getMethod("poll", duration);
            return cast(invoke(m, c, ofMillis.invoke(null, ms)));
        } catch (NoSuchMethodException e) {
            Method m = KafkaConsumer.class.getMethod("poll", long.class);
            return cast(invoke(m, c, ms));
        }
    }

    @SuppressWarnings("unchecked")
    static ConsumerRecords<byte[], byte[]> cast(Object o) {
        return (ConsumerRecords<byte[], byte[]>) o;
    }

    /** Method.invoke that rethrows the target's own exception (e.g. WakeupException). */
    static Object invoke(Method m, Object target, Object... args) throws Exception {
        try {
            return m.invoke(target, args);
        } catch (java.lang.reflect.InvocationTargetException e) {
            Throwable cause = e.getCause();
            if (cause instanceof Exception) {
                throw (Exception) cause;
            }
            throw e;
        }
    }

    /** close(Duration), else close(long, TimeUnit), else close(): bounded where the version allows. */
    static void closeBounded(Object client, long ms) {
        try {
            Class<?> duration = Class.forName("java.time.Duration");
            Object d = duration.getMethod("ofMillis", long.class).invoke(null, ms);
            invoke(client.getClass().getMethod("close", duration), client, d);
            return;
        } catch (NoSuchMethodException | ClassNotFoundException e) {
            // older client: fall through
        } catch (Exception e) {
            System.err.println("kwire-driver: close failed: " + e);
            return;
        }
        try {
            invoke(client.getClass().getMethod("close", long.class, TimeUnit.class), client, ms, TimeUnit.MILLISECONDS);
            return;
        } catch (NoSuchMethodException e) {
            // 0.10 consumer: only close()
        } catch (Exception e) {
            System.err.println("kwire-driver: close failed: " + e);
            return;
        }
        try {
            client.getClass().getMethod("close").invoke(client);
        } catch (Exception e) {
            System.err.println("kwire-driver: close failed: " + e);
        }
    }

    /** The library's parsed config (defaults filled in) without constructing a client. */
    static Map<String, Object> parsedConfig(Class<?> configClass, Properties props) {
        try {
            Field f = configClass.getDeclaredField("CONFIG");
            f.setAccessible(true);
            ConfigDef def = (ConfigDef) f.get(null);
            return new HashMap<String, Object>(def.parse(props));
        } catch (Exception e) {
            Map<String, Object> m = new HashMap<>();
            for (String k : props.stringPropertyNames()) {
                m.put(k, props.getProperty(k));
            }
            return m;
        }
    }

    // ------------------------------------------------------------------ the run

    static final String[] PRODUCER_KEYS = {
        "acks", "retries", "linger.ms", "request.timeout.ms", "delivery.timeout.ms", "enable.idempotence",
        "max.in.flight.requests.per.connection", "retry.backoff.ms", "max.block.ms", "batch.size",
        "compression.type", "metadata.max.age.ms",
    };
    static final String[] CONSUMER_KEYS = {
        "group.id", "auto.offset.reset", "enable.auto.commit", "session.timeout.ms", "heartbeat.interval.ms",
        "max.poll.interval.ms", "request.timeout.ms", "fetch.max.wait.ms", "group.protocol", "metadata.max.age.ms",
    };

    final Args a;
    final Events events;
    final long startMs = System.currentTimeMillis();
    final long softDeadline; // stop working, write "end"
    final long hardDeadline; // exit whatever is still running
    final AtomicInteger sent = new AtomicInteger();
    final AtomicInteger acked = new AtomicInteger();
    final AtomicInteger failed = new AtomicInteger();
    final AtomicInteger consumed = new AtomicInteger();
    final List<String> ignored = new ArrayList<>();
    volatile boolean stopping = false;
    KafkaProducer<byte[], byte[]> producer;
    KafkaConsumer<byte[], byte[]> consumer;

    KwireDriver(Args a, Events events) {
        this.a = a;
        this.events = events;
        long total = (long) (a.durationS * 1000);
        long grace = Math.min(3000, total / 5); // time to write "end" and close the clients
        softDeadline = startMs + total - grace;
        hardDeadline = startMs + total - Math.min(500, grace / 4);
    }

    void endEvent() {
        int s = sent.get();
        events.emit("end", "sent", s, "acked", acked.get(), "failed", failed.get(), "consumed", consumed.get(),
            "unresolved", Math.max(0, s - acked.get() - failed.get()));
    }

    Properties producerProps() {
        Properties p = new Properties();
        p.put("bootstrap.servers", a.bootstrap);
        p.put("client.id", a.clientId);
        p.put("acks", a.acks.equals("-1") ? "all" : a.acks);
        p.put("key.serializer", "org.apache.kafka.common.serialization.ByteArraySerializer");
        p.put("value.serializer", "org.apache.kafka.common.serialization.ByteArraySerializer");
        // send() blocks this long for metadata; never past the run's end
        p.put("max.block.ms", String.valueOf(Math.max(1000, Math.min(60000, softDeadline - startMs))));
        return p;
    }

    Properties consumerProps() {
        Properties p = new Properties();
        p.put("bootstrap.servers", a.bootstrap);
        p.put("client.id", a.clientId);
        p.put("key.deserializer", "org.apache.kafka.common.serialization.ByteArrayDeserializer");
        p.put("value.deserializer", "org.apache.kafka.common.serialization.ByteArrayDeserializer");
        p.put("auto.offset.reset", "earliest");
        p.put("enable.auto.commit", "false");
        if (a.group != null) {
            p.put("group.id", a.group);
        }
        return p;
    }

    /** Split --prop into the producer's and the consumer's knobs; the rest is ignored and logged. */
    void applyProps(Properties producerProps, Properties consumerProps) {
        Set<String> producerNames = new HashSet<>(ProducerConfig.configNames());
        Set<String> consumerNames = new HashSet<>(ConsumerConfig.configNames());
        for (Map.Entry<String, String> e : a.props.entrySet()) {
            boolean used = false;
            if (a.produce > 0 && producerNames.contains(e.getKey())) {
                producerProps.put(e.getKey(), e.getValue());
                used = true;
            }
            if (a.consume && consumerNames.contains(e.getKey())) {
                consumerProps.put(e.getKey(), e.getValue());
                used = true;
            }
            if (!used) {
                ignored.add(e.getKey());
                org.slf4j.LoggerFactory.getLogger(KwireDriver.class)
                    .warn("--prop {} ignored: not a knob of this client's {}", e.getKey(),
                        a.produce > 0 && a.consume ? "producer or consumer" : a.produce > 0 ? "producer" : "consumer");
            }
        }
    }

    Map<String, Object> effectiveConfig(Properties producerProps, Properties consumerProps) {
        Map<String, Object> config = new LinkedHashMap<>();
        if (a.produce > 0) {
            Map<String, Object> parsed = parsedConfig(ProducerConfig.class, producerProps);
            for (String k : PRODUCER_KEYS) {
                if (parsed.containsKey(k)) {
                    config.put(k, parsed.get(k));
                }
            }
        }
        if (a.consume) {
            Map<String, Object> parsed = parsedConfig(ConsumerConfig.class, consumerProps);
            for (String k : CONSUMER_KEYS) {
                if (parsed.containsKey(k)) {
                    config.put("consumer." + k, parsed.get(k));
                }
            }
        }
        return config;
    }

    void run() throws Exception {
        Properties pp = producerProps();
        Properties cp = consumerProps();
        applyProps(pp, cp);
        Map<String, Object> config = effectiveConfig(pp, cp);
        if (a.produce > 0) {
            producer = new KafkaProducer<>(pp);
        }
        if (a.consume) {
            consumer = new KafkaConsumer<>(cp);
        }
        events.emit("start", "library", "kafka-clients", "library_version", AppInfoParser.getVersion(),
            "client_id", a.clientId, "args", a.asMap(), "config", config, "ignored_props", ignored);

        Thread watchdog = new Thread(this::watchdog, "kwire-watchdog");
        watchdog.setDaemon(true);
        watchdog.start();

        Thread producing = null;
        if (producer != null) {
            producing = new Thread(this::produceAll, "kwire-producer");
            producing.start();
        }
        if (consumer != null) {
            try {
                consumeAll();
            } catch (WakeupException e) {
                // the run's time is up
            }
        }
        if (producing != null) {
            producing.join(Math.max(1, softDeadline - System.currentTimeMillis()));
        }
        stopping = true;
        endEvent();
        long left = Math.max(0, hardDeadline - System.currentTimeMillis());
        if (producer != null) {
            closeBounded(producer, Math.min(left / 2, 2000));
        }
        if (consumer != null) {
            closeBounded(consumer, Math.min(Math.max(0, hardDeadline - System.currentTimeMillis()), 2000));
        }
    }

    /** At the soft deadline stop the consumer's poll; at the hard one leave the JVM, end written. */
    void watchdog() {
        try {
            Thread.sleep(Math.max(0, softDeadline - System.currentTimeMillis()));
            stopping = true;
            if (consumer != null) {
                consumer.wakeup();
            }
            Thread.sleep(Math.max(0, hardDeadline - System.currentTimeMillis()));
            endEvent();
            System.err.println("kwire-driver: --duration-s reached, exiting");
            System.err.flush();
            Runtime.getRuntime().halt(0);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    byte[] value(int seq) {
        String head = a.clientId + ":" + seq + ":";
        StringBuilder sb = new StringBuilder(Math.max(a.size, head.length()));
        sb.append(head);
        while (sb.length() < a.size) {
            sb.append('x');
        }
        return sb.toString().getBytes(StandardCharsets.UTF_8);
    }

    void produceAll() {
        long t0 = System.currentTimeMillis();
        for (int seq = 0; seq < a.produce && !stopping; seq++) {
            if (a.rate > 0) {
                long due = t0 + (long) (seq * 1000.0 / a.rate);
                long wait = due - System.currentTimeMillis();
                if (wait > 0) {
                    try {
                        Thread.sleep(Math.min(wait, Math.max(0, softDeadline - System.currentTimeMillis())));
                    } catch (InterruptedException e) {
                        return;
                    }
                    if (System.currentTimeMillis() >= softDeadline) {
                        break;
                    }
                }
            }
            final int s = seq;
            final String id = a.clientId + ":" + seq;
            ProducerRecord<byte[], byte[]> record = new ProducerRecord<>(a.topic, a.partition,
                String.valueOf(seq).getBytes(StandardCharsets.UTF_8), value(seq));
            events.emit("send", "id", id, "seq", s, "topic", a.topic, "partition", a.partition);
            sent.incrementAndGet();
            Callback cb = (RecordMetadata md, Exception exc) -> {
                if (exc == null) {
                    acked.incrementAndGet();
                    events.emit("ack", "id", id, "seq", s, "topic", md.topic(), "partition", md.partition(),
                        "offset", md.offset());
                } else {
                    failed.incrementAndGet();
                    error(id, s, md == null || md.partition() < 0 ? a.partition : (Integer) md.partition(), exc);
                }
            };
            try {
                producer.send(record, cb);
            } catch (Exception exc) {
                // send() itself failed (e.g. metadata not available within max.block.ms)
                failed.incrementAndGet();
                error(id, s, a.partition, exc);
            }
        }
        // wait for the outcomes (bounded by the run's end)
        while (acked.get() + failed.get() < sent.get() && System.currentTimeMillis() < softDeadline) {
            try {
                Thread.sleep(20);
            } catch (InterruptedException e) {
                return;
            }
        }
    }

    void error(String id, int seq, Integer partition, Throwable exc) {
        Errors err = kafkaError(exc);
        Integer code = err == null ? null : (int) err.code();
        String name = null;
        if (err != null) {
            name = ERROR_NAMES.containsKey(code) ? ERROR_NAMES.get(code) : err.name();
        }
        events.emit("error", "id", id, "seq", seq, "topic", a.topic, "partition", partition,
            "error", exc.toString(), "error_code", code, "error_name", name);
    }

    void consumeAll() throws Exception {
        final long[] assignedAt = {0};
        if (a.group != null) {
            consumer.subscribe(Arrays.asList(a.topic), new ConsumerRebalanceListener() {
                @Override
                public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
                }

                @Override
                public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
                    if (assignedAt[0] == 0) {
                        assignedAt[0] = System.currentTimeMillis();
                    }
                }
            });
        } else {
            List<TopicPartition> tps = new ArrayList<>();
            while (tps.isEmpty() && !stopping) {
                List<PartitionInfo> infos = null;
                try {
                    infos = consumer.partitionsFor(a.topic);
                } catch (RetriableException e) {
                    // metadata not there yet: ask again
                }
                if (infos != null) {
                    for (PartitionInfo pi : infos) {
                        tps.add(new TopicPartition(pi.topic(), pi.partition()));
                    }
                }
                if (tps.isEmpty()) {
                    Thread.sleep(200);
                }
            }
            consumer.assign(tps);
            consumer.seekToBeginning(tps);
            assignedAt[0] = System.currentTimeMillis();
        }
        Set<String> seen = new HashSet<>();
        long lastNew = 0;
        while (!stopping) {
            long now = System.currentTimeMillis();
            if (a.expect > 0 && seen.size() >= a.expect) {
                break;
            }
            // the idle clock starts once partitions are assigned (a group join can take a while)
            long idleFrom = Math.max(lastNew, assignedAt[0]);
            if (idleFrom > 0 && now - idleFrom >= (long) (a.idleS * 1000)) {
                break;
            }
            ConsumerRecords<byte[], byte[]> records;
            try {
                records = poll(consumer, 200);
            } catch (WakeupException e) {
                throw e;
            } catch (KafkaException e) {
                // the library gave up on something (e.g. a JoinGroup error it does not know):
                // data for the run, not a driver failure; retriable ones are tried again
                org.slf4j.LoggerFactory.getLogger(KwireDriver.class).warn("kwire-driver: consumer poll failed: {}", e.toString());
                System.err.println("kwire-driver: consumer poll failed: " + e);
                if (!(e instanceof RetriableException)) {
                    break;
                }
                Thread.sleep(500);
                continue;
            }
            Map<TopicPartition, OffsetAndMetadata> commit = new LinkedHashMap<>();
            for (ConsumerRecord<byte[], byte[]> r : records) {
                String v = new String(r.value() == null ? new byte[0] : r.value(), StandardCharsets.UTF_8);
                String id = messageId(v);
                consumed.incrementAndGet();
                if (seen.add(id)) {
                    lastNew = System.currentTimeMillis();
                }
                events.emit("consume", "id", id, "topic", r.topic(), "partition", r.partition(), "offset", r.offset(),
                    "group", a.group);
                commit.put(new TopicPartition(r.topic(), r.partition()), new OffsetAndMetadata(r.offset() + 1));
            }
            if (a.group != null && !commit.isEmpty()) {
                commitOffsets(commit);
            }
        }
    }

    void commitOffsets(Map<TopicPartition, OffsetAndMetadata> commit) {
        Map<String, Object> offsets = new LinkedHashMap<>();
        for (Map.Entry<TopicPartition, OffsetAndMetadata> e : commit.entrySet()) {
            offsets.put(String.valueOf(e.getKey().partition()), e.getValue().offset());
        }
        String error = null;
        try {
            consumer.commitSync(commit);
        } catch (WakeupException e) {
            throw e;
        } catch (Exception e) {
            error = e.toString();
        }
        events.emit("commit", "group", a.group, "offsets", offsets, "error", error);
    }

    /** The message id is the value's text before its second ':'. */
    static String messageId(String value) {
        int first = value.indexOf(':');
        int second = first < 0 ? -1 : value.indexOf(':', first + 1);
        return second < 0 ? value : value.substring(0, second);
    }

    /**
     * A log stream that keeps each record on one line. slf4j-simple writes a record with
     * println(String), its exception with Throwable.printStackTrace (println(Object) per line),
     * then flush(): the record's newline is held back until that flush so the stack trace joins
     * the record's line, and newlines inside a message (Kafka's config dumps) become " | ".
     */
    static final class OneLineStream extends PrintStream {
        private boolean open = false; // a record is written but its line not yet ended

        OneLineStream(OutputStream out) throws IOException {
            super(out, false, "UTF-8");
        }

        private static String flat(Object x) {
            return String.valueOf(x).replace("\r", "").replaceAll("\n\t*", " | ");
        }

        @Override
        public synchronized void println(String x) {
            if (open) {
                super.print('\n');
            }
            super.print(flat(x));
            open = true;
        }

        @Override
        public synchronized void println(Object x) {
            super.print((open ? " | " : "") + flat(x).trim());
            open = true;
        }

        @Override
        public synchronized void flush() {
            if (open) {
                super.print('\n');
                open = false;
            }
            super.flush();
        }
    }

    /** Route slf4j-simple to the --log file at INFO, before any Kafka class asks for a logger. */
    static void setUpLogging(String logPath) throws IOException {
        if (logPath != null) {
            // slf4j-simple's "System.out" target is looked up per record, so this stream gets it
            System.setOut(new OneLineStream(new FileOutputStream(logPath)));
            System.setProperty("org.slf4j.simpleLogger.logFile", "System.out");
        }
        System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "info");
        System.setProperty("org.slf4j.simpleLogger.showDateTime", "true");
        System.setProperty("org.slf4j.simpleLogger.dateTimeFormat", "yyyy-MM-dd'T'HH:mm:ss.SSSZ");
        System.setProperty("org.slf4j.simpleLogger.showThreadName", "true");
        System.setProperty("org.slf4j.simpleLogger.showLogName", "true");
    }

    public static void main(String[] argv) {
        Args a;
        try {
            a = parseArgs(argv);
        } catch (UsageError e) {
            System.err.println("kwire-driver: " + e.getMessage());
            System.exit(2);
            return;
        }
        loadErrorNames();
        Events events;
        try {
            setUpLogging(a.log);
            events = new Events(a.out);
        } catch (IOException e) {
            System.err.println("kwire-driver: cannot open --out or --log: " + e);
            System.exit(2);
            return;
        }
        KwireDriver d = new KwireDriver(a, events);
        try {
            d.run();
        } catch (Exception e) {
            System.err.println("kwire-driver: " + e);
            e.printStackTrace();
            d.endEvent();
            Runtime.getRuntime().halt(1);
        }
        // client threads may linger (e.g. a 0.10 consumer close without timeout): leave now
        Runtime.getRuntime().halt(0);
    }
}
