"""The transport's policy on its Kafka client: the poll thread, the watchdog, and every
delivery report it owes.

The producer itself, its settings, the record headers, reports in runs and error
translation are the client's (:class:`~msgsafe.adapters.kafka.client.KafkaClient`); librdkafka
owns the connections to the brokers and fails over by itself. On top of that, for the
transport (what callers call) as the part that outlives a producer:

- :class:`ProducerLink` polls librdkafka when publishers are not serving reports
  themselves, and renews the producer after a fatal error (the idempotence state is
  lost): what the old one held fails transiently and goes to the outbox;
- a watchdog on the same thread fails anything still open at ``confirm_timeout``, so
  every message's outcome arrives in time (librdkafka bounds each one by
  ``message.timeout.ms``, set inside ``confirm_timeout``, as a first line);
- librdkafka's error events tell when every broker is down (publishes then fail at
  once) and when the peer speaks another protocol or refuses the certificate;
- :class:`SendReport` is one message's delivery callable; :class:`BatchReports` settles
  a :class:`~msgsafe.message.Batch` from the :class:`~msgsafe.adapters.kafka.client.ReportRun`
  of each chunk of it.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable

from confluent_kafka import KafkaError, KafkaException, Message

from msgsafe._observer import current as observer_now
from msgsafe.adapters import _peer
from msgsafe.adapters._reports import PUBLISH_CALLBACK, call_logged, report_confirmed, report_failed
from msgsafe.adapters.kafka._errors import PRODUCER_STATE, certificate_refusal
from msgsafe.adapters.kafka.client import KafkaClient, ReportRun
from msgsafe.adapters.kafka.config import KafkaOptions
from msgsafe.endpoints import BrokerUrl
from msgsafe.errors import (
    AuthenticationError,
    CertificateError,
    ConfirmTimeout,
    ConnectError,
    ConnectionLost,
    InvalidMessage,
    MsgsafeError,
    ProtocolMismatch,
)
from msgsafe.message import Batch
from msgsafe.ports import BatchReport, PublishCallback

__all__ = ["BatchReports", "ProducerLink", "SendReport", "log"]

log = logging.getLogger("msgsafe.kafka")

#: Seconds the poll thread blocks in librdkafka when idle.
_POLL_S = 0.05
#: The poll thread leaves librdkafka to the publishers while they polled this recently.
_INLINE_GRACE_S = 0.02
#: Seconds between repeated "all brokers down" warnings.
_DOWN_WARN_EVERY_S = 30.0
_PURGED = frozenset({KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT})
#: Seconds new messages fail at once after librdkafka said "all brokers down"; then one goes
#: through as a probe (the error repeats while they stay down; a delivery ends the outage).
_DOWN_HOLD_S = 1.0
#: Seconds between the poll thread's metadata requests while every broker is down
#: (see ProducerLink._look_for_brokers); each waits at most this long.
_LOOK_EVERY_S = 0.1
#: librdkafka's "Invalid response size N": the peer's first four bytes as a Kafka frame
#: length. b"AMQP" (an AMQP protocol header) is 1095586128; TLS starts 0x15 or 0x16.
_RESPONSE_SIZE = re.compile(r"Invalid response size (\d+)")
_AMQP_HEADER = int.from_bytes(b"AMQP", "big")
#: librdkafka's connection failure of one broker: its address and the state it failed in.
_FAILED_IN = re.compile(r"^(\S+?)(?:/\S*)?: .*\(after \d+ms in state (\w+)")
_ADVICE = _peer.KAFKA_ADVICE


class SendReport:
    """One message in librdkafka: its delivery callback and the watchdog's entry.

    A slotted object rather than a future or a closure: on the hot path every container
    object counts, because the cyclic GC walks all of them while messages are in flight.
    """

    __slots__ = ("callback", "deadline", "link", "message_id")

    def __init__(
        self,
        link: ProducerLink,
        message_id: str,
        deadline: float,
        callback: PublishCallback,
    ) -> None:
        self.link = link
        self.message_id = message_id
        self.deadline = deadline
        self.callback = callback

    def __call__(self, err: KafkaError | None, _msg: Message) -> None:
        # librdkafka's delivery report. Runs where reports are served (poll thread, a
        # publisher, close()) and must never raise into librdkafka.
        link = self.link
        try:
            # NOTE: set.remove is atomic under the GIL: whoever removes the report
            # settles it; a report that arrives after the watchdog did is dropped.
            link.open.remove(self)
        except KeyError:
            return
        if err is None:
            link.down_until = 0.0
            call_logged(log, PUBLISH_CALLBACK, self.callback, None)
        else:
            link._failed(self, err)


class BatchReports:
    """Everything the transport tracks for one batch: its chunks, its deadline, and
    which indexes are settled. Reports ``confirmed`` once per finished chunk.

    Each chunk of the batch is a :class:`~msgsafe.adapters.kafka.client.ReportRun`, whose
    failures this matches to indexes by ``(key, value)``, exactly where that content is
    unique in the chunk. Where identical messages both failed and succeeded, all of them
    are failed as possibly delivered: they go to the outbox, and the ones the broker had
    in fact confirmed become duplicates with known ids, never losses.
    """

    __slots__ = ("_lock", "_settled", "batch", "deadline", "finished", "link", "report")

    def __init__(self, link: ProducerLink, batch: Batch, report: BatchReport) -> None:
        self.link = link
        self.batch = batch
        self.report = report
        self.deadline = float("inf")
        self.finished = False
        #: Indexes already reported (failed before librdkafka took them, or settled
        #: with their chunk); under _lock.
        self._settled: set[int] = set()
        self._lock = threading.Lock()

    def fail_local(self, index: int, error: MsgsafeError) -> None:
        """Message ``index`` never reached librdkafka: report it failed now."""
        with self._lock:
            if self.finished or index in self._settled:
                return
            self._settled.add(index)
        report_failed(self.report, index, error)

    def chunk(self, start: int, stop: int) -> ReportRun:
        """The delivery callable of messages ``start`` to ``stop - 1``."""
        return ReportRun(self.chunk_done, start, stop)

    def fail(self, chunk: ReportRun, index: int, error: MsgsafeError) -> None:
        """Message ``index`` of ``chunk`` never reached librdkafka: report it failed now,
        and count it (no delivery report will come for it)."""
        self.fail_local(index, error)
        chunk.skip()

    def chunk_done(self, chunk: ReportRun) -> None:
        """Every message of ``chunk`` has a report: settle the ones not settled yet."""
        with self._lock:
            if self.finished:
                return
            indexes = [i for i in range(chunk.start, chunk.stop) if i not in self._settled]
            self._settled.update(indexes)
            if len(self._settled) == len(self.batch):
                self.finished = True
        failures = chunk.failures
        if not failures:
            self._confirm(len(indexes))
            return
        failed = self._attribute(indexes, failures)
        self._confirm(len(indexes) - len(failed))
        for index, error in failed.items():
            report_failed(self.report, index, error)

    def _attribute(
        self,
        indexes: list[int],
        failures: list[tuple[KafkaError, bytes | None, bytes | None]],
    ) -> dict[int, MsgsafeError]:
        """Match failed reports to message indexes by (key, value); see the class."""
        link = self.link
        batch = self.batch
        keys = batch.keys
        same: dict[tuple[bytes | None, bytes], list[int]] = {}
        for index in indexes:
            key = None if keys is None else keys[index]
            same.setdefault((key, batch.bodies[index]), []).append(index)
        errors: dict[tuple[bytes | None, bytes], list[MsgsafeError]] = {}
        for err, key, value in failures:
            errors.setdefault((key, value or b""), []).append(link.delivery_error(err))
        if any(content not in same for content in errors):
            # A report that matches no message of the chunk: nothing says which failed.
            unknown = ConfirmTimeout(
                "a delivery report matched no message of its chunk", endpoint=link._target
            )
            log.error("kafka: %s; the chunk goes to the outbox", unknown.message)
            return dict.fromkeys(indexes, unknown)
        failed: dict[int, MsgsafeError] = {}
        for content, found in errors.items():
            members = same[content]
            if len(found) >= len(members):
                # Every message with this content failed: each gets an error of them.
                failed.update(zip(members, found, strict=False))
                continue
            # Some of the identical messages were confirmed, some not, and nothing says
            # which: all go to the outbox as possibly delivered.
            ambiguous = ConfirmTimeout(
                f"{len(found)} of {len(members)} identical messages failed "
                f"({type(found[0]).__name__}: {found[0].message}); which ones is unknown",
                endpoint=link._target,
            )
            failed.update(dict.fromkeys(members, ambiguous))
        return failed

    def _confirm(self, count: int) -> None:
        if count:
            report_confirmed(self.report, count)

    def abandon(self, error: MsgsafeError) -> None:
        """End the batch now: every message not settled fails with ``error`` (which must
        say ``maybe_delivered``): nothing says which of them the broker confirmed."""
        with self._lock:
            if self.finished:
                return
            self.finished = True
            rest = [i for i in range(len(self.batch)) if i not in self._settled]
            self._settled.update(rest)
        for index in rest:
            report_failed(self.report, index, error)


class ProducerLink:
    """The client of one transport and the thread that serves its delivery reports.

    Publishers add to :attr:`open` and :attr:`watch` (single messages) or
    :attr:`batches`, serve reports themselves while busy (:meth:`serve`, noting
    :attr:`inline_at`) and read ``client.producer`` afresh for every message: it is
    replaced after a fatal error.
    """

    def __init__(self, url: BrokerUrl, options: KafkaOptions) -> None:
        self._target = url.redacted()
        self._timeout = options.confirm_timeout
        self._closing = False
        #: True while the poll thread serves a replaced producer's last reports.
        self._draining = False
        #: The error that has the producer recreated on the poll thread's next round.
        self.fatal: KafkaError | None = None
        #: Reports in publish order with their deadline: the watchdog's list.
        self.watch: deque[SendReport] = deque()
        #: Reports not settled yet; removing one from here is the right to settle it.
        self.open: set[SendReport] = set()
        #: Batches in publish order: the watchdog's other list.
        self.batches: deque[BatchReports] = deque()
        self._down_warned_at = -_DOWN_WARN_EVERY_S
        #: Until when (time.monotonic()) every broker counts as down: publishes fail at
        #: once with ConnectError instead of waiting for message.timeout.ms.
        self.down_until = 0.0
        #: True until a broker answers, and again from librdkafka's "all brokers down"
        #: until one does: the poll thread looks for one (see _look_for_brokers). From
        #: the start too: a producer made while every broker is down may hear nothing
        #: from librdkafka (nothing produced, no connection tried) and its first
        #: messages wait in the outbox for the answer.
        self.lost = True
        #: True from librdkafka's "all brokers down" until a broker answers (the end of
        #: an outage is logged; the first answer after the start is not).
        self._was_down = False
        #: A topic a publish was refused for while every broker was down: the poll
        #: thread asks for its metadata.
        self.wanted_topic: str | None = None
        self._look_at = 0.0
        #: Who hears that a broker answers again (the producer's checks, its
        #: forwarder); taken while the transport is built, like EndpointList's.
        self._observer = observer_now()
        #: Set by error_cb: the poll thread purges librdkafka's queue (never-sent
        #: messages then fail with ConnectError, nothing was sent).
        self._purge_queue = False
        #: librdkafka's latest connection failure (error messages name the cause).
        self.last_failure = ""
        #: The peer speaks another protocol, or its certificate cannot be verified: every
        #: publish fails with this, for good.
        self.mismatch: ProtocolMismatch | AuthenticationError | None = None
        self._endpoints = [str(e) for e in url.endpoints]
        #: Brokers whose TCP connect failed (refused, timed out): nothing to ask there.
        self._unreachable: set[str] = set()
        self._peers_asked = False
        #: When a publisher last served reports itself (time.monotonic()).
        self.inline_at = 0.0
        #: True while the poll thread waits in librdkafka's poll (see KafkaTransport.hurry).
        self.polling = False
        self._stop = threading.Event()
        #: Producers recreated after a fatal error (for tests and metrics).
        self.recreated = 0
        self.listener: Callable[[KafkaError], object] | None = None  # see listen_errors
        #: Watchdogs of the fast paths over this link (KafkaFastSender.expire), run with
        #: the link's own on the poll thread.
        self.fast_watchdogs: list[Callable[[float], None]] = []
        #: The producer, renewed after a fatal error.
        self.client = KafkaClient(url, options, on_error=self.on_error)
        self._thread = threading.Thread(target=self._run, name="msgsafe-kafka-poll", daemon=True)
        self._thread.start()

    @property
    def target(self) -> str:
        """The redacted URL: the ``endpoint`` of every error."""
        return self._target

    def serve(self, timeout: float) -> None:
        """Serve delivery reports on this thread, blocking at most ``timeout`` seconds."""
        try:
            self.client.producer.poll(timeout)
        except KafkaException as exc:
            self.on_error(exc.args[0])

    def _failed(self, report: SendReport, err: KafkaError) -> None:
        # Runs where reports are served (poll thread, a publisher, close()), for a report
        # already taken out of _open; must never raise into librdkafka.
        call_logged(
            log, PUBLISH_CALLBACK, report.callback, self.delivery_error(err, report.message_id)
        )

    @property
    def down(self) -> bool:
        """True while every broker counts as down (see :attr:`down_until`)."""
        return self.mismatch is not None or time.monotonic() < self.down_until

    def unreachable(self, message_id: str | None = None, topic: str | None = None) -> MsgsafeError:
        """The error of a message never sent because every broker is down (or speaks
        another protocol: :class:`ProtocolMismatch`); ``topic``, the message's, is the
        one the poll thread asks metadata for while they are down."""
        if topic is not None:
            self.wanted_topic = topic
        if self.mismatch is not None:
            return self.mismatch.with_id(message_id) if message_id else self.mismatch
        cause = self.last_failure or "all brokers down"
        return ConnectError(
            f"no broker reachable ({cause})", endpoint=self._target, message_id=message_id
        )

    def produce_error(self, refused: Exception, message_id: str | None = None) -> MsgsafeError:
        """The msgsafe error of a message librdkafka's ``produce()`` refused with
        ``refused`` (a ``KafkaException``: its error, a fatal one having the producer
        renewed; ``TypeError``/``ValueError``: :class:`InvalidMessage`). Not for
        ``BufferError``: a full queue is waited out by the caller."""
        if isinstance(refused, KafkaException):
            err = refused.args[0]
            if err.fatal():
                self.fatal = err
            return self.client.error(err, message_id)
        return InvalidMessage(f"kafka refused the message: {refused}", message_id=message_id)

    def delivery_error(self, err: KafkaError, message_id: str | None = None) -> MsgsafeError:
        """The msgsafe error of a failed delivery report; recreates the producer when its
        own state is what failed."""
        if err.code() == KafkaError._PURGE_QUEUE and not self._closing and self.down:
            # Purged from the local queue while all brokers were down: never sent.
            return self.unreachable(message_id)
        if self._closing and err.code() in _PURGED:
            return ConnectionLost(
                "transport closed before the broker confirmed",
                endpoint=self._target,
                message_id=message_id,
            )
        if err.code() in PRODUCER_STATE and not self._draining and self.fatal is None:
            # NOTE: tansu answers PRODUCER_FENCED after a restart for a producer id it no
            # longer knows; librdkafka keeps using it, so start a fresh producer.
            log.warning("kafka %s: recreating the producer", err.name())
            self.fatal = err
        return self.client.error(err, message_id)

    def on_error(self, err: KafkaError) -> None:
        """librdkafka's ``error_cb`` (and what ``poll`` raises): a fatal error has the
        producer recreated; the rest is logged."""
        if self.listener is not None:
            call_logged(log, "kafka error listener", self.listener, err)
        if err.fatal():
            if self.fatal is not None or self._draining:
                return
            log.error("kafka producer fatal error %s: recreating the producer", err.name())
            self.fatal = err
        elif self._mismatch(err):
            return
        elif err.code() == KafkaError._ALL_BROKERS_DOWN:
            if self.mismatch is None and not self._peers_asked and self._ask_peers():
                return
            # librdkafka repeats this on every reconnect round: warn once a while.
            now = time.monotonic()
            self.down_until = now + _DOWN_HOLD_S
            self.lost = True
            self._was_down = True
            self._purge_queue = True
            if now - self._down_warned_at >= _DOWN_WARN_EVERY_S:
                self._down_warned_at = now
                log.warning("kafka: all brokers down (%s)", self._target)
        else:
            if err.code() == KafkaError._TRANSPORT:
                self.last_failure = err.str()
                failed = _FAILED_IN.search(self.last_failure)
                if failed is not None and failed.group(2) == "CONNECT":
                    self._unreachable.add(failed.group(1))
            log.info("kafka: %s: %s", err.name(), err.str())

    def _mismatch(self, err: KafkaError) -> bool:
        # A reply that is no Kafka frame: the first bytes tell what the peer speaks.
        text = err.str() or ""
        found = _RESPONSE_SIZE.search(text)
        size = int(found.group(1)) if found is not None else None
        refused = certificate_refusal(text)
        error: type[AuthenticationError] = CertificateError
        if err.code() in (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED):
            # NOTE: librdkafka retries wrong SASL credentials on every reconnect, forever.
            error, refused = AuthenticationError, f"the broker refused the SASL login: {text}"
        if refused is not None:
            if self.mismatch is None:
                self.mismatch = error(refused, endpoint=self._target)
                log.error("kafka: %s", self.mismatch)
            self._purge_queue = True
            return True
        if "connecting to a PLAINTEXT broker listener?" in text:
            # NOTE: librdkafka's own guess when a TLS handshake meets a Kafka broker that
            # closes at once: our kafka+ssl:// URL names a plain listener.
            said = f"{_peer.PLAIN_NOT_TLS}: use kafka:// (or the broker's SSL listener)"
        elif size == _AMQP_HEADER:
            said = (
                "this port speaks AMQP (a RabbitMQ or AMQP 1.0 broker): use amqp:// or "
                "amqp10://, or the Kafka listener's port"
            )
        elif size is not None and 0x15000000 <= size < 0x17000000:
            said = f"this port speaks TLS, not Kafka: {_ADVICE['TLS']}"
        else:
            return False
        if self.mismatch is None:
            self.mismatch = ProtocolMismatch(said, endpoint=self._target)
            log.error("kafka: %s", self.mismatch)
        self._purge_queue = True
        return True

    def _ask_peers(self) -> bool:
        """Ask, once, what the bootstrap brokers that took our connection speak.

        NOTE: an AMQP 1.0 broker (ActiveMQ Artemis) closes the connection on our first
        request without a byte of its own, which librdkafka reports only as "all brokers
        down"; the port itself tells what it is (``_peer``). Brokers whose TCP connect
        failed are not asked, so an outage costs nothing here.
        """
        self._peers_asked = True
        tls = str(self.client.settings.get("security.protocol", "")).endswith("SSL")
        spoken = None
        for endpoint in self._endpoints:
            if endpoint in self._unreachable:
                continue
            # NOTE: with TLS, a plain Kafka listener cuts the handshake (librdkafka guesses
            # "PLAINTEXT listener?" only sometimes): ask it Kafka's question in the clear.
            if tls:
                found = _peer.identify_peer(endpoint, header=None, kafka=True)
                spoken = "plain Kafka" if found == "Kafka" else None
            else:
                spoken = _peer.identify_peer(endpoint, header=_peer.AMQP10_HEADER, kafka=False)
            if spoken is None:
                return False
        if spoken is None:
            return False
        said = (
            f"{_peer.PLAIN_NOT_TLS}: use kafka:// (or the broker's SSL listener)"
            if spoken == "plain Kafka"
            else f"this port speaks {spoken}, not Kafka: {_ADVICE[spoken]}"
        )
        self.mismatch = ProtocolMismatch(said, endpoint=self._target)
        log.error("kafka: %s", self.mismatch)
        self._purge_queue = True
        return True

    # --- the poll thread --------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            if time.monotonic() - self.inline_at < _INLINE_GRACE_S:
                # Publishers are serving reports themselves; only the watchdog runs.
                self._stop.wait(_INLINE_GRACE_S)
                if self.fatal is not None:
                    self._recreate()
                if self._purge_queue:
                    self._purge_unsent()
                self._expire(time.monotonic())
                if self.lost:
                    self._look_for_brokers()
                continue
            self.polling = True
            try:
                self.client.producer.poll(_POLL_S)
            except KafkaException as exc:
                # NOTE: confluent-kafka raises a fatal error out of poll() as well as
                # through error_cb.
                self.on_error(exc.args[0])
            except Exception:  # a callback bug must not stop delivery reports
                log.exception("kafka poll failed")
            finally:
                self.polling = False
            if self.fatal is not None:
                self._recreate()
            if self._purge_queue:
                self._purge_unsent()
            self._expire(time.monotonic())
            if self.lost:
                self._look_for_brokers()

    def _look_for_brokers(self) -> None:
        """While every broker is down, ask for a topic's metadata ten times a second
        (each request waits at most a tenth): the first broker to answer ends the hold
        on publishes at once, and the answer is the leaders librdkafka needs.

        Why: left to itself, librdkafka looks for a topic whose leader is gone on its
        one-second topic scan, connecting on one tick and asking on the next; a
        producer's first confirm after an outage waited up to two seconds for those
        ticks (``benchmarks/bench_recovery.py --first-confirms``). The request costs a
        connection attempt, which librdkafka already makes every 50 ms while a message
        waits for a broker."""
        now = time.monotonic()
        if now < self._look_at or self.mismatch is not None or self._closing:
            return
        self._look_at = now + _LOOK_EVERY_S
        try:
            self.client.producer.list_topics(self.wanted_topic, timeout=_LOOK_EVERY_S)
        except KafkaException:
            return  # still down (or the topic's metadata refused): look again later
        except Exception:  # a lookout must not stop the poll thread
            log.debug("kafka: metadata request failed", exc_info=True)
            return
        self.lost = False
        self.down_until = 0.0
        if self._was_down:
            self._was_down = False
            log.info("kafka: a broker answers again (%s)", self._target)
        if self._observer is not None:
            call_logged(log, "connection observer", self._observer.reachable, self._target)

    def _purge_unsent(self) -> None:
        # Messages still in librdkafka's queue were never sent: with every broker down
        # they fail now (ConnectError, to the outbox) instead of at message.timeout.ms.
        self._purge_queue = False
        self.client.purge(in_flight=False)

    def _recreate(self) -> None:
        self.fatal = None
        # Everything the old producer held fails transiently (queued: Refused, in flight:
        # ConnectionLost) and goes to the outbox; the watchdog catches any report that
        # never comes. Its own fatal errors meanwhile are about it: ignored.
        self._draining = True
        try:
            self.client.renew()
        except MsgsafeError:
            log.exception("kafka producer could not be recreated")
            return
        finally:
            self._draining = False
        self.recreated += 1

    def _expire(self, now: float) -> None:
        for watchdog in self.fast_watchdogs:
            watchdog(now)
        batches = self.batches
        while batches:
            reports = batches[0]
            if not reports.finished:
                if reports.deadline > now:
                    break
                reports.abandon(
                    ConfirmTimeout(
                        f"no delivery report within confirm_timeout={self._timeout}s",
                        endpoint=self._target,
                    )
                )
            batches.popleft()
        watch = self.watch
        pending = self.open
        while watch:
            report = watch[0]
            if report in pending:
                if report.deadline > now:
                    return
                try:
                    pending.remove(report)
                except KeyError:
                    pass  # its delivery report came in just now
                else:
                    call_logged(
                        log,
                        PUBLISH_CALLBACK,
                        report.callback,
                        ConfirmTimeout(
                            f"no delivery report within confirm_timeout={self._timeout}s",
                            endpoint=self._target,
                            message_id=report.message_id,
                        ),
                    )
            watch.popleft()

    def close(self, timeout: float | None = None) -> None:
        """Stop the poll thread, wait up to ``timeout`` for outstanding delivery reports,
        then fail the rest with :class:`ConnectionLost` and release the producer. Once."""
        self._stop.set()
        self._thread.join()
        wait = self._timeout if timeout is None else max(0.0, timeout)
        try:
            left = self.client.drain(wait)
        except (KafkaException, RuntimeError):
            log.debug("closing the kafka producer", exc_info=True)
            left = len(self.client)
        self._closing = True
        if left:
            self.client.purge()
        while self.batches:
            self.batches.popleft().abandon(
                ConnectionLost(
                    "transport closed before the broker confirmed", endpoint=self._target
                )
            )
        while self.watch:
            report = self.watch.popleft()
            try:
                self.open.remove(report)
            except KeyError:
                continue
            call_logged(
                log,
                PUBLISH_CALLBACK,
                report.callback,
                ConnectionLost(
                    "transport closed before the broker confirmed",
                    endpoint=self._target,
                    message_id=report.message_id,
                ),
            )
