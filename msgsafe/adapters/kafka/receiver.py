"""The Kafka consuming receiver: a consumer group member that commits only what the
application acknowledged.

Kafka commits a position, not single messages, so the receiver tracks, per partition,
the offsets it handed out and the ones settled; it commits the end of the contiguous
settled prefix (at-least-once: an offset is committed only when it and everything
before it in its partition was settled). Commits happen in ``receive``, asynchronously
and at most every ``_COMMIT_EVERY_S`` (a commit per call waited for the coordinator's
answer on every batch: most of the time of a fast reader), synchronously on partition
revocation during a rebalance and at ``close``, on the thread that owns the consumer;
``ack`` from any thread only records. A failed asynchronous commit is sent again at the
next one; a crash before a commit means redelivery, which at-least-once allows.

``nack(requeue=True)`` rewinds the partition to that offset (Kafka has no per-message
requeue): it and later messages of the partition are delivered again. ``nack(requeue=
False)`` skips it (Kafka has no broker-side dead-letter; the skip is logged).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from functools import partial
from types import MappingProxyType

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from msgsafe.adapters.kafka._errors import translate
from msgsafe.adapters.kafka._wire import ID_HEADER, read_headers
from msgsafe.adapters.kafka.config import KafkaOptions, consumer_settings
from msgsafe.endpoints import BrokerUrl
from msgsafe.errors import ClosedError, ConfigurationError, ConnectionLost, MsgsafeError
from msgsafe.message import NO_HEADERS, UNSET, Delivery, Outcome, SettleFn, new_message_id

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

#: Seconds between the asynchronous commits of ``receive`` (at most one per call).
_COMMIT_EVERY_S = 0.2

_ACCEPT = Outcome.ACCEPT
_REQUEUE = Outcome.REQUEUE
#: A release is a requeue here: Kafka counts no deliveries, so none is spared.
_RELEASE = Outcome.RELEASE
_REJECT = Outcome.REJECT

#: Seconds between metadata checks while a subscribed topic is unknown to the broker
#: asked. librdkafka reports an unknown subscribed topic once and then waits for its
#: periodic refresh (5 minutes by default); checking again and re-subscribing once the
#: topic is known means a topic created after subscribe() (or not yet known to every
#: broker of a cluster) is consumed within seconds.
_UNKNOWN_TOPIC_RETRY_S = 1.0
#: Seconds one such metadata check may block the receiving thread.
_METADATA_CHECK_S = 1.0


class _Track:
    """Offsets handed out and settled on one partition of the current assignment.

    A delivery settles through :meth:`settle` (its ``partial``), from any thread, under
    the receiver's ``lock``. Deliveries are mostly settled in order: the head of
    ``pending`` settled with nothing else waiting moves the commit point at once."""

    __slots__ = (
        "commit",
        "committed",
        "high",
        "live",
        "lock",
        "partition",
        "pending",
        "rewind",
        "settled",
        "topic",
    )

    def __init__(self, topic: str, partition: int, lock: threading.Lock) -> None:
        self.topic = topic
        self.partition = partition
        self.lock = lock
        #: Offsets delivered and not yet behind the commit point, in delivery order.
        self.pending: deque[int] = deque()
        self.settled: set[int] = set()
        #: The next offset to commit (everything below it is settled), or None.
        self.commit: int | None = None
        self.committed: int | None = None
        #: Highest offset delivered in this process (anything at or below it is a redelivery).
        self.high = -1
        #: Offset to seek back to before the next consume (nack with requeue).
        self.rewind: int | None = None
        #: False once the partition was revoked: its new owner delivers again.
        self.live = True

    def settle(self, offset: int, outcome: Outcome) -> None:
        with self.lock:
            self.settle_locked(offset, outcome)

    def settle_locked(self, offset: int, outcome: Outcome) -> None:
        """:meth:`settle` with ``lock`` held."""
        if not self.live:
            # The partition was revoked since: its new owner will deliver this
            # message again; nothing to record here.
            return
        if outcome is _REQUEUE or outcome is _RELEASE:
            self.rewind = offset if self.rewind is None else min(self.rewind, offset)
            return
        if outcome is _REJECT:
            log.warning(
                "kafka has no broker-side reject: skipping %s[%d]@%d",
                self.topic,
                self.partition,
                offset,
            )
        pending, settled = self.pending, self.settled
        if not settled and pending and pending[0] == offset:
            pending.popleft()
            self.commit = offset + 1
            return
        settled.add(offset)
        while pending and pending[0] in settled:
            done = pending.popleft()
            settled.discard(done)
            self.commit = done + 1


class _KafkaDelivery(Delivery):
    """A delivery of one record: settled straight into its partition's :class:`_Track`.

    Made positionally by :meth:`KafkaReceiver._wrap` (no keyword parsing, no settle
    closure per message). :meth:`ack` takes one lock, the track's, for both the
    exactly-once check and the commit point: the common ack — the partition's oldest
    pending offset, nothing settled out of order — pops it and moves the commit point
    there and then. Once the telemetry wraps the settling (:meth:`_wrap_settle`), the
    delivery settles the general way, through the wrapper.
    """

    __slots__ = ("_offset", "_track")

    def __init__(
        self,
        body: bytes,
        topic: str,
        message_id: str | None,
        key: bytes | None,
        headers: Mapping[str, str],
        redelivered: bool,
        track: _Track,
        offset: int,
    ) -> None:
        # NOTE: every slot set here, positionally, as Delivery.__init__ would: that
        # constructor's keyword parsing and checks cost more than the stores.
        self.body = body
        self.destination = topic
        self.message_id = message_id
        self.key = key
        self.headers = headers
        self.redelivered = redelivered
        self.attempt_from_broker = False
        self.attempt = 2 if redelivered else 1
        self._settle = None  # type: ignore[assignment]  # settled through the track
        self._settled = None
        self._lock = track.lock
        self._after = None
        self.deserializers = None
        self._value = UNSET
        self._key_value = UNSET
        self._track = track
        self._offset = offset

    def _wrap_settle(self, wrap: Callable[[SettleFn], SettleFn]) -> None:
        inner = self._settle
        if inner is None:
            inner = partial(self._track.settle, self._offset)
        self._settle = wrap(inner)

    def settle(self, outcome: Outcome) -> None:
        if self._settle is not None:
            Delivery.settle(self, outcome)
            return
        track = self._track
        with track.lock:
            if self._settled is not None:
                raise _settled_twice(self)
            self._settled = outcome
            track.settle_locked(self._offset, outcome)
        after = self._after
        if after is not None:
            after(self, outcome)

    def ack(self) -> None:
        if self._settle is not None:
            Delivery.settle(self, _ACCEPT)
            return
        track = self._track
        with track.lock:
            if self._settled is not None:
                raise _settled_twice(self)
            self._settled = _ACCEPT
            pending = track.pending
            offset = self._offset
            # settle_locked's common case, inline: the oldest pending offset, in order.
            if track.live and not track.settled and pending and pending[0] == offset:
                pending.popleft()
                track.commit = offset + 1
            else:
                track.settle_locked(offset, _ACCEPT)
        after = self._after
        if after is not None:
            after(self, _ACCEPT)

    @classmethod
    def _ack_run(cls, deliveries: list[Delivery]) -> list[tuple[Delivery, MsgsafeError]]:
        """:meth:`ack` each of ``deliveries`` under one take of the receiver's lock (every
        track shares it), each track's commit point moved once at the end, then tell
        each observer; one not settled straight into a track of the first's receiver
        (another class, another receiver, the telemetry's wrapper) is acknowledged
        alone."""
        failed: list[tuple[Delivery, MsgsafeError]] = []
        alone: list[Delivery] = []
        acked: list[_KafkaDelivery] = []
        first = deliveries[0] if deliveries else None
        if type(first) is not cls or first._settle is not None:
            return super()._ack_run(deliveries)
        lock = first._track.lock
        moved: set[_Track] = set()
        with lock:
            for delivery in deliveries:
                if type(delivery) is not cls or delivery._settle is not None:
                    alone.append(delivery)
                    continue
                track: _Track = delivery._track
                if track.lock is not lock:
                    alone.append(delivery)
                elif delivery._settled is not None:
                    failed.append((delivery, _settled_twice(delivery)))
                else:
                    delivery._settled = _ACCEPT
                    acked.append(delivery)
                    if not track.live:
                        continue  # revoked: its new owner delivers it again
                    offset: int = delivery._offset
                    pending = track.pending
                    if not track.settled and pending and pending[0] == offset:
                        pending.popleft()
                        track.commit = offset + 1
                    else:
                        track.settled.add(offset)
                        moved.add(track)
            for track in moved:
                pending, settled = track.pending, track.settled
                while pending and pending[0] in settled:
                    done = pending.popleft()
                    settled.discard(done)
                    track.commit = done + 1
        for delivery in acked:
            after = delivery._after
            if after is not None:
                after(delivery, _ACCEPT)
        if alone:
            failed.extend(super()._ack_run(alone))
        return failed


def _settled_twice(delivery: Delivery) -> ClosedError:
    settled = delivery.settled
    return ClosedError(
        f"delivery already settled ({settled.value if settled else None})",
        message_id=delivery.message_id,
    )


class KafkaReceiver:
    """A member of consumer group ``group``; see :class:`msgsafe.ports.Receiver`."""

    def __init__(self, url: BrokerUrl, options: KafkaOptions, group: str | None) -> None:
        self._target = url.redacted()
        # NOTE: Kafka needs a group to commit; without one every receiver is its own group
        # and reads the topic from auto_offset_reset.
        self._group = group or f"msgsafe-{new_message_id()}"
        settings = consumer_settings(url, options, self._group)
        settings["error_cb"] = self._on_error
        settings["on_commit"] = self._on_commit
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
        #: When ``receive`` commits next (monotonic seconds).
        self._commit_at = 0.0
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
                now = time.monotonic()
                if now >= self._commit_at:
                    self._commit_at = now + _COMMIT_EVERY_S
                    self._commit(asynchronous=True)
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
        append = deliveries.append
        tracks = self._tracks
        track: _Track | None = None
        topic: str | None = None
        partition: int | None = None
        high = -1
        with self._lock:
            try:
                for msg in messages:
                    if msg.error() is not None:
                        self._consume_error(msg)
                        continue
                    offset = msg.offset()
                    # A batch holds runs of one partition: look its track up once per run.
                    if msg.partition() != partition or msg.topic() != topic or track is None:
                        if track is not None:
                            track.high = high
                        topic, partition = msg.topic(), msg.partition()
                        if topic is None or partition is None:
                            track = None
                            continue
                        track = tracks.get((topic, partition))
                        if track is None:
                            track = tracks[(topic, partition)] = _Track(
                                topic, partition, self._lock
                            )
                        high = track.high
                    if offset is None or track is None or topic is None:
                        continue
                    if offset <= high:
                        redelivered = True
                        self.redelivered += 1
                    else:
                        redelivered = False
                        high = offset
                    track.pending.append(offset)
                    raw = msg.headers()
                    # The common record: msgsafe's id header alone (read_headers' fast case).
                    if (
                        type(raw) is list
                        and len(raw) == 1
                        and raw[0][0] == ID_HEADER
                        and type(raw[0][1]) is bytes
                    ):
                        message_id: str | None = raw[0][1].decode("utf-8", "replace")
                        headers = NO_HEADERS
                    elif raw:
                        message_id, parsed = read_headers(msg)
                        headers = MappingProxyType(parsed) if parsed else NO_HEADERS
                    else:
                        message_id, headers = None, NO_HEADERS
                    append(
                        _KafkaDelivery(
                            msg.value() or b"",
                            topic,
                            message_id,
                            msg.key(),
                            headers,
                            redelivered,
                            track,
                            offset,
                        )
                    )
            finally:
                if track is not None:
                    track.high = high
        return deliveries

    def _consume_error(self, msg: Message) -> None:
        """An error handed out in place of a message: raised when fatal or a refusal of
        this member's settings, logged (and an unknown topic looked for again) else."""
        err = msg.error()
        if err is None:
            return
        if err.fatal():
            raise translate(err, endpoint=self._target)
        self._raise_if_refused(err)
        log.info("kafka consumer: %s", err.str())
        if err.code() in _UNKNOWN_TOPIC:
            self._unknown.add(msg.topic() or "")
            if self._resubscribe_at is None:
                self._resubscribe_at = time.monotonic() + _UNKNOWN_TOPIC_RETRY_S

    # --- settling and committing ------------------------------------------------------------

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

    def _commit(
        self, partitions: list[TopicPartition] | None = None, *, asynchronous: bool = False
    ) -> None:
        """Commit settled prefixes (of ``partitions`` only, when given). Never raises: a
        failed commit means redelivery, which at-least-once allows. An asynchronous
        commit counts as done when sent; :meth:`_on_commit` undoes that on a failure."""
        wanted = None if partitions is None else {(p.topic, p.partition) for p in partitions}
        offsets: list[TopicPartition] = []
        with self._lock:
            for (topic, partition), track in self._tracks.items():
                if wanted is not None and (topic, partition) not in wanted:
                    continue
                if track.commit is not None and track.commit != track.committed:
                    offsets.append(TopicPartition(topic, partition, track.commit))
                    if asynchronous:
                        track.committed = track.commit
        if not offsets:
            return
        try:
            if asynchronous:
                self._consumer.commit(offsets=offsets, asynchronous=True)
                return
            result = self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            log.warning("kafka commit failed (messages will be redelivered): %s", exc)
            if asynchronous:
                self._uncommitted(offsets)
            return
        with self._lock:
            for tp in result or offsets:
                if tp.error is not None:
                    log.warning("kafka commit %s[%d]: %s", tp.topic, tp.partition, tp.error)
                    continue
                done = self._tracks.get((tp.topic, tp.partition))
                if done is not None:
                    done.committed = tp.offset

    def _on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """librdkafka's answer to a commit (inside consume(), on the receiving thread):
        what failed is committed again by the next commit."""
        failed = [tp for tp in partitions if err is not None or tp.error is not None]
        if failed:
            log.info("kafka commit failed (sent again at the next): %s", err or failed[0].error)
            self._uncommitted(failed)

    def _uncommitted(self, offsets: list[TopicPartition]) -> None:
        with self._lock:
            for tp in offsets:
                track = self._tracks.get((tp.topic, tp.partition))
                if track is not None and track.committed == tp.offset:
                    track.committed = None

    # --- rebalance callbacks (run inside consume(), on the receiving thread) ---------------

    def _on_assign(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.info("kafka assigned %s", [(p.topic, p.partition) for p in partitions])

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Commit what was acknowledged before the partitions move to another member;
        # what was not will be delivered again there.
        self._commit(partitions)
        with self._lock:
            for p in partitions:
                track = self._tracks.pop((p.topic, p.partition), None)
                if track is not None:
                    track.live = False
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
