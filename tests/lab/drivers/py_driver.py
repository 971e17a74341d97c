"""Lab driver for the Python Kafka clients: confluent-kafka, kafka-python, aiokafka.

    python py_driver.py --library confluent-kafka|kafka-python|aiokafka --bootstrap H:P \\
        --client-id ID --topic T [--produce N] [--consume [--group G]] --out EVENTS [--log LOG] ...

The arguments and the JSON-lines events are the lab's driver interface
(``drivers_spec.md``): the same for every driver, so a scenario can run several
and build the truth of the run from their events. The library's own log goes
through Python logging to ``--log``.

``--prop KEY=VALUE`` takes Kafka's (Java-style) config names. confluent-kafka gets
them as they are (librdkafka's names are Kafka's; ``debug`` too); kafka-python and
aiokafka get ``linger.ms`` as ``linger_ms``, and so on, when they have that knob. librdkafka logs
retries, metadata refreshes and disconnects only in its debug contexts: the driver
sets ``debug=broker,topic,metadata`` (about 85 lines for a 1000-message run; adding
``msg`` costs about one line per message); ``--prop debug=`` turns them off.
``log.level`` (DEBUG, INFO, ...) is the driver's own: the Python log level.
Unknown keys are ignored and named in the start event and in the log.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import inspect
import json
import logging
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

LIBRARIES = ("confluent-kafka", "kafka-python", "aiokafka")
#: librdkafka error codes below this are local (client-side) errors, not Kafka protocol codes.
RDKAFKA_LOCAL_ERRORS = -100
#: librdkafka debug contexts on by default: they show retries, metadata refreshes and
#: disconnects, which librdkafka does not log at all without ``debug``.
CONFLUENT_DEBUG = "broker,topic,metadata"

log = logging.getLogger("labdriver")


def _error_names() -> dict[int, str]:
    """Kafka error code -> name, from the decoder's protocol table (empty if not found)."""
    path = Path(__file__).resolve().parents[3] / "decoder" / "kafka_protocol.json"
    try:
        return {int(code): row[0] for code, row in json.loads(path.read_text())["errors"].items()}
    except (OSError, ValueError, KeyError):
        return {}


ERROR_NAMES = _error_names()


