"""Celery's task publishing through msgsafe: ``install(app)``.

::

    app = Celery("proj", broker="amqp://guest:guest@rabbit1,rabbit2//")
    msgsafe.compat.celery.install(app)

After ``install(app)`` every task message the app publishes — ``delay()``,
``apply_async()``, ``send_task()``, canvas (chains, groups, chords), retries, tasks
sent from inside a worker that imports the app — goes through a :class:`msgsafe.Producer`:
publisher confirms, a bounded wait (``send_timeout``), fail-over across the broker
hosts, and the durable outbox when the broker refuses the message or cannot be reached
(a stopped node, a memory alarm): the call returns once the message is confirmed *or
stored*, and the outbox forwards it later. Nothing else changes: results, events,
the worker and its consumer are Celery's own.

The message is the one kombu would publish (:mod:`._celery_message`: kombu's own
``Producer.publish`` builds the body, headers and properties), so an unchanged Celery
worker runs it, also when it arrives from the outbox hours later. Its msgsafe id is
the task id (the AMQP ``message_id`` is set to it), so a message sent twice after a
lost confirm is two deliveries of one task id.

Options come from ``install(app, ...)`` keywords, else from the app setting
``msgsafe_producer`` (a dict), else msgsafe's defaults: ``url`` (default: the app's
``broker_write_url`` / ``broker_url`` as an ``amqp://`` host list), and every keyword
:class:`msgsafe.Producer` takes (``outbox``, ``send_timeout``, ``connect_timeout``,
``confirm_timeout``, ``require``, ...), and ``fast_path`` (default True: while RabbitMQ
confirms, a task is published and confirmed on the caller's thread, see
:mod:`msgsafe.compat._celery_fast`; False: always through the Producer; its former name
``direct`` is still accepted, with a ``DeprecationWarning``).
``docs/migration.md`` ("Celery") lists what changes.

Declarations. Celery declares a task's queue (its exchange, the queue, the binding) each
time it publishes; so does the wrapper, and the stored message carries the same
declarations (:mod:`msgsafe.adapters.rabbitmq.declarations`): a task stored while the broker
was away is published later, by whichever process forwards it, after its queue was
declared as Celery would have declared it.

Forwarding. Each process that publishes tasks forwards its own outbox in the background.
A worker process of the app (``celery worker`` importing a module that calls
``install(app)``) opens its producer when it is ready, which forwards what waits in the
app's outbox (with the default outbox: the files of publishers that exited too); a
process that holds the outbox file itself keeps forwarding it. ``msgsafe outbox forward
STORE --url URL`` does the same as a sidecar.

Guarantees. ``install()`` checks the app's task queues once, in the background, with the
checks ``msgsafe doctor`` runs (a queue not declared yet counts as what Celery will
declare): one WARNING per queue that is not replicated (a classic queue), naming the fix,
and one more when it is below ``require``.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from msgsafe.errors import MissingExtra

try:
    from celery.signals import worker_ready as _worker_ready  # type: ignore[import-untyped]
    from kombu import common as _kombu_common
    from kombu.exceptions import OperationalError
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingExtra("compat", "celery") from exc

from msgsafe.adapters.rabbitmq import RabbitOptions
from msgsafe.adapters.rabbitmq.check import inspect_destination
from msgsafe.adapters.rabbitmq.config import QUEUE_TYPES
from msgsafe.adapters.rabbitmq.declarations import DECLARE_HEADER, Declaration, encode
from msgsafe.checks.gate import DestinationGate
from msgsafe.compat._celery_fast import FastTaskPublisher
from msgsafe.compat._celery_message import (
    TaskMessage,
    broker_url,
    declarations_of,
    encode_properties,
    kombu_message,
    task_id_of,
)
from msgsafe.compat._pika_config import destination_of
from msgsafe.endpoints import parse_url
from msgsafe.errors import (
    ClosedError,
    MsgsafeError,
    OutboxError,
    OutboxLocked,
    SendTimeout,
    TransientError,
    Unroutable,
    UnsafeDestination,
)
from msgsafe.fastpath import store_refused
from msgsafe.message import AMQP_PROPERTIES_HEADER, Envelope, Guarantee, Receipt, Status
from msgsafe.producer import Producer

#: kombu's cached declare, called untyped.
maybe_declare: Callable[..., Any] = _kombu_common.maybe_declare

__all__ = ["SETTING", "CeleryPublisher", "install", "installed"]

log = logging.getLogger("msgsafe.compat.celery")

#: The app setting holding the defaults of ``install(app)`` (a dict).
SETTING = "msgsafe_producer"

#: Attribute of the app's ``amqp`` object holding its publisher (one per app).
_MARK = "_msgsafe_publisher"

#: Seconds a declare may take to reach the broker before it is given up for now.
_DECLARE_CONNECT_S = 2.0
#: msgsafe's default confirm wait, when the options name none.
_DEFAULT_CONFIRM_S = RabbitOptions().confirm_timeout
#: During an outage, how often the forwarder's progress is read (one outbox query).
_OUTAGE_POLL_S = 0.1


class _Declarer:
    """Declares the queues and exchanges Celery names with each task (``declare=``), once
    each, on a short-lived kombu connection, as kombu's ``maybe_declare`` would.

    After a declare failed (no broker answered) it skips declaring until msgsafe confirms a
    message again, so an outage costs no connection attempt per task: those messages go
    to the outbox, and one the broker later returns as unroutable stays there too."""

    def __init__(self, connect: Callable[[], Any]) -> None:
        self._connect = connect
        self._done: set[Any] = set()
        self._skipping = False
        self._lock = threading.Lock()

    def declare(self, entities: Any) -> None:
        if not entities or self._skipping:
            return
        with self._lock:
            todo = [e for e in entities if e not in self._done]
            if not todo or self._skipping:
                return
            conn = self._connect()
            try:
                conn.ensure_connection(max_retries=0, timeout=_DECLARE_CONNECT_S)
                for entity in todo:
                    channel = conn.channel()
                    try:
                        maybe_declare(entity, channel)
                    except conn.channel_errors as exc:
                        # NOTE: RabbitMQ closes the channel when the entity exists with
                        # other arguments (PRECONDITION_FAILED): it exists, publish anyway.
                        log.warning("declaring %s: %r; publishing to it as it is", entity, exc)
                    finally:
                        if channel.is_open:
                            channel.close()
                    self._done.add(entity)
            except Exception as exc:  # any other failure: msgsafe's path decides
                log.info("declaring %s failed (%r); publishing without it", todo, exc)
                self._skipping = True
            finally:
                conn.release()

    def resume(self) -> None:
        self._skipping = False


class CeleryPublisher:
    """One app's task publishing through msgsafe (what :func:`install` returns).

    Thread-safe. Each process has its own :class:`msgsafe.Producer`, made on its first
    task (a forked worker child makes its own)."""

    def __init__(self, app: Any, options: Mapping[str, Any]) -> None:
        self._app = app
        opts = dict(options)
        self._url: str = opts.pop("url", None) or broker_url(app.connection_for_write())
        fast_path = bool(opts.pop("fast_path", True))
        if "direct" in opts:
            warnings.warn(
                "install(direct=...) is now install(fast_path=...)", DeprecationWarning, 3
            )
            fast_path = bool(opts.pop("direct"))
        self._check = bool(opts.pop("check_queues", True))
        self._options = opts
        self._lock = threading.Lock()
        self._producer: Producer | None = None
        self._pid = 0
        self._declarer = _Declarer(self._declare_connection)
        #: Queues are declared on the app's broker only when msgsafe publishes there.
        self._declares = self._url.partition("://")[0] in ("amqp", "amqps")
        #: The fast path: tasks go on the caller's thread while the broker confirms them
        #: (RabbitMQ only).
        self._fast_enabled = fast_path and self._declares
        self._fast: FastTaskPublisher | None = None
        self._original: Callable[..., Any] | None = None
        #: The forwarder's ``drained`` count when an outage began; None: no outage.
        self._outage_drained: int | None = None
        self._outage_polled = 0.0
        #: kombu's declarations per ``declare=`` list (see _declarations).
        self._declared_by: dict[tuple[Any, ...], str | None] = {}

    # --- the producer ----------------------------------------------------------------

    @property
    def producer(self) -> Producer:
        """This process's msgsafe producer (made on first use)."""
        producer = self._producer
        if producer is not None and self._pid == os.getpid():
            return producer
        with self._lock:
            if self._producer is None or self._pid != os.getpid():
                # NOTE: after a fork the parent's producer has no threads here: a new one.
                self._producer = Producer(self._url, **self._options)
                self._pid = os.getpid()
                self._declarer = _Declarer(self._declare_connection)
                self._fast = None
                if self._fast_enabled:
                    self._fast = FastTaskPublisher(
                        self._url,
                        self._producer,
                        blocked_timeout=_fast_blocked_s(self._options),
                    )
            return self._producer

    @property
    def fast_sends(self) -> int:
        """How many tasks of this process the broker confirmed on the caller's thread,
        over the fast path (the others went through :attr:`producer`)."""
        fast = self._fast
        return 0 if fast is None else fast.path.accepted

    #: The former name of :attr:`fast_sends`.
    direct_sends = fast_sends

    def _declare_connection(self) -> Any:
        conn = self._app.connection_for_write()
        conn.connect_timeout = min(float(conn.connect_timeout or _DECLARE_CONNECT_S), 2.0)
        return conn

    def close(self, timeout: float | None = 30.0) -> None:
        """Close this process's producer (what waits in the outbox stays there)."""
        with self._lock:
            producer, self._producer = self._producer, None
            fast, self._fast = self._fast, None
        if producer is not None and self._pid == os.getpid():
            if fast is not None:
                fast.close()
            producer.close(timeout)

    # --- publishing ------------------------------------------------------------------

    def publish(
        self,
        body: Any,
        *,
        exchange: Any = None,
        routing_key: str | None = None,
        headers: Mapping[str, Any] | None = None,
        declare: Any = None,
        **options: Any,
    ) -> Receipt:
        """Publish one task message (the arguments of kombu's ``Producer.publish``) and
        return once it is confirmed or stored.

        Raises ``kombu.exceptions.OperationalError`` when it is neither (no outbox, the
        outbox full, ``send_timeout`` passed); msgsafe's ``InvalidMessage`` or
        ``PermanentError`` for a message the broker will never take."""
        message = kombu_message(
            body, exchange=exchange, routing_key=routing_key, headers=headers, options=options
        )
        producer = self.producer
        envelope = _envelope(message, self._declarations(declare))
        if self._in_outage(producer):
            return self._store(producer, envelope)
        if self._declares:
            self._declarer.declare(declare)
        fast = self._fast
        if fast is not None and (confirmed := fast.publish(message, envelope)) is not None:
            return confirmed  # the broker confirmed it, on this thread, as Celery's own
        future = producer.send_envelope(envelope)
        try:
            receipt = future.result(self._send_timeout())
        except Unroutable as exc:
            receipt = self._park(producer, envelope, message, exc)
        except (TransientError, OutboxError, ClosedError) as exc:
            raise OperationalError(f"task {envelope.message_id} not published: {exc}") from exc
        except TimeoutError:
            raise OperationalError(
                f"task {envelope.message_id} not confirmed or stored in time"
            ) from SendTimeout("send_timeout passed", message_id=envelope.message_id)
        if receipt.status is Status.CONFIRMED:
            self._declarer.resume()
            if fast is not None:
                fast.path.confirmed_safe()
        elif self._forwarding:
            self._outage_drained = producer.stats().drained
            self._outage_polled = time.monotonic()
        return receipt

    def _declarations(self, declare: Any) -> str | None:
        """What kombu would declare for ``declare``, as the envelope's header (recorded
        once per entity list); None: nothing."""
        if not declare or not self._declares:
            return None
        try:
            key = tuple(declare)
            if key in self._declared_by:
                return self._declared_by[key]
        except TypeError:  # an entity that does not hash
            key = None
        made = declarations_of(declare)
        found = encode(made) if made else None
        if key is not None:
            if len(self._declared_by) >= 256:
                self._declared_by.clear()
            self._declared_by[key] = found
        return found

    @property
    def _forwarding(self) -> bool:
        return bool(self._options.get("forward", True)) and self._options.get("outbox") is not False

    def _in_outage(self, producer: Producer) -> bool:
        """Whether an outage goes on: a task was stored, and the forwarder has delivered
        nothing since (the broker still does not take messages).

        NOTE: while no broker answers, each of msgsafe's attempts may wait out a
        connection timeout per host (its send, its destination check); Celery's caller
        would pay that again every few seconds. The forwarder keeps trying in the
        background; the caller's tasks go straight to the outbox until it gets through.
        """
        drained = self._outage_drained
        if drained is None:
            return False
        now = time.monotonic()
        if now - self._outage_polled < _OUTAGE_POLL_S:
            return True
        self._outage_polled = now
        stats = producer.stats()
        if stats.drained > drained or stats.outbox_depth == 0:
            self._outage_drained = None
            return False
        return True

    def _store(self, producer: Producer, envelope: Envelope) -> Receipt:
        outbox = producer.outbox
        if outbox is None:  # pragma: no cover - no outage without an outbox
            raise OperationalError(f"task {envelope.message_id} not published: no outbox")
        if (error := store_refused(outbox, [envelope])) is not None:
            raise OperationalError(f"task {envelope.message_id} not stored: {error}") from error
        return Receipt(envelope.message_id, Status.STORED, envelope.destination)

    def _send_timeout(self) -> float:
        return float(self._options.get("send_timeout", 30.0))

    def _park(
        self, producer: Producer, envelope: Envelope, message: TaskMessage, exc: Unroutable
    ) -> Receipt:
        """NOTE: kombu publishes without ``mandatory`` and RabbitMQ drops a message no
        queue is bound for; msgsafe publishes ``mandatory``, hears of it, and keeps the
        task in the outbox (forwarded again, quarantined while it stays unroutable)."""
        outbox = producer.outbox
        if outbox is None:
            raise exc
        if (error := store_refused(outbox, [envelope])) is not None:
            raise error
        log.warning(
            "task %s to %r/%r is unroutable (no queue bound); kept in the outbox",
            envelope.message_id,
            message.exchange,
            message.routing_key,
        )
        return Receipt(envelope.message_id, Status.STORED, envelope.destination)

    # --- the app's queues and its worker ------------------------------------------------

    def check_queues(self) -> dict[str, Guarantee | MsgsafeError]:
        """Check each of the app's task queues as the producer and ``msgsafe doctor``
        check a destination, and log what falls short (see the module docstring): a
        WARNING per queue not replicated, one more when it is below ``require``. Returns
        each queue's guarantee, or the error that stood for it."""
        if not self._declares:
            return {}
        url = parse_url(self._url)
        fields = set(RabbitOptions.__dataclass_fields__)
        adapter = {k: v for k, v in self._options.items() if k in fields and k != "declare"}
        require = str(self._options.get("require", "durable"))
        results: dict[str, Guarantee | MsgsafeError] = {}
        for name, queue in dict(self._app.amqp.queues).items():
            arguments = queue.queue_arguments or {}
            kind = str(arguments.get("x-queue-type", "classic"))
            # NOTE: Celery declares the queue when it publishes: a queue not declared yet
            # counts as what it will be (the check's declare=).
            options = RabbitOptions(**{**adapter, "declare": kind if kind in QUEUE_TYPES else None})
            gate = DestinationGate(
                functools.partial(inspect_destination, url, opts=options),
                require=require,
                endpoint=url.redacted(),
            )
            try:
                results[name] = gate.admit(name)
            except UnsafeDestination as exc:
                results[name] = exc
                log.warning(
                    "Celery task queue %r is below require=%r: %s (msgsafe publishes its "
                    "tasks to the exchange, which it cannot check: they are not refused)",
                    name,
                    require,
                    exc,
                )
            except MsgsafeError as exc:
                results[name] = exc
                log.info("Celery task queue %r not checked: %s", name, exc)
        return results

    def _check_in_background(self) -> None:
        if self._check and self._declares:
            threading.Thread(
                target=self._checked_quietly, name="msgsafe-celery-check", daemon=True
            ).start()

    def _checked_quietly(self) -> None:
        try:
            self.check_queues()
        except Exception:  # a check's failure must not reach the application
            log.exception("checking the Celery task queues failed")

    def worker_ready(self, sender: Any = None, **_: Any) -> None:
        """Celery's ``worker_ready`` signal: a worker of this app opens its producer,
        whose forwarder forwards what waits in the app's outbox (on a thread: opening
        the outbox must not hold up the worker)."""
        if getattr(sender, "app", None) is not self._app or not self._forwarding:
            return
        threading.Thread(
            target=self._open_forwarder, name="msgsafe-celery-forward", daemon=True
        ).start()

    def _open_forwarder(self) -> None:
        try:
            producer = self.producer
        except OutboxLocked as exc:
            log.info("the app's outbox is held by another process, which forwards it: %s", exc)
            return
        except MsgsafeError as exc:
            log.warning("the worker cannot forward the app's outbox: %s", exc)
            return
        log.info("forwarding the app's outbox from the worker (%d waiting)", producer.pending())

    # --- the hook in Celery -----------------------------------------------------------

    def wrap(self, send_task_message: Callable[..., Any]) -> Callable[..., Any]:
        """Celery's ``app.amqp.send_task_message`` with its ``producer.publish`` of the
        task message routed here; its events and everything else unchanged."""
        self._original = send_task_message
        publisher = self

        def send_task_message_through_msgsafe(
            producer: Any, name: str, message: Any, **kwargs: Any
        ) -> Any:
            return send_task_message(_TaskProducer(publisher, producer), name, message, **kwargs)

        send_task_message_through_msgsafe.__wrapped__ = send_task_message  # type: ignore[attr-defined]
        return send_task_message_through_msgsafe

    def uninstall(self) -> None:
        """Give the app its own publishing back and close this process's producer."""
        amqp = self._app.amqp
        if getattr(amqp, _MARK, None) is self:
            delattr(amqp, _MARK)
            if self._original is not None:
                amqp.send_task_message = self._original
        _worker_ready.disconnect(self.worker_ready)
        self.close()

    def __repr__(self) -> str:
        return f"CeleryPublisher(app={self._app.main!r}, url={_redacted(self._url)!r})"


