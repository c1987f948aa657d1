"""msgsafe's ``BlockingChannel``: pika's channel with ``basic_publish`` through msgsafe.

It *is* a ``pika.adapters.blocking_connection.BlockingChannel`` (``isinstance`` holds) and
overrides every public name of it: a blocking publish is confirmed on the caller's thread
through the real connection while that works (the fast path, :mod:`msgsafe.compat.pika._fast`) and
goes through msgsafe's producer otherwise, as do pipelined publishes and transactions;
everything else (declares, binds, ``basic_qos``, consuming, ``consume()``) runs unchanged
on a real pika channel of the real connection to the same hosts.
``tests/unit/compat/test_pika.py`` pins that no public name is left inherited.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from msgsafe.errors import MissingExtra

try:
    from pika import exceptions as pe
    from pika import frame, spec
    from pika.adapters import blocking_connection as _blocking
    from pika.spec import BasicProperties
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingExtra("rabbitmq", "pika") from exc

from msgsafe.compat._common import ClosesOnExit
from msgsafe.compat._pika_config import destination_of, publish_error, returned_message
from msgsafe.compat.pika._fast import FastPublisher, fast_properties
from msgsafe.errors import ClosedError, InvalidMessage, MsgsafeError
from msgsafe.fastpath import store_refused
from msgsafe.message import AMQP_PROPERTIES_HEADER, Envelope, Receipt, Status, new_message_id

if TYPE_CHECKING:
    from msgsafe.compat.pika._connection import BlockingConnection

__all__ = ["BlockingChannel", "CLOSE_WAIT_S"]

log = logging.getLogger("msgsafe.compat.pika")

#: Seconds close() waits for confirms of messages in flight (pipelined mode).
CLOSE_WAIT_S = 30.0

#: The reply text RabbitMQ closes a channel with on tx_commit without tx_select.
_NOT_TX = "PRECONDITION_FAILED - channel is not transactional"

#: What a return callback receives after the channel: method, properties, body.
ReturnCallback = Callable[[Any, spec.Basic.Return, BasicProperties, bytes], None]


@dataclass(frozen=True, slots=True)
class _Failure:
    error: BaseException
    message: Any  #: a pika ReturnedMessage


@dataclass(frozen=True, slots=True)
class _Held:
    """A message on its way: sent at once, or at ``tx_commit`` inside ``tx_select``."""

    envelope: Envelope
    returned: Any  #: the pika ReturnedMessage an exception or return callback shows
    mandatory: bool


def encode_properties(props: BasicProperties) -> str:
    """``props`` as AMQP encodes them (pika's own encoder), base64: every field and
    header value type survives msgsafe's text headers and the outbox unchanged.

    Raises pika's ``UnsupportedAMQPFieldException`` for a value AMQP cannot carry, as
    pika's ``basic_publish`` does.
    """
    return base64.b64encode(b"".join(props.encode())).decode("ascii")


class BlockingChannel(ClosesOnExit, _blocking.BlockingChannel):  # type: ignore[misc]
    """``pika``'s ``BlockingChannel`` whose ``basic_publish`` goes through msgsafe.

    ``basic_publish`` blocks until the message is confirmed by the broker or stored in
    the outbox, and raises ``UnroutableError`` / ``NackError`` for that message, as pika
    does on a channel in confirm mode; with the connection's ``pipelined=True`` it
    returns at once and failures surface from a later call (see the module of
    :class:`~msgsafe.compat.pika.BlockingConnection`).
    """

    def __init__(self, connection: BlockingConnection, channel_number: int) -> None:
        # NOTE: pika's __init__ needs a channel of pika's own I/O loop; this class
        # overrides every public name instead, so none of pika's state is used.
        self._conn = connection
        self._number = channel_number
        self._lock = threading.Lock()
        self._failures: list[_Failure] = []
        self._returns: list[Any] = []
        self._return_callbacks: list[ReturnCallback] = []
        self._held: list[_Held] | None = None
        self._confirming = False
        self._closed = False
        self._real: Any = None  # the pika channel for everything but publishing
        # A lazy connection may have no broker yet: the fast path waits for a confirm.
        self._fast = FastPublisher(connection, resting=connection._real is None)

    # --- state -------------------------------------------------------------------------

    @property
    def channel_number(self) -> int:
        return self._number

    @property
    def is_open(self) -> bool:
        return not self._closed and self._conn.is_open

    @property
    def is_closed(self) -> bool:
        return not self.is_open

    @property
    def connection(self) -> BlockingConnection:
        return self._conn

    @property
    def consumer_tags(self) -> list[str]:
        return [] if self._real is None else list(self._real.consumer_tags)

    def _check_open(self) -> None:
        if not self.is_open:
            raise pe.ChannelWrongStateError("Channel is closed.")

    # --- publishing --------------------------------------------------------------------

    def confirm_delivery(self) -> None:
        """Confirm mode: ``basic_publish`` raises ``UnroutableError`` for an unroutable
        message (without it, return callbacks get it, as in pika). msgsafe confirms
        every message either way."""
        self._check_open()
        self._confirming = True

    def basic_publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes | str,
        properties: BasicProperties | None = None,
        mandatory: bool = False,
    ) -> None:
        """Publish persistent and ``mandatory``; return once the broker confirmed the
        message or the outbox stored it (a message no broker can take now: no exception).

        Raises ``UnroutableError`` (confirm mode, this message in ``.messages``) /
        ``NackError`` (``.messages`` empty, as pika's) when it failed for good;
        ``TypeError`` for a bad body and pika's ``UnsupportedAMQPFieldException`` for a
        property AMQP cannot carry. With
        ``pipelined=True`` it returns at once and raises the failures of *earlier*
        messages instead.
        """
        if self._closed or self._conn._closed:  # _check_open, inlined: runs per message
            raise pe.ChannelWrongStateError("Channel is closed.")
        pipelined = self._conn.pipelined
        if pipelined:
            self._raise_failures()
        if type(body) is not bytes:
            if isinstance(body, str):
                body = body.encode("utf-8")
            if not isinstance(body, (bytes, bytearray, memoryview)):
                raise TypeError(f"body must be bytes or str, not {type(body).__name__}")
            body = bytes(body)
        props = properties if properties is not None else BasicProperties()
        message_id = props.message_id or new_message_id()
        blocking = not pipelined and self._held is None
        if blocking and self._fast.publish(
            exchange, routing_key, body, fast_properties(props, message_id, time.time())
        ):
            return  # the broker confirmed it, on this thread, as pika's own publish
        held = _Held(
            Envelope.build(
                destination_of(exchange, routing_key),
                body,
                headers={AMQP_PROPERTIES_HEADER: encode_properties(props)},
                message_id=message_id,
            ),
            returned_message(exchange, routing_key, props, body),
            mandatory,
        )
        if self._held is not None:
            self._held.append(held)
            return
        future = self._send(held)
        if pipelined:
            future.add_done_callback(lambda f: self._settled(held.returned, f))
            return
        self._await(future, held)
        if future.exception() is None and future.result().status is Status.CONFIRMED:
            self._fast.path.confirmed_safe()

    def _send(self, held: _Held) -> Future[Receipt]:
        try:
            return self._conn.producer.send_envelope(held.envelope)
        except InvalidMessage:
            raise
        except ClosedError as exc:
            raise pe.ChannelWrongStateError("Channel is closed.") from exc
        except MsgsafeError as exc:
            raise publish_error(exc, [held.returned], self._conn.virtual_host) from exc

    def _await(self, future: Future[Receipt], held: _Held) -> None:
        """Block until ``future`` settles; raise pika's exception for its failure."""
        exc = future.exception()
        if exc is None:
            return
        returned = held.returned
        error = publish_error(exc, [returned], self._conn.virtual_host)
        if isinstance(error, pe.ChannelClosedByBroker):
            self._mark_closed()
        # NOTE: RabbitMQ drops an unroutable message published without mandatory and
        # pika never hears of it; the wrapper keeps it in the outbox instead (msgsafe
        # publishes mandatory, and the broker returned it).
        if isinstance(error, pe.UnroutableError) and not held.mandatory and self._park(held):
            return
        if isinstance(error, pe.NackError):
            # NOTE: pika's NackError lists only messages the broker also returned: none
            # for a plain nack.
            error = pe.NackError([])
        if isinstance(error, pe.UnroutableError):
            with self._lock:
                self._returns.append(returned)
            if not self._confirming:
                # NOTE: pika without confirm mode never learns of it; the broker's
                # basic.return goes to the return callbacks only.
                log.warning(
                    "unroutable message to %r/%r returned by the broker",
                    returned.method.exchange,
                    returned.method.routing_key,
                )
                return
        raise error from exc

    def _park(self, held: _Held) -> bool:
        """Put ``held`` in the outbox (the forwarder tries it again, and quarantines it
        while it stays unroutable); False when there is no outbox."""
        outbox = self._conn.producer.outbox
        if outbox is None:
            return False
        if (error := store_refused(outbox, [held.envelope])) is not None:
            raise error
        log.warning(
            "unroutable message %s to %r/%r (published without mandatory) kept in the outbox",
            held.envelope.message_id,
            held.returned.method.exchange,
            held.returned.method.routing_key,
        )
        return True

    def _settled(self, returned: Any, future: Future[Receipt]) -> None:
        # Runs on msgsafe's I/O or outbox thread: record, never raise here.
        exc = future.exception()
        if exc is not None:
            with self._lock:
                self._failures.append(_Failure(exc, returned))

    def _has_failures(self) -> bool:
        with self._lock:
            return bool(self._failures)

    def _raise_failures(self) -> None:
        """Raise one pika exception for the failures of one kind recorded so far (the
        others stay for the next call)."""
        with self._lock:
            if not self._failures:
                return
            kind = type(publish_error(self._failures[0].error, []))
            taken = [f for f in self._failures if type(publish_error(f.error, [])) is kind]
            self._failures = [f for f in self._failures if f not in taken]
        error = publish_error(taken[0].error, [f.message for f in taken])
        raise error from taken[0].error

    def wait_for_confirms(self, timeout: float | None = None) -> bool:
        """msgsafe addition: wait until every message published so far is confirmed or
        stored, then raise failures (pipelined mode). Returns False if ``timeout`` passed
        first."""
        done = self._conn.producer.flush(timeout)
        self._raise_failures()
        return done

    def add_on_return_callback(self, callback: ReturnCallback) -> None:
        """``callback(channel, method, properties, body)`` for each message the broker
        returned as unroutable, called from ``process_data_events()`` / ``sleep()`` as
        pika does."""
        self._return_callbacks.append(callback)

    def _dispatch_returns(self) -> None:
        with self._lock:
            returns, self._returns = self._returns, []
        for returned in returns:
            for callback in list(self._return_callbacks):
                callback(self, returned.method, returned.properties, returned.body)

    # --- transactions ------------------------------------------------------------------

    def tx_select(self) -> frame.Method[spec.Tx.SelectOk]:
        """Hold what ``basic_publish`` gets until ``tx_commit`` (dropped by ``tx_rollback``)."""
        self._check_open()
        self._held = []
        return frame.Method(self._number, spec.Tx.SelectOk())

    def tx_commit(self) -> frame.Method[spec.Tx.CommitOk]:
        """Publish every held message and wait until each is confirmed or stored; raises
        ``NackError`` listing the ones that failed for good."""
        self._check_open()
        if self._held is None:
            raise pe.ChannelClosedByBroker(406, _NOT_TX)
        held, self._held = self._held, []
        futures = [(self._send(h), h) for h in held]
        failed = [(f.exception(), h) for f, h in futures if f.exception() is not None]
        if failed:
            exc, _ = failed[0]
            raise publish_error(exc, [h.returned for _, h in failed]) from exc  # type: ignore[arg-type]
        return frame.Method(self._number, spec.Tx.CommitOk())

    def tx_rollback(self) -> frame.Method[spec.Tx.RollbackOk]:
        """Drop the messages held since the last commit."""
        self._check_open()
        if self._held is None:
            raise pe.ChannelClosedByBroker(406, _NOT_TX)
        self._held = []
        return frame.Method(self._number, spec.Tx.RollbackOk())

    # --- everything else, on a real pika channel -----------------------------------------

    def _real_channel(self) -> Any:
        if self._real is None or not self._real.is_open:
            self._real = self._conn._real_connection().channel()
        return self._real

    def _passed(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``method`` of a real pika channel; an idempotent declare is retried once on a
        new connection if the old one died (the host list lets pika move to a live node)."""
        self._check_open()
        for attempt in (1, 2):
            try:
                return getattr(self._real_channel(), method)(*args, **kwargs)
            except (pe.AMQPConnectionError, pe.ConnectionWrongStateError):
                self._conn._drop_real()
                self._real = None
                if attempt == 2 or method not in _IDEMPOTENT:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _own(self, callback: Callable[..., None]) -> Callable[..., None]:
        # pika passes its own channel first: legacy callbacks get this one instead.
        return lambda _ch, *rest: callback(self, *rest)

    def queue_declare(self, *args: Any, **kwargs: Any) -> Any:
        """``pika``'s ``queue_declare`` (same arguments and result)."""
        return self._passed("queue_declare", *args, **kwargs)

    def queue_bind(self, *args: Any, **kwargs: Any) -> Any:
        return self._passed("queue_bind", *args, **kwargs)

    def queue_unbind(self, *args: Any, **kwargs: Any) -> Any:
        return self._passed("queue_unbind", *args, **kwargs)

    def queue_purge(self, *args: Any, **kwargs: Any) -> Any:
        return self._passed("queue_purge", *args, **kwargs)

    def queue_delete(self, *args: Any, **kwargs: Any) -> Any:
        return self._passed("queue_delete", *args, **kwargs)

    def exchange_declare(self, *args: Any, **kwargs: Any) -> Any:
        return self._passed("exchange_declare", *args, **kwargs)

    def exchange_delete(self, *args: Any, **kwargs: Any) -> Any:
        return self._passed("exchange_delete", *args, **kwargs)

    def exchange_bind(self, *args: Any, **kwargs: Any) -> Any:
        return self._passed("exchange_bind", *args, **kwargs)

    def exchange_unbind(self, *args: Any, **kwargs: Any) -> Any:
        return self._passed("exchange_unbind", *args, **kwargs)

    def basic_qos(self, *args: Any, **kwargs: Any) -> None:
        self._passed("basic_qos", *args, **kwargs)

    def basic_consume(
        self, queue: str, on_message_callback: Callable[..., None], *args: Any, **kwargs: Any
    ) -> str:
        return str(
            self._passed("basic_consume", queue, self._own(on_message_callback), *args, **kwargs)
        )

    def basic_cancel(self, *args: Any, **kwargs: Any) -> Any:
        return self._passed("basic_cancel", *args, **kwargs)

    def basic_get(self, *args: Any, **kwargs: Any) -> Any:
        return self._passed("basic_get", *args, **kwargs)

    def basic_ack(self, *args: Any, **kwargs: Any) -> None:
        self._passed("basic_ack", *args, **kwargs)

    def basic_nack(self, *args: Any, **kwargs: Any) -> None:
        self._passed("basic_nack", *args, **kwargs)

    def basic_reject(self, *args: Any, **kwargs: Any) -> None:
        self._passed("basic_reject", *args, **kwargs)

    def basic_recover(self, *args: Any, **kwargs: Any) -> None:
        self._passed("basic_recover", *args, **kwargs)

    def add_on_cancel_callback(self, *args: Any, **kwargs: Any) -> None:
        self._passed("add_on_cancel_callback", *args, **kwargs)

    def consume(self, *args: Any, **kwargs: Any) -> Any:
        """``pika``'s ``consume()`` generator on the real channel."""
        return self._passed("consume", *args, **kwargs)

    def cancel(self) -> int:
        return 0 if self._real is None else int(self._passed("cancel"))

    def start_consuming(self) -> None:
        self._passed("start_consuming")

    def stop_consuming(self, *args: Any, **kwargs: Any) -> None:
        self._passed("stop_consuming", *args, **kwargs)

    def get_waiting_message_count(self) -> int:
        return 0 if self._real is None else int(self._passed("get_waiting_message_count"))

    def flow(self, active: bool) -> bool:
        return bool(self._passed("flow", active))

    # --- closing -----------------------------------------------------------------------

    def close(self, reply_code: int = 0, reply_text: str = "Normal shutdown") -> None:
        """Wait for the confirms in flight, close the real channel, then raise failures;
        ``ChannelWrongStateError`` when already closed, as pika."""
        self._check_open()
        if self._conn.pipelined:
            self._conn.producer.flush(CLOSE_WAIT_S)
        self._closed = True
        self._fast.close()
        real, self._real = self._real, None
        if real is not None and real.is_open:
            real.close(reply_code, reply_text)
        self._raise_failures()

    def _mark_closed(self) -> None:
        self._closed = True
        self._fast.close()
        self._real = None

    def __int__(self) -> int:
        return self._number

    def __repr__(self) -> str:
        return f"<msgsafe.compat.pika.BlockingChannel number={self._number}>"


#: Operations safe to repeat on a new connection after the old one died mid-call.
_IDEMPOTENT = frozenset(
    {
        "queue_declare",
        "queue_bind",
        "queue_unbind",
        "queue_purge",
        "queue_delete",
        "exchange_declare",
        "exchange_delete",
        "exchange_bind",
        "exchange_unbind",
    }
)