# --------------------------------------------------------------------------- arguments


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The lab driver command line, plus ``--library``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--library", required=True, choices=LIBRARIES)
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--client-id", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--produce", type=int, default=0)
    p.add_argument("--rate", type=float, default=0.0)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--acks", choices=("0", "1", "all", "-1"), default="all")
    p.add_argument("--partition", type=int, default=None)
    p.add_argument("--consume", action="store_true")
    p.add_argument("--group", default=None)
    p.add_argument("--expect", type=int, default=0)
    p.add_argument("--idle-s", type=float, default=5.0)
    p.add_argument("--duration-s", type=float, default=60.0)
    p.add_argument("--prop", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", required=True)
    p.add_argument("--log", default=None)
    args = p.parse_args(argv)
    if args.acks == "-1":
        args.acks = "all"
    if min(args.produce, args.size, args.expect) < 0 or args.rate < 0 or args.duration_s <= 0:
        p.error("--produce, --size, --rate, --expect must not be negative; --duration-s must be positive")
    if not args.produce and not args.consume:
        p.error("nothing to do: give --produce N and/or --consume")
    props: dict[str, str] = {}
    for item in args.prop:
        key, sep, value = item.partition("=")
        if not sep or not key:
            p.error(f"--prop wants KEY=VALUE, got {item!r}")
        props[key] = value
    args.props = props
    return args


def _typed(value: str) -> Any:
    """A --prop value as the Python clients want it: int, float, bool or str."""
    for cast in (int, float):
        with contextlib.suppress(ValueError):
            return cast(value)
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    return value


# --------------------------------------------------------------------------- events and run state


class Events:
    """The JSON-lines events file; one write and flush per line."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "w", encoding="utf-8")  # noqa: SIM115 (closed by close())
        self._lock = threading.Lock()

    def emit(self, event: str, **fields: Any) -> None:
        """Write {"ts":..,"event":event, **fields}."""
        line = json.dumps({"ts": round(time.time(), 6), "event": event, **fields}, separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


class Run:
    """One driver run: arguments, events, counts and the consumer's stop conditions."""

    def __init__(self, args: argparse.Namespace, events: Events) -> None:
        self.args = args
        self.events = events
        self.start = time.monotonic()
        # The run's deadline leaves a little grace so the end event is written by --duration-s.
        grace = min(2.0, args.duration_s / 10)
        self.deadline = self.start + args.duration_s - grace
        self.hard_deadline = self.start + args.duration_s - grace / 4
        self.stop = threading.Event()  # set at the deadline
        self.stop_consuming = threading.Event()  # --expect reached, idle, or deadline
        self.producing = args.produce > 0
        self.ignored: list[str] = []
        self._lock = threading.Lock()
        self._sent: set[int] = set()
        self._acked: set[int] = set()
        self._failed: set[int] = set()
        self._consumed: set[str] = set()
        self._last_new = time.monotonic()
        self._pace_start: float | None = None

    # identity
    def message_id(self, seq: int) -> str:
        return f"{self.args.client_id}:{seq}"

    def key(self, seq: int) -> bytes:
        return str(seq).encode()

    def value(self, seq: int) -> bytes:
        return f"{self.message_id(seq)}:".encode().ljust(self.args.size, b"x")

    @staticmethod
    def id_from_value(value: bytes | None) -> str:
        """The text before the second ':'."""
        text = (value or b"").decode("utf-8", "replace")
        parts = text.split(":", 2)
        return ":".join(parts[:2]) if len(parts) >= 2 else text

    def remaining(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def due_in(self, seq: int) -> float:
        """Seconds until message *seq* is due under --rate (0 when unpaced or late)."""
        if self.args.rate <= 0:
            return 0.0
        if self._pace_start is None:  # the schedule starts at the first send, once the client is up
            self._pace_start = time.monotonic()
        return max(0.0, self._pace_start + seq / self.args.rate - time.monotonic())

    def ignore_prop(self, key: str, value: str) -> None:
        """Record a --prop the library has no knob for."""
        self.ignored.append(key)
        log.warning("ignoring --prop %s=%s (no such knob in %s)", key, value, self.args.library)

    # producer outcomes
    def send(self, seq: int) -> None:
        with self._lock:
            self._sent.add(seq)
        self.events.emit(
            "send", id=self.message_id(seq), seq=seq, topic=self.args.topic, partition=self.args.partition
        )

    def ack(self, seq: int, partition: int, offset: int | None) -> None:
        with self._lock:
            self._acked.add(seq)
        if offset is not None and offset < 0:
            offset = None  # acks=0: the library has no offset
        self.events.emit(
            "ack", id=self.message_id(seq), seq=seq, topic=self.args.topic, partition=partition, offset=offset
        )

    def fail(self, seq: int, partition: int | None, error: str, code: int | None) -> None:
        with self._lock:
            self._failed.add(seq)
        self.events.emit(
            "error",
            id=self.message_id(seq),
            seq=seq,
            topic=self.args.topic,
            partition=partition if partition is not None and partition >= 0 else self.args.partition,
            error=error,
            error_code=code,
            error_name=ERROR_NAMES.get(code) if code is not None else None,
        )

    # consumer
    def assigned(self) -> None:
        """The consumer has its partitions: the idle clock starts now."""
        with self._lock:
            self._last_new = time.monotonic()

    def consumed(self, value: bytes | None, partition: int, offset: int) -> None:
        message_id = self.id_from_value(value)
        with self._lock:
            if message_id not in self._consumed:
                self._consumed.add(message_id)
                self._last_new = time.monotonic()
            done = bool(self.args.expect) and len(self._consumed) >= self.args.expect
        self.events.emit(
            "consume",
            id=message_id,
            topic=self.args.topic,
            partition=partition,
            offset=offset,
            group=self.args.group,
        )
        if done:
            self.stop_consuming.set()

    def commit(self, offsets: dict[str, int], error: str | None) -> None:
        self.events.emit("commit", group=self.args.group, offsets=offsets, error=error)

    def watch(self) -> None:
        """Set stop / stop_consuming at the deadline, and stop_consuming after --idle-s
        without a new id (not while this driver still produces: a stalled producer is
        not an idle topic)."""
        while not self.stop.is_set():
            now = time.monotonic()
            if now >= self.deadline:
                self.stop.set()
                self.stop_consuming.set()
                return
            with self._lock:
                quiet = not self.producing and now - self._last_new >= self.args.idle_s
            if quiet and self.args.consume:
                self.stop_consuming.set()
            time.sleep(0.05)

    def end(self) -> None:
        with self._lock:
            unresolved = len(self._sent - self._acked - self._failed)
            counts = len(self._sent), len(self._acked), len(self._failed), len(self._consumed)
        sent, acked, failed, consumed = counts
        self.events.emit(
            "end", sent=sent, acked=acked, failed=failed, consumed=consumed, unresolved=unresolved
        )


def _json_safe(value: Any) -> Any:
    """*value* with non-finite floats as strings (kafka-python's retries default is inf)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    return value


def _exc_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _exc_code(exc: BaseException) -> int | None:
    """The Kafka error code of a kafka-python / aiokafka BrokerResponseError (its errno)."""
    errno = getattr(exc, "errno", None)
    is_broker_error = any(cls.__name__ == "BrokerResponseError" for cls in type(exc).__mro__)
    return errno if is_broker_error and isinstance(errno, int) else None


# --------------------------------------------------------------------------- confluent-kafka


class ConfluentDriver:
    """confluent-kafka (librdkafka): delivery callbacks served by poll()/flush()."""

    library = "confluent-kafka"

    def __init__(self, run: Run) -> None:
        import confluent_kafka

        self.ck = confluent_kafka
        self.run = run
        args = run.args
        self.version = f"{confluent_kafka.__version__} (librdkafka {confluent_kafka.libversion()[0]})"
        rdlog = logging.getLogger("librdkafka")
        self.common: dict[str, Any] = {
            "bootstrap.servers": args.bootstrap,
            "client.id": args.client_id,
            "logger": rdlog,
            "debug": CONFLUENT_DEBUG,
        }
        self.common.update({k: v for k, v in args.props.items() if k != "log.level"})
        if not self.common["debug"]:  # --prop debug= turns librdkafka's debug contexts off
            del self.common["debug"]
        self.producer_conf = {**self.common, "acks": args.acks}
        self.consumer_conf = {
            **self.common,
            "group.id": args.group or f"{args.client_id}-nogroup",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": bool(args.group),
            "on_commit": self._on_commit,
        }
        # Drop keys librdkafka does not know (it refuses to start with them). The probe
        # clients have no bootstrap servers, so they open no connection.
        for conf, make in (
            (self.producer_conf, confluent_kafka.Producer),
            (self.consumer_conf, self._consumer),
        ):
            while True:
                probe = {k: v for k, v in conf.items() if k not in ("bootstrap.servers", "debug", "logger")}
                try:
                    make(probe | {"log_level": 0})
                    break
                except (confluent_kafka.KafkaException, ValueError, TypeError) as exc:
                    key = self._unknown_key(str(exc), conf)
                    if key is None:
                        raise
                    if key not in run.ignored:
                        run.ignore_prop(key, str(conf[key]))
                    del conf[key]

    def _consumer(self, conf: dict[str, Any]) -> Any:
        consumer = self.ck.Consumer(conf)
        consumer.close()
        return consumer

    @staticmethod
    def _unknown_key(message: str, conf: dict[str, Any]) -> str | None:
        """The key of a "No such configuration property" complaint."""
        if "No such configuration property" not in message:
            return None
        return next((key for key in conf if f'"{key}"' in message), None)

    def config(self) -> dict[str, Any]:
        keys = (
            "acks",
            "retries",
            "retry.backoff.ms",
            "linger.ms",
            "request.timeout.ms",
            "message.timeout.ms",
            "enable.idempotence",
            "max.in.flight.requests.per.connection",
            "debug",
        )
        return {k: self.producer_conf.get(k) for k in keys if k in self.producer_conf} | {
            "note": "keys not listed keep librdkafka's defaults"
        }

    def _on_commit(self, err: Any, partitions: list[Any]) -> None:
        offsets = {str(tp.partition): tp.offset for tp in partitions}
        self.run.commit(offsets, None if err is None else str(err))

    def _delivered(self, seq: int, err: Any, msg: Any) -> None:
        if err is None:
            self.run.ack(seq, msg.partition(), msg.offset())
        else:
            self._refused(seq, err, msg.partition())

    def _refused(self, seq: int, err: Any, partition: int | None = None) -> None:
        code = err.code()
        kafka_code = code if code > RDKAFKA_LOCAL_ERRORS else None
        self.run.fail(seq, partition, f"{err.name()}: {err.str()}", kafka_code)

    def produce(self) -> None:
        run, args = self.run, self.run.args
        producer = self.ck.Producer(self.producer_conf)
        for seq in range(args.produce):
            if run.stop.wait(run.due_in(seq)):
                break
            kwargs: dict[str, Any] = {"key": run.key(seq), "value": run.value(seq)}
            if args.partition is not None:
                kwargs["partition"] = args.partition
            run.send(seq)
            while not run.stop.is_set():
                try:
                    producer.produce(
                        args.topic, on_delivery=functools.partial(self._delivered, seq), **kwargs
                    )
                    break
                except BufferError:  # the local queue is full: serve callbacks, then retry
                    producer.poll(0.1)
                except self.ck.KafkaException as exc:  # refused up front, e.g. MSG_SIZE_TOO_LARGE
                    self._refused(seq, exc.args[0])
                    break
            producer.poll(0)
        while producer.flush(min(0.5, run.remaining())) > 0 and not run.stop.is_set():
            pass

    def consume(self) -> None:
        run, args = self.run, self.run.args
        consumer = self.ck.Consumer(self.consumer_conf)
        try:
            if args.group:
                consumer.subscribe([args.topic], on_assign=lambda _c, _parts: run.assigned())
            else:
                partitions = self._partitions(consumer)
                if partitions is None:
                    return
                consumer.assign(
                    [self.ck.TopicPartition(args.topic, p, self.ck.OFFSET_BEGINNING) for p in partitions]
                )
                run.assigned()
            while not run.stop_consuming.is_set():
                msg = consumer.poll(0.2)
                if msg is None:
                    continue
                if msg.error():
                    log.warning("consumer error: %s", msg.error())
                    continue
                run.consumed(msg.value(), msg.partition(), msg.offset())
        finally:
            consumer.close()  # commits (group) and leaves the group

    def _partitions(self, consumer: Any) -> list[int] | None:
        """The topic's partitions, retried until the run ends."""
        topic = self.run.args.topic
        while not self.run.stop_consuming.is_set():
            try:
                meta = consumer.list_topics(topic, timeout=max(0.5, min(5.0, self.run.remaining())))
                found = meta.topics.get(topic)
                if found is not None and found.error is None and found.partitions:
                    return sorted(found.partitions)
            except self.ck.KafkaException as exc:
                log.warning("list_topics(%s): %s", topic, exc)
            self.run.stop_consuming.wait(0.5)
        return None


# --------------------------------------------------------------------------- kafka-python


def _python_kwargs(run: Run, accepted: set[str]) -> dict[str, Any]:
    """--prop keys as kafka-python / aiokafka keyword arguments (linger.ms -> linger_ms)."""
    kwargs: dict[str, Any] = {}
    for key, value in run.args.props.items():
        if key == "log.level":
            continue
        name = key.replace(".", "_")
        if key == "batch.size" and "max_batch_size" in accepted:  # aiokafka's name
            name = "max_batch_size"
        if name not in accepted:
            run.ignore_prop(key, value)
        elif name == "api_version":
            kwargs[name] = value if value == "auto" else tuple(int(x) for x in value.split("."))
        else:
            kwargs[name] = _typed(value)
    return kwargs


def _acks(acks: str) -> int | str:
    return "all" if acks == "all" else int(acks)


class KafkaPythonDriver:
    """kafka-python: futures whose callbacks run on the client's I/O thread."""

    library = "kafka-python"

    def __init__(self, run: Run) -> None:
        import kafka

        self.kafka = kafka
        self.run = run
        self.version = kafka.__version__
        args = run.args
        producer_keys = set(kafka.KafkaProducer.DEFAULT_CONFIG)
        consumer_keys = set(kafka.KafkaConsumer.DEFAULT_CONFIG)
        kwargs = _python_kwargs(run, producer_keys | consumer_keys)
        base = {"bootstrap_servers": args.bootstrap.split(","), "client_id": args.client_id}
        self.producer_kwargs = base | {k: v for k, v in kwargs.items() if k in producer_keys}
        self.producer_kwargs["acks"] = _acks(args.acks)
        self.consumer_kwargs = base | {k: v for k, v in kwargs.items() if k in consumer_keys}
        self.consumer_kwargs |= {
            "group_id": args.group,
            "auto_offset_reset": "earliest",
            "enable_auto_commit": bool(args.group),
        }

    def config(self) -> dict[str, Any]:
        defaults = self.kafka.KafkaProducer.DEFAULT_CONFIG
        keys = (
            "acks",
            "retries",
            "retry_backoff_ms",
            "linger_ms",
            "request_timeout_ms",
            "delivery_timeout_ms",
            "enable_idempotence",
            "max_in_flight_requests_per_connection",
            "api_version",
        )
        return {k: self.producer_kwargs.get(k, defaults.get(k)) for k in keys}

    def produce(self) -> None:
        run, args = self.run, self.run.args
        producer = self.kafka.KafkaProducer(**self.producer_kwargs)
        try:
            for seq in range(args.produce):
                if run.stop.wait(run.due_in(seq)):
                    break
                run.send(seq)
                try:
                    future = producer.send(
                        args.topic, value=run.value(seq), key=run.key(seq), partition=args.partition
                    )
                except self.kafka.errors.KafkaError as exc:  # e.g. metadata not available in max_block_ms
                    run.fail(seq, args.partition, _exc_text(exc), _exc_code(exc))
                    continue
                future.add_callback(lambda md, seq=seq: run.ack(seq, md.partition, md.offset))
                future.add_errback(lambda exc, seq=seq: run.fail(seq, None, _exc_text(exc), _exc_code(exc)))
            with contextlib.suppress(self.kafka.errors.KafkaTimeoutError):
                producer.flush(timeout=run.remaining())
        finally:
            threading.Thread(target=producer.close, kwargs={"timeout": 2}, daemon=True).start()

    def consume(self) -> None:
        run, args = self.run, self.run.args
        consumer = self.kafka.KafkaConsumer(**self.consumer_kwargs)
        try:
            if args.group:
                listener = _KafkaPythonListener(run, self.kafka.ConsumerRebalanceListener)
                consumer.subscribe([args.topic], listener=listener)
            else:
                partitions = None
                while partitions is None and not run.stop_consuming.is_set():
                    consumer.topics()  # refreshes metadata
                    partitions = consumer.partitions_for_topic(args.topic)
                    if partitions is None:
                        run.stop_consuming.wait(0.5)
                if partitions is None:
                    return
                tps = [self.kafka.TopicPartition(args.topic, p) for p in sorted(partitions)]
                consumer.assign(tps)
                consumer.seek_to_beginning(*tps)
                run.assigned()
            while not run.stop_consuming.is_set():
                for tp, records in consumer.poll(timeout_ms=200).items():
                    for rec in records:
                        run.consumed(rec.value, tp.partition, rec.offset)
        finally:
            consumer.close()  # commits (group) and leaves the group


def _KafkaPythonListener(run: Run, base: type) -> Any:
    """A kafka-python ConsumerRebalanceListener that starts the idle clock on assignment."""

    class Listener(base):  # type: ignore[misc, valid-type]
        def on_partitions_revoked(self, revoked: Any) -> None:
            pass

        def on_partitions_assigned(self, assigned: Any) -> None:
            run.assigned()

    return Listener()


# --------------------------------------------------------------------------- aiokafka


class AiokafkaDriver:
    """aiokafka: producer and consumer as tasks on one event loop."""

    library = "aiokafka"

    def __init__(self, run: Run) -> None:
        import aiokafka

        self.aiokafka = aiokafka
        self.run = run
        self.version = aiokafka.__version__
        args = run.args
        producer_keys = set(inspect.signature(aiokafka.AIOKafkaProducer.__init__).parameters)
        consumer_keys = set(inspect.signature(aiokafka.AIOKafkaConsumer.__init__).parameters)
        kwargs = _python_kwargs(run, producer_keys | consumer_keys)
        base = {"bootstrap_servers": args.bootstrap, "client_id": args.client_id}
        self.producer_kwargs = base | {k: v for k, v in kwargs.items() if k in producer_keys}
        self.producer_kwargs["acks"] = _acks(args.acks)
        self.consumer_kwargs = base | {k: v for k, v in kwargs.items() if k in consumer_keys}
        self.consumer_kwargs |= {
            "group_id": args.group,
            "auto_offset_reset": "earliest",
            "enable_auto_commit": bool(args.group),
        }
        self._producer_defaults = {
            name: p.default
            for name, p in inspect.signature(aiokafka.AIOKafkaProducer.__init__).parameters.items()
        }

    def config(self) -> dict[str, Any]:
        keys = (
            "acks",
            "retry_backoff_ms",
            "linger_ms",
            "request_timeout_ms",
            "enable_idempotence",
            "max_batch_size",
            "api_version",
        )
        config = {k: self.producer_kwargs.get(k, self._producer_defaults.get(k)) for k in keys}
        if not isinstance(config["acks"], int | str):
            config["acks"] = 1  # aiokafka's default sentinel
        return config

    async def _produce(self) -> None:
        run, args = self.run, self.run.args
        producer = self.aiokafka.AIOKafkaProducer(**self.producer_kwargs)
        await self._start(producer)
        pending: list[asyncio.Future[Any]] = []
        try:
            for seq in range(args.produce):
                await asyncio.sleep(run.due_in(seq))
                if run.stop.is_set():
                    break
                run.send(seq)
                try:
                    future = await producer.send(
                        args.topic, value=run.value(seq), key=run.key(seq), partition=args.partition
                    )
                except self.aiokafka.errors.KafkaError as exc:
                    run.fail(seq, args.partition, _exc_text(exc), _exc_code(exc))
                    continue
                future.add_done_callback(functools.partial(self._delivered, seq))
                pending.append(future)
            if pending:
                await asyncio.wait(pending, timeout=run.remaining())
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(producer.stop(), timeout=2)

    def _delivered(self, seq: int, future: asyncio.Future[Any]) -> None:
        if future.cancelled():
            return  # cancelled at shutdown: no verdict from the library
        exc = future.exception()
        if exc is None:
            md = future.result()
            self.run.ack(seq, md.partition, md.offset)
        else:
            self.run.fail(seq, None, _exc_text(exc), _exc_code(exc))

    async def _start(self, client: Any) -> None:
        """start() retried until it connects or the run ends."""
        while True:
            try:
                await client.start()
                return
            except self.aiokafka.errors.KafkaConnectionError as exc:
                log.warning("start: %s", exc)
                if self.run.remaining() <= 0.5:
                    raise
                await asyncio.sleep(0.5)

    async def _consume(self) -> None:
        run, args = self.run, self.run.args
        consumer = self.aiokafka.AIOKafkaConsumer(**self.consumer_kwargs)
        await self._start(consumer)
        try:
            if args.group:
                consumer.subscribe([args.topic], listener=_AiokafkaListener(run, self.aiokafka))
            else:
                partitions = None
                while partitions is None and not run.stop_consuming.is_set():
                    await consumer.topics()  # refreshes metadata
                    partitions = consumer.partitions_for_topic(args.topic)
                    if partitions is None:
                        await asyncio.sleep(0.5)
                if partitions is None:
                    return
                tps = [self.aiokafka.TopicPartition(args.topic, p) for p in sorted(partitions)]
                consumer.assign(tps)
                await consumer.seek_to_beginning(*tps)
                run.assigned()
            while not run.stop_consuming.is_set():
                batches = await consumer.getmany(timeout_ms=200)
                for tp, records in batches.items():
                    for rec in records:
                        run.consumed(rec.value, tp.partition, rec.offset)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(consumer.stop(), timeout=3)  # commits and leaves the group

    async def _main(self) -> None:
        tasks = []
        if self.run.args.produce:
            tasks.append(asyncio.create_task(self._guard("produce", self._produce(), producing=True)))
        if self.run.args.consume:
            tasks.append(asyncio.create_task(self._guard("consume", self._consume())))
        await asyncio.wait(tasks, timeout=max(0.0, self.run.hard_deadline - time.monotonic()))

    async def _guard(self, what: str, coro: Any, producing: bool = False) -> None:
        try:
            await coro
        except Exception:
            log.exception("%s failed", what)
        finally:
            if producing:
                self.run.producing = False

    def run_all(self) -> None:
        asyncio.run(self._main())


def _AiokafkaListener(run: Run, aiokafka: Any) -> Any:
    from aiokafka.abc import ConsumerRebalanceListener

    class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
        def on_partitions_revoked(self, revoked: Any) -> None:
            pass

        def on_partitions_assigned(self, assigned: Any) -> None:
            run.assigned()

    return Listener()


# --------------------------------------------------------------------------- main


def _setup_logging(path: str | None, level_name: str) -> None:
    level = logging.getLevelName(level_name.upper())
    if not isinstance(level, int):
        raise SystemExit(f"--prop log.level={level_name}: not a logging level")
    handler: logging.Handler = logging.FileHandler(path, mode="w") if path else logging.NullHandler()
    handler.setFormatter(
        logging.Formatter("%(asctime)s.%(msecs)03d %(levelname)s %(name)s %(message)s", "%Y-%m-%d %H:%M:%S")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # librdkafka's own level is set by its config; its records arrive at DEBUG/INFO/WARNING.
    logging.getLogger("librdkafka").setLevel(logging.DEBUG)


def _thread(run: Run, what: str, target: Any, producing: bool = False) -> threading.Thread:
    def body() -> None:
        try:
            target()
        except Exception:
            log.exception("%s failed", what)
        finally:
            if producing:
                run.producing = False

    thread = threading.Thread(target=body, name=what, daemon=True)
    thread.start()
    return thread


def main(argv: list[str]) -> int:
    """Run one driver; exit 0 when the run completed, 2 when the driver could not start."""
    args = parse_args(argv)
    _setup_logging(args.log, args.props.get("log.level", "INFO"))
    events = Events(args.out)
    run = Run(args, events)
    makers = {
        "confluent-kafka": ConfluentDriver,
        "kafka-python": KafkaPythonDriver,
        "aiokafka": AiokafkaDriver,
    }
    try:
        driver = makers[args.library](run)
    except Exception as exc:
        print(f"py_driver: cannot set up {args.library}: {_exc_text(exc)}", file=sys.stderr)
        return 2
    events.emit(
        "start",
        library=driver.library,
        library_version=driver.version,
        client_id=args.client_id,
        args={k: v for k, v in vars(args).items() if k != "prop"},
        config=_json_safe(driver.config()),
        ignored_props=run.ignored,
    )
    watcher = threading.Thread(target=run.watch, name="watch", daemon=True)
    watcher.start()
    if isinstance(driver, AiokafkaDriver):
        worker = _thread(run, "aiokafka", driver.run_all)
        worker.join(max(0.0, run.hard_deadline - time.monotonic()))
    else:
        threads = []
        if args.produce:
            threads.append(_thread(run, "produce", driver.produce, producing=True))
        if args.consume:
            threads.append(_thread(run, "consume", driver.consume))
        for thread in threads:
            thread.join(max(0.0, run.hard_deadline - time.monotonic()))
    if any(t.is_alive() for t in threading.enumerate() if t.name in ("produce", "consume", "aiokafka")):
        log.warning("the library did not return by --duration-s; ending the run")
    run.end()
    events.close()
    logging.shutdown()
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    # Library threads (kafka-python's I/O thread, librdkafka's) may still be running: do not wait for them.
    os._exit(code)