def _fast_blocked_s(options: Mapping[str, Any]) -> float:
    """How long a fast publish may wait on a blocked connection: half the confirm wait,
    between 0.5 and 2 s (msgsafe's path then has the rest to store the task)."""
    confirm = float(options.get("confirm_timeout", _DEFAULT_CONFIRM_S))
    return max(0.5, min(2.0, confirm / 2))


def _redacted(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.split("@", 1)[1]
    return f"{scheme}{sep}{rest}"


def envelope_of(message: TaskMessage, declarations: tuple[Declaration, ...] = ()) -> Envelope:
    """The envelope of one task message: its properties carried whole, its id the task id,
    and the ``declarations`` Celery makes when it publishes it (the queue, its exchange
    and binding): whoever publishes the envelope, now or from the outbox later, declares
    them first (:mod:`msgsafe.adapters.rabbitmq.declarations`)."""
    return _envelope(message, encode(declarations) if declarations else None)


def _envelope(message: TaskMessage, declare_header: str | None) -> Envelope:
    headers = {AMQP_PROPERTIES_HEADER: encode_properties(message.properties)}
    if declare_header is not None:
        headers[DECLARE_HEADER] = declare_header
    return Envelope.build(
        destination_of(message.exchange, message.routing_key),
        message.body,
        headers=headers,
        message_id=task_id_of(message),
    )


class _TaskProducer:
    """The producer Celery's ``send_task_message`` sees: its first ``publish`` (the task
    message) goes through msgsafe; any later one (the ``task-sent`` event) and every
    other attribute are the real kombu producer's."""

    def __init__(self, publisher: CeleryPublisher, producer: Any) -> None:
        self._publisher = publisher
        self._producer = producer
        self._task_sent = False

    def publish(self, body: Any, **kwargs: Any) -> Any:
        if self._task_sent:
            return self._producer.publish(body, **kwargs)
        self._task_sent = True
        return self._publisher.publish(body, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)


def install(app: Any, **options: Any) -> CeleryPublisher:
    """Route ``app``'s task publishing through msgsafe; returns the publisher.

    ``options`` (else the app setting ``msgsafe_producer``): ``url`` and the keywords of
    :class:`msgsafe.Producer`; ``check_queues=False`` skips the background check of the
    task queues. Installing again replaces the earlier publisher. Raises
    ``ConfigurationError`` when the app's broker is not RabbitMQ."""
    settings = app.conf.get(SETTING) or {}
    merged = {**dict(settings), **options}
    amqp = app.amqp
    earlier = getattr(amqp, _MARK, None)
    if isinstance(earlier, CeleryPublisher):
        earlier.uninstall()
    publisher = CeleryPublisher(app, merged)
    # NOTE: ``send_task_message`` is a cached property of Celery's AMQP object: an
    # attribute set on the instance takes its place.
    amqp.send_task_message = publisher.wrap(amqp.send_task_message)
    setattr(amqp, _MARK, publisher)
    _worker_ready.connect(publisher.worker_ready, weak=False)
    publisher._check_in_background()
    return publisher


def installed(app: Any) -> CeleryPublisher | None:
    """The publisher :func:`install` gave ``app``, or None."""
    found = getattr(app.amqp, _MARK, None)
    return found if isinstance(found, CeleryPublisher) else None
