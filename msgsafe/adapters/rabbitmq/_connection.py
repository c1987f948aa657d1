"""One pika ``SelectConnection`` kept alive across the URL's hosts, on one I/O thread.

:class:`IoThread` runs pika's ``IOLoop`` in a daemon thread; other threads hand it work
with :meth:`IoThread.call` (``add_callback_threadsafe``). :class:`Link` lives on that
thread: it connects to the next endpoint of an :class:`~msgsafe.endpoints.EndpointList`
(jittered backoff, a breaker per endpoint), opens one channel and tells its owner through
callbacks when a channel is ready, lost, or when the broker refuses for good.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

import pika
from pika.adapters.select_connection import IOLoop, SelectConnection
from pika.channel import Channel
from pika.connection import Connection

from msgsafe.adapters.rabbitmq._errors import PROBE_S, describe, open_error
from msgsafe.adapters.rabbitmq.config import RabbitOptions
from msgsafe.endpoints import BrokerUrl, Endpoint, EndpointList
from msgsafe.errors import AuthenticationError, MsgsafeError, ProtocolMismatch
from msgsafe.retry import RetryPolicy

__all__ = ["IoThread", "Link", "connection_parameters"]

log = logging.getLogger("msgsafe.rabbitmq")
#: Connections lost within this many seconds of opening, twice in a row: backoff.
_SERVED_S = 1.0


class IoThread:
    """pika's ``IOLoop`` running in one daemon thread until :meth:`stop`."""

    def __init__(self, name: str) -> None:
        self.loop = IOLoop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._stopped = threading.Event()
        self._stop_requested = False
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop_requested:
                try:
                    self.loop.start()
                except Exception:
                    # NOTE: an exception escaping a pika callback ends IOLoop.start(); a
                    # dead I/O thread would leave every future unresolved, so log it and
                    # run the loop again.
                    log.exception("error in the pika I/O loop; continuing")
        finally:
            self._stopped.set()

    @property
    def alive(self) -> bool:
        return not self._stopped.is_set()

    def in_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def call(self, fn: Callable[[], None]) -> bool:
        """Run ``fn`` on the I/O thread; False when the loop already stopped."""
        if self._stopped.is_set():
            return False
        try:
            self.loop.add_callback_threadsafe(fn)
        except Exception:  # the loop closed between the check and the call
            return False
        return True

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop the loop and join the thread (idempotent)."""
        self._stop_requested = True
        self.call(self.loop.stop)
        if not self.in_thread():
            self._thread.join(timeout)
            if not self._thread.is_alive():
                self.loop.close()


class Link:
    """A connection and one channel, re-established on the next host when lost.

    Only the I/O thread may call its methods. The owner's callbacks:

    - ``on_ready(channel)``: a fresh channel is open (after every (re)connect and after a
      channel the broker closed was reopened);
    - ``on_channel_closed(code, text)``: the broker closed the channel, the connection
      holds (a new channel follows);
    - ``on_lost(exc)``: the connection is gone; ``on_fatal(err)``: an attempt failed with
      a permanent error (bad credentials, unknown vhost); attempts continue with backoff;
    - ``on_blocked(flag)``: ``connection.blocked`` / ``unblocked`` (resource alarm);
    - ``on_closed()``: :meth:`close` finished;
    - ``on_down()``: every endpoint failed its latest attempt (:attr:`all_failed`).
    """

    def __init__(
        self,
        url: BrokerUrl,
        options: RabbitOptions,
        loop: IOLoop,
        *,
        on_ready: Callable[[Channel], None],
        on_lost: Callable[[BaseException | None], None],
        on_fatal: Callable[[MsgsafeError], None],
        on_channel_closed: Callable[[int, str], None],
        on_blocked: Callable[[bool], None],
        on_closed: Callable[[], None],
        on_down: Callable[[], None] | None = None,
    ) -> None:
        self._url = url
        self._options = options
        self._loop = loop
        self._endpoints = EndpointList(
            url.endpoints,
            policy=RetryPolicy(initial=0.2, maximum=min(5.0, options.connect_timeout)),
        )
        self._on_ready = on_ready
        self._on_lost = on_lost
        self._on_fatal = on_fatal
        self._on_channel_closed = on_channel_closed
        self._on_blocked = on_blocked
        self._on_closed = on_closed
        self._on_down = on_down
        self._connection: SelectConnection | None = None
        self._channel: Channel | None = None
        self._endpoint: Endpoint | None = None
        self._closing = False
        self._closed = False
        self._timer: object | None = None
        self.connected = False
        #: Failed attempts since the last good connection (or the start).
        self._failures = 0
        #: The latest failed attempt, in a few words (error messages name the cause).
        self.last_failure = ""
        #: When the current connection opened its channel (time.monotonic()).
        self._served_since = 0.0
        #: The latest connection was lost within _SERVED_S of opening.
        self._lost_quickly = False

    @property
    def all_failed(self) -> bool:
        """True when every endpoint failed its latest attempt and none connected since:
        the cluster is unreachable now, nothing is worth waiting for."""
        return self._failures >= len(self._url.endpoints)

    def _note_failure(self, text: str) -> None:
        # One WARNING per state change (the first failure after a good connection or the
        # start), the repeats at DEBUG: an outage is one line, not one line per retry.
        self._failures += 1
        self.last_failure = text
        log.log(logging.WARNING if self._failures == 1 else logging.DEBUG, "%s", text)
        if self.all_failed and self._on_down is not None:
            self._on_down()

    @property
    def endpoint(self) -> str:
        """The current (or last tried) endpoint, for error context."""
        return str(self._endpoint) if self._endpoint else self._url.redacted()

    @property
    def channel(self) -> Channel | None:
        return self._channel

    def start(self) -> None:
        self._connect()

    def close(self) -> None:
        """Close the connection; ``on_closed`` follows (idempotent)."""
        if self._closing:
            return
        self._closing = True
        if self._timer is not None:
            self._loop.remove_timeout(self._timer)
            self._timer = None
        conn = self._connection
        if conn is not None and conn.is_open:
            try:
                conn.close()
                return
            except Exception as exc:
                log.debug("close: %s", describe(exc))
        if conn is not None and not conn.is_closed and not conn.is_closing:
            # NOTE: pika 1.x trips an internal assertion when close() aborts a connection
            # still in its opening handshake; let the handshake end, then close
            # (_opened / _open_failed see _closing).
            return
        self._finish()

    def _finish(self) -> None:
        if not self._closed:
            self._closed = True
            self._on_closed()

    # --- connecting -----------------------------------------------------------------------

    def _schedule(self, delay: float) -> None:
        if self._closing:
            return
        self._timer = self._loop.call_later(max(0.0, delay), self._connect)

    def _connect(self) -> None:
        self._timer = None
        if self._closing:
            return
        endpoint, wait = self._endpoints.next()
        if wait > 0:
            self._schedule(wait)
            return
        self._endpoint = endpoint
        try:
            params = self._parameters(endpoint)
            self._connection = SelectConnection(
                params,
                on_open_callback=self._opened,
                on_open_error_callback=self._open_failed,
                on_close_callback=self._conn_closed,
                custom_ioloop=self._loop,
            )
        except Exception as exc:
            self._connection = None
            self._endpoints.failed(endpoint)
            self._note_failure(f"cannot connect to {endpoint}: {describe(exc)}")
            self._schedule(0.05)

    def _parameters(self, endpoint: Endpoint) -> pika.ConnectionParameters:
        return connection_parameters(self._url, self._options, endpoint)

    def _open_failed(self, conn: Connection, exc: BaseException | str) -> None:
        if conn is not self._connection:
            return
        self._connection = None
        endpoint = self._endpoint
        err_in = exc if isinstance(exc, BaseException) else RuntimeError(str(exc))
        err = open_error(err_in, str(endpoint), tls=endpoint is not None and endpoint.tls)
        if self._closing:
            self._finish()
            return
        if endpoint is not None:
            self._endpoints.failed(endpoint)
        if isinstance(err, (AuthenticationError, ProtocolMismatch)):
            self._on_fatal(err)  # first: what fails now fails with this error
        self._note_failure(f"connection to {endpoint} failed: {err.message}")
        self._schedule(0.0)

    def _opened(self, conn: Connection) -> None:
        current = self._connection
        if current is None or conn is not current:
            return
        if self._closing:
            current.close()
            return
        self.connected = True
        current.add_on_connection_blocked_callback(self._blocked)
        current.add_on_connection_unblocked_callback(self._unblocked)
        self._open_channel()

    def _open_channel(self) -> None:
        conn = self._connection
        if conn is None or not conn.is_open or self._closing:
            return
        conn.channel(on_open_callback=self._channel_opened)

    def _channel_opened(self, channel: Channel) -> None:
        if self._closing:
            return
        self._channel = channel
        channel.add_on_close_callback(self._channel_closed)
        if self._endpoint is not None:
            self._endpoints.succeeded(self._endpoint)
        log.info("connected to %s", self._endpoint)
        self._served_since = time.monotonic()
        self._failures = 0
        self._on_ready(channel)

    def _channel_closed(self, channel: Channel, reason: BaseException) -> None:
        if channel is not self._channel:
            return
        self._channel = None
        conn = self._connection
        if self._closing or conn is None or not conn.is_open:
            return  # the connection close handler does the rest
        code = getattr(reason, "reply_code", 0)
        text = getattr(reason, "reply_text", str(reason))
        log.warning("channel on %s closed: %s %s", self._endpoint, code, text)
        self._on_channel_closed(int(code), str(text))
        self._open_channel()

    def _conn_closed(self, conn: Connection, reason: BaseException) -> None:
        if conn is not self._connection:
            return
        self._connection = None
        self._channel = None
        self.connected = False
        if self._closing:
            self._finish()
            return
        quick = time.monotonic() - self._served_since < _SERVED_S
        if self._endpoint is not None and quick and self._lost_quickly:
            # A second connection in a row lost soon after it opened counts as a failed
            # attempt (backoff: a flapping broker is not hammered). Otherwise the next
            # try goes out at once, and a caller sending meanwhile learns within a TCP
            # connect whether the broker is still there (refused: stored).
            self._endpoints.failed(self._endpoint)
        self._lost_quickly = quick
        log.warning("connection to %s lost: %s", self._endpoint, describe(reason))
        self._on_lost(reason)
        self._schedule(0.0)

    def _blocked(self, _conn: Connection, _frame: Any) -> None:
        log.warning("broker blocked the connection on %s (resource alarm)", self._endpoint)
        self._on_blocked(True)

    def _unblocked(self, _conn: Connection, _frame: Any) -> None:
        self._on_blocked(False)


def connection_parameters(
    url: BrokerUrl, opts: RabbitOptions, endpoint: Endpoint
) -> pika.ConnectionParameters:
    """pika's parameters for one attempt at ``endpoint``: credentials, virtual host, TLS
    (verified unless ``tls_verify`` is off), timeouts. The destination checks
    (:mod:`msgsafe.adapters.rabbitmq.check`) connect with the same, so a check reaches the broker
    exactly when the transport does."""
    user = url.username or "guest"
    password = url.password.reveal() if url.password else "guest"
    ssl_options = None
    if endpoint.tls:
        context = ssl.create_default_context(cafile=opts.tls_ca_file)
        if opts.tls_cert_file:
            context.load_cert_chain(opts.tls_cert_file, opts.tls_key_file)
        if not opts.tls_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        ssl_options = pika.SSLOptions(context, server_hostname=endpoint.host)
    return pika.ConnectionParameters(
        host=endpoint.host,
        port=endpoint.port,
        virtual_host=url.path or "/",
        credentials=pika.PlainCredentials(user, password, erase_on_connect=False),
        heartbeat=opts.heartbeat,
        blocked_connection_timeout=opts.blocked_timeout,
        connection_attempts=1,
        retry_delay=0,
        socket_timeout=opts.connect_timeout,
        # The handshake leaves room for asking a silent peer what it speaks (see
        # identify_peer) within connect_timeout.
        stack_timeout=max(PROBE_S, opts.connect_timeout - PROBE_S),
        frame_max=opts.frame_max,
        ssl_options=ssl_options,
        client_properties={"connection_name": opts.client_name},
    )
