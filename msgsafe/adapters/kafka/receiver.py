"""The Kafka consuming receiver: a consumer group member that commits only what the
application acknowledged.

Kafka commits a position, not single messages, so the receiver tracks, per partition,
the offsets it handed out and the ones settled; it commits the end of the contiguous
settled prefix (at-least-once: an offset is committed only when it and everything
before it in its partition was settled). Commits happen in ``receive`` (batched, one per
call) and on partition revocation during a rebalance, on the thread that owns the
consumer; ``ack`` from any thread only records.

``nack(requeue=True)`` rewinds the partition to that offset (Kafka has no per-message
requeue): it and later messages of the partition are delivered again. ``nack(requeue=
False)`` skips it (Kafka has no broker-side dead-letter; the skip is logged).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from functools import partial

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from msgsafe.adapters.kafka._errors import translate
from msgsafe.adapters.kafka._wire import read_headers
from msgsafe.adapters.kafka.config import KafkaOptions, consumer_settings
from msgsafe.endpoints import BrokerUrl
from msgsafe.errors import ClosedError, ConfigurationError, ConnectionLost
from msgsafe.message import Delivery, Outcome, new_message_id

__all__ = ["KafkaReceiver"]

log = logging.getLogger("msgsafe.kafka")

_Partition = tuple[str, int]

_UNKNOWN_TOPIC = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC})
#: The group coordinator refuses this member's settings: librdkafka would rejoin with the
#: same settings forever, receiving nothing, so the receiver raises instead.
_GROUP_SETTINGS_REFUSED = frozenset(
    {
        KafkaError.INVALID_SESSION_TIMEOUT,
        KafkaError.INCONSISTENT_GROUP_PROTOCOL,
        KafkaError.INVALID_GROUP_ID,
    }
)

#: Seconds one consume() call blocks at most, so commits and close stay responsive.
_SLICE_S = 0.5

#: Seconds between metadata checks while a subscribed topic is unknown to the broker
#: asked. librdkafka reports an unknown subscribed topic once and then waits for its
#: periodic refresh (5 minutes by default); checking again and re-subscribing once the
#: topic is known means a topic created after subscribe() (or not yet known to every
#: broker of a cluster) is consumed within seconds.
_UNKNOWN_TOPIC_RETRY_S = 1.0
#: Seconds one such metadata check may block the receiving thread.
_METADATA_CHECK_S = 1.0


@dataclass(slots=True)
class _Track:
    """Offsets handed out and settled on one partition of the current assignment."""

    #: Offsets delivered and not yet behind the commit point, in delivery order.
    pending: deque[int] = field(default_factory=deque)
    settled: set[int] = field(default_factory=set)
    #: The next offset to commit (everything below it is settled), or None.
    commit: int | None = None
    committed: int | None = None
    #: Highest offset delivered in this process (anything at or below it is a redelivery).
    high: int = -1
    #: Offset to seek back to before the next consume (nack with requeue).
    rewind: int | None = None


class KafkaReceiver:
    """A member of consumer group ``group``; see :class:`msgsafe.ports.Receiver`."""

    def __init__(self, url: BrokerUrl, options: KafkaOptions, group: str | None) -> None:
        self._target = url.redacted()
        # NOTE: Kafka needs a group to commit; without one every receiver is its own group
        # and reads the topic from auto_offset_reset.
        self._group = group or f"msgsafe-{new_message_id()}"
        settings = consumer_settings(url, options, self._group)
        settings["error_cb"] = self._on_error
        try:
            self._consumer = Consumer(settings)
        except KafkaException as exc:
            raise ConfigurationError(f"kafka consumer settings: {exc.args[0].str()}") from exc
        self._topics: list[str] = []
        #: Guards the consumer: one thread at a time receives, commits or closes.
        self._io = threading.RLock()
        #: Guards the tracks: settle() comes from any thread.
        self._lock = threading.Lock()
        self._tracks: dict[_Partition, _Track] = {}
        self._closed = False
        #: When to look again for subscribed topics reported unknown, and which they are.
        self._resubscribe_at: float | None = None
        self._unknown: set[str] = set()
        #: A refusal of this member's group settings reported to the error callback.
        self._refused: KafkaError | None = None
        #: Deliveries marked redelivered so far (best effort; for tests and metrics).
        self.redelivered = 0

    @property
    def group(self) -> str:
        """The consumer group id."""
        return self._group

    def subscribe(self, destination: str) -> None:
        """Add topic ``destination`` to the subscription."""
        with self._io:
            self._check_open()
            if destination in self._topics:
                return
            self._topics.append(destination)
            self._subscribe()

    def _subscribe(self) -> None:
        self._resubscribe_at = None
        self._unknown.clear()
        try:
            self._consumer.subscribe(
                list(self._topics), on_assign=self._on_assign, on_revoke=self._on_revoke
            )
        except KafkaException as exc:
            raise translate(exc.args[0], endpoint=self._target) from exc

    # --- receiving ------------------------------------------------------------------------

    def receive(self, *, max_messages: int, timeout: float | None) -> list[Delivery]:
        """Up to ``max_messages`` deliveries within ``timeout`` seconds (None: until one).

        Commits what was acknowledged since the last call first.
        """
        if max_messages < 1:
            return []
        with self._io:
            self._check_open()
            if not self._topics:
                raise ClosedError("subscribe() before receive()", endpoint=self._target)
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                self._commit()
                self._apply_rewinds()
                if self._resubscribe_at is not None and time.monotonic() >= self._resubscribe_at:
                    self._recheck_unknown_topics()
                left = _SLICE_S if deadline is None else min(_SLICE_S, deadline - time.monotonic())
                try:
                    messages = self._consumer.consume(max_messages, max(0.0, left))
                except KafkaException as exc:
                    raise translate(exc.args[0], endpoint=self._target) from exc
                except RuntimeError as exc:
                    raise ConnectionLost(f"kafka consumer: {exc}", endpoint=self._target) from exc
                self._raise_if_refused(self._refused)
                deliveries = self._wrap(messages)
                if deliveries or (deadline is not None and time.monotonic() >= deadline):
                    return deliveries

    def _recheck_unknown_topics(self) -> None:
        """Re-subscribe once every topic reported unknown shows in metadata; until then
        look again every ``_UNKNOWN_TOPIC_RETRY_S`` (re-joining the group on every look
        would make the other members rebalance for nothing)."""
        wanted = self._unknown & set(self._topics) or set(self._topics)
        try:
            known = {
                name
                for name, meta in self._consumer.list_topics(
                    timeout=_METADATA_CHECK_S
                ).topics.items()
                if meta.error is None and meta.partitions
            }
        except KafkaException as exc:
            log.info("kafka metadata check: %s", exc.args[0].str())
            known = set()
        if wanted <= known:
            log.info("kafka: subscribed topics %s now known; re-subscribing", sorted(wanted))
            self._subscribe()
        else:
            self._resubscribe_at = time.monotonic() + _UNKNOWN_TOPIC_RETRY_S

    def _wrap(self, messages: list[Message]) -> list[Delivery]:
        deliveries: list[Delivery] = []
        with self._lock:
            for msg in messages:
                err = msg.error()
                if err is not None:
                    if err.fatal():
                        raise translate(err, endpoint=self._target)
                    self._raise_if_refused(err)
                    log.info("kafka consumer: %s", err.str())
                    if err.code() in _UNKNOWN_TOPIC:
                        self._unknown.add(msg.topic() or "")
                        if self._resubscribe_at is None:
                            self._resubscribe_at = time.monotonic() + _UNKNOWN_TOPIC_RETRY_S
                    continue
                topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
                if topic is None or partition is None or offset is None:
                    continue
                track = self._tracks.setdefault((topic, partition), _Track())
                redelivered = offset <= track.high
                track.high = max(track.high, offset)
                track.pending.append(offset)
                message_id, headers = read_headers(msg)
                if redelivered:
                    self.redelivered += 1
                deliveries.append(
                    Delivery(
                        body=msg.value() or b"",
                        destination=topic,
                        message_id=message_id,
                        key=msg.key(),
                        headers=headers,
                        redelivered=redelivered,
                        settle=partial(self._settle, topic, partition, offset, track),
                    )
                )
        return deliveries

    # --- settling and committing ------------------------------------------------------------

    def _settle(
        self, topic: str, partition: int, offset: int, track: _Track, outcome: Outcome
    ) -> None:
        with self._lock:
            if self._tracks.get((topic, partition)) is not track:
                # The partition was revoked (or rewound) since: its new owner will deliver
                # this message again; nothing to record here.
                return
            if outcome is Outcome.REQUEUE:
                track.rewind = offset if track.rewind is None else min(track.rewind, offset)
                return
            if outcome is Outcome.REJECT:
                log.warning(
                    "kafka has no broker-side reject: skipping %s[%d]@%d", topic, partition, offset
                )
            track.settled.add(offset)
            while track.pending and track.pending[0] in track.settled:
                done = track.pending.popleft()
                track.settled.discard(done)
                track.commit = done + 1

    def _apply_rewinds(self) -> None:
        seeks: list[TopicPartition] = []
        with self._lock:
            for (topic, partition), track in self._tracks.items():
                if track.rewind is None:
                    continue
                rewind, track.rewind = track.rewind, None
                # Offsets from the rewind point on come again and are tracked afresh;
                # a late ack of an old copy only says that copy was processed.
                track.pending = deque(o for o in track.pending if o < rewind)
                seeks.append(TopicPartition(topic, partition, rewind))
        for tp in seeks:
            try:
                # NOTE: librdkafka purges the partition's prefetched messages on seek.
                self._consumer.seek(tp)
            except KafkaException as exc:
                log.warning(
                    "kafka seek %s[%d]@%d failed: %s", tp.topic, tp.partition, tp.offset, exc
                )

    def _commit(self, partitions: list[TopicPartition] | None = None) -> None:
        """Commit settled prefixes (of ``partitions`` only, when given). Never raises: a
        failed commit means redelivery, which at-least-once allows."""
        wanted = None if partitions is None else {(p.topic, p.partition) for p in partitions}
        offsets: list[TopicPartition] = []
        with self._lock:
            for (topic, partition), track in self._tracks.items():
                if wanted is not None and (topic, partition) not in wanted:
                    continue
                if track.commit is not None and track.commit != track.committed:
                    offsets.append(TopicPartition(topic, partition, track.commit))
        if not offsets:
            return
        try:
            result = self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            log.warning("kafka commit failed (messages will be redelivered): %s", exc)
            return
        with self._lock:
            for tp in result or offsets:
                if tp.error is not None:
                    log.warning("kafka commit %s[%d]: %s", tp.topic, tp.partition, tp.error)
                    continue
                done = self._tracks.get((tp.topic, tp.partition))
                if done is not None:
                    done.committed = tp.offset

    # --- rebalance callbacks (run inside consume(), on the receiving thread) ---------------

    def _on_assign(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.info("kafka assigned %s", [(p.topic, p.partition) for p in partitions])

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Commit what was acknowledged before the partitions move to another member;
        # what was not will be delivered again there.
        self._commit(partitions)
        with self._lock:
            for p in partitions:
                self._tracks.pop((p.topic, p.partition), None)
        log.info("kafka revoked %s", [(p.topic, p.partition) for p in partitions])

    def _on_error(self, err: KafkaError) -> None:
        log.info("kafka consumer: %s: %s", err.name(), err.str())
        if err.code() in _GROUP_SETTINGS_REFUSED:
            self._refused = err

    def _raise_if_refused(self, err: KafkaError | None) -> None:
        if err is not None and err.code() in _GROUP_SETTINGS_REFUSED:
            raise ConfigurationError(
                f"kafka group {self._group!r} refused this consumer: {err.str()} "
                "(session_timeout_ms must lie within the brokers' "
                "group.min.session.timeout.ms and group.max.session.timeout.ms)",
                endpoint=self._target,
            )

    # --- lifecycle --------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("receiver is closed", endpoint=self._target)

    def close(self, timeout: float | None = None) -> None:
        """Commit what was acknowledged, leave the group; unsettled messages will be
        delivered again to the next member. Idempotent."""
        del timeout  # librdkafka bounds the leave by session.timeout.ms itself
        with self._io:
            if self._closed:
                return
            self._closed = True
            try:
                self._commit()
                self._consumer.close()
            except (KafkaException, RuntimeError) as exc:
                log.warning("kafka consumer close: %s", exc)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"KafkaReceiver({self._target!r}, group={self._group!r}, {state})"
