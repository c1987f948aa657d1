"""A TCP fault proxy for tests: put it between a client and a broker, then break the wire.

``FaultProxy`` listens on a local port and pipes every accepted connection to one
upstream ``host:port``. It runs an asyncio event loop in its own daemon thread; every
public method is thread-safe, callable from ordinary synchronous test code, and returns
only once the fault is in effect on the proxy's loop.

Faults (each replaces the previous *mode*; latency, bandwidth and cut combine with it):

- :meth:`FaultProxy.blackhole` — connections stay open, bytes (and FINs) vanish in both
  directions. Clients hang until their own heartbeat or timeout notices. With
  ``direction`` ``upstream`` or ``downstream`` only that way is cut (a one-way
  partition): the other keeps flowing, and new connections are still made.
- :meth:`FaultProxy.stall` — bytes are held, not lost: like a partition that TCP survives;
  on :meth:`~FaultProxy.heal` the held bytes flow on and streams stay intact.
- :meth:`FaultProxy.reset` — RST every current connection (``SO_LINGER`` 0) and every new
  one while set.
- :meth:`FaultProxy.refuse` — close the listener: new connections are refused by the
  kernel; current ones are untouched.
- :meth:`FaultProxy.latency` — delay each chunk by ``seconds`` in one or both directions.
- :meth:`FaultProxy.bandwidth` — cap the throughput of each direction (a token bucket
  shared by all connections, as on one congested link).
- :meth:`FaultProxy.cut_mid_frame` — forward ``after_bytes`` more bytes from upstream,
  then close the connection, so the client sees a frame cut short.
- :meth:`FaultProxy.heal` — back to a transparent pipe. Connections that lost bytes while
  black-holed are reset, because their byte streams have a gap; new connections work.

Usage::

    with FaultProxy("127.0.0.1", broker_port) as proxy:
        client = connect("127.0.0.1", proxy.port)
        proxy.blackhole()
        ...
        proxy.heal()
        print(proxy.stats())

One proxy per broker is cheap (one idle thread each); :class:`FaultProxies` holds one per
broker of a cluster and gives the host list for a URL. ``upstream_socket`` makes the
sockets of upstream connections (a factory taking family and type, e.g. one that opens
them inside a network namespace) while the listener stays in the caller's namespace: a
loopback door into a test network.

The pieces each connection is shaped with are in :mod:`msgsafe.testing._proxy_conn`.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import TypeVar

from msgsafe.testing._proxy_conn import (
    DOWN,
    UP,
    Conn,
    Direction,
    Mode,
    TokenBucket,
    directions,
    rst,
)

__all__ = ["Direction", "FaultProxies", "FaultProxy", "ProxyStats", "SocketFactory"]

#: Makes the socket of an upstream connection from its family and type.
SocketFactory = Callable[[int, int], socket.socket]

_T = TypeVar("_T")
_CHUNK = 65536
_QUEUE_CHUNKS = 16  # per direction and connection: at most ~1 MiB held in the proxy
_CONTROL_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class ProxyStats:
    """Counters since the proxy started. Bytes count what was written onwards."""

    bytes_upstream: int
    bytes_downstream: int
    dropped_upstream: int
    dropped_downstream: int
    connections_accepted: int
    connections_active: int
    connections_reset: int
    upstream_connect_failures: int


class FaultProxy:
    """A TCP proxy to ``upstream_host:upstream_port`` that injects faults on demand.

    Contract:

    - Starts listening in ``__init__``; :attr:`port` is known when it returns.
    - All methods are thread-safe; a fault method returns when the fault is in effect
      for current and new connections.
    - :meth:`close` (also on leaving the ``with`` block) is idempotent, closes the
      listener and every connection, and joins the thread.
    """

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        *,
        upstream_socket: SocketFactory | None = None,
        connect_timeout: float = 5.0,
    ) -> None:
        if not 0 < upstream_port < 65536:
            raise ValueError(f"upstream_port out of range: {upstream_port}")
        if not 0 <= listen_port < 65536:
            raise ValueError(f"listen_port out of range: {listen_port}")
        if connect_timeout <= 0:
            raise ValueError("connect_timeout must be > 0")
        self._upstream = (upstream_host, upstream_port)
        self._listen_host = listen_host
        self._listen_port = listen_port
        self._upstream_socket = upstream_socket
        self._connect_timeout = connect_timeout
        self._mode = Mode.PASS
        #: Per direction: bytes vanish (a one-way black hole; both: Mode.BLACKHOLE).
        self._holed = [False, False]
        self._latency = [0.0, 0.0]
        self._buckets: list[TokenBucket | None] = [None, None]
        self._cut_after: int | None = None
        self._server: asyncio.Server | None = None
        self._conns: set[Conn] = set()
        self._accepting: set[asyncio.Task[None]] = set()
        self._gate = [asyncio.Event(), asyncio.Event()]  # set: bytes may flow
        for gate in self._gate:
            gate.set()
        self._bytes = [0, 0]
        self._dropped = [0, 0]
        self._accepted = 0
        self._reset_count = 0
        self._connect_failures = 0
        self._closed = False
        self._close_lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._run, name=f"faultproxy->{upstream_host}:{upstream_port}", daemon=True
        )
        self._thread.start()
        try:
            self._call(self._listen)
        except BaseException:
            self.close()
            raise

    # -- public, thread-safe -------------------------------------------------------------

    @property
    def port(self) -> int:
        """The port the proxy listens on (stays the same across refuse/heal)."""
        return self._listen_port

    @property
    def address(self) -> tuple[str, int]:
        """``(listen_host, port)`` — where clients connect."""
        return (self._listen_host, self._listen_port)

    @property
    def upstream(self) -> tuple[str, int]:
        """``(host, port)`` the proxy forwards to."""
        return self._upstream

    def blackhole(self, *, direction: Direction = "both") -> None:
        """Keep connections open but drop every byte and FIN in ``direction`` (``both``:
        each way, and new connections are not even dialled upstream; ``upstream`` or
        ``downstream``: a one-way partition, the other direction flows on)."""
        if direction == "both":
            self._call(self._set_mode, Mode.BLACKHOLE)
        else:
            self._call(self._set_hole, direction)

    def stall(self) -> None:
        """Hold every byte (TCP back-pressure) until :meth:`heal`; nothing is lost."""
        self._call(self._set_mode, Mode.STALL)

    def reset(self) -> None:
        """RST every current connection, and every new one until :meth:`heal`."""
        self._call(self._set_mode, Mode.RESET)

    def refuse(self) -> None:
        """Close the listener so new connections are refused; current ones continue."""
        self._call(self._stop_listening)

    def latency(self, seconds: float, *, direction: Direction = "both") -> None:
        """Delay every chunk by ``seconds`` in ``direction`` (``both``: each way)."""
        if seconds < 0:
            raise ValueError("latency must be >= 0")
        self._call(self._set_latency, seconds, direction)

    def bandwidth(self, bytes_per_second: float, *, direction: Direction = "both") -> None:
        """Cap each direction's throughput to ``bytes_per_second`` (shared by connections)."""
        if bytes_per_second <= 0:
            raise ValueError("bytes_per_second must be > 0")
        self._call(self._set_bandwidth, bytes_per_second, direction)

    def cut_mid_frame(self, after_bytes: int) -> None:
        """Close each connection after ``after_bytes`` more bytes from upstream.

        Applies to current connections and to new ones until :meth:`heal`. The client
        sees a clean close (FIN) in the middle of whatever the server was sending;
        the server sees a reset.
        """
        if after_bytes < 0:
            raise ValueError("after_bytes must be >= 0")
        self._call(self._set_cut, after_bytes)

    def heal(self) -> None:
        """Back to a transparent pipe: no delay, no cap, listener open, held bytes flow."""
        self._call(self._heal)

    def stats(self) -> ProxyStats:
        """A snapshot of the counters."""
        return self._call(self._stats)

    def close(self) -> None:
        """Close the listener and every connection, stop the loop, join the thread."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                fut = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
                fut.result(_CONTROL_TIMEOUT)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(_CONTROL_TIMEOUT)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        host, port = self._upstream
        return (
            f"FaultProxy({self._listen_host}:{self._listen_port} -> {host}:{port}, "
            f"mode={self._mode.value})"
        )

    # -- loop thread ---------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def _call(self, fn: Callable[..., Coroutine[object, object, _T]], *args: object) -> _T:
        if self._closed:
            raise RuntimeError("FaultProxy is closed")
        future = asyncio.run_coroutine_threadsafe(fn(*args), self._loop)
        return future.result(_CONTROL_TIMEOUT)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(
            self._accept,
            self._listen_host,
            self._listen_port,
            reuse_address=True,
            limit=_CHUNK,
        )
        self._listen_port = self._server.sockets[0].getsockname()[1]

    async def _stop_listening(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _set_mode(self, mode: Mode) -> None:
        self._mode = mode
        for gate in self._gate:
            if mode is Mode.STALL:
                gate.clear()
            else:
                gate.set()
        if mode is Mode.RESET:
            for conn in list(self._conns):
                self._reset_conn(conn)

    async def _set_hole(self, direction: Direction) -> None:
        for d in directions(direction):
            self._holed[d] = True

    async def _set_latency(self, seconds: float, direction: Direction) -> None:
        for d in directions(direction):
            self._latency[d] = seconds

    async def _set_bandwidth(self, rate: float, direction: Direction) -> None:
        for d in directions(direction):
            self._buckets[d] = TokenBucket(rate)

    async def _set_cut(self, after_bytes: int) -> None:
        self._cut_after = after_bytes
        for conn in self._conns:
            conn.cut_budget = after_bytes

    async def _heal(self) -> None:
        await self._set_mode(Mode.PASS)
        self._holed = [False, False]
        self._latency = [0.0, 0.0]
        self._buckets = [None, None]
        self._cut_after = None
        for conn in list(self._conns):
            conn.cut_budget = None
            if conn.gapped:
                self._reset_conn(conn)
        if self._server is None:
            await self._listen()

    async def _stats(self) -> ProxyStats:
        return ProxyStats(
            bytes_upstream=self._bytes[UP],
            bytes_downstream=self._bytes[DOWN],
            dropped_upstream=self._dropped[UP],
            dropped_downstream=self._dropped[DOWN],
            connections_accepted=self._accepted,
            connections_active=len(self._conns),
            connections_reset=self._reset_count,
            upstream_connect_failures=self._connect_failures,
        )

    async def _shutdown(self) -> None:
        await self._stop_listening()
        for task in list(self._accepting):
            task.cancel()
        await asyncio.gather(*self._accepting, return_exceptions=True)
        conns = list(self._conns)
        for conn in conns:
            self._close_conn(conn)
        await asyncio.gather(*(t for c in conns for t in c.tasks), return_exceptions=True)
        # Let the transports finish closing their sockets before the loop stops.
        await asyncio.gather(
            *(w.wait_closed() for c in conns for w in c.writers()), return_exceptions=True
        )

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Tracked so that close() can cancel a dial still in progress.
        task = asyncio.current_task()
        if task is not None:
            self._accepting.add(task)
        try:
            await self._accept_conn(reader, writer)
        finally:
            if task is not None:
                self._accepting.discard(task)

    async def _accept_conn(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._accepted += 1
        if self._mode is Mode.RESET:
            self._reset_count += 1
            rst(writer)
            return
        conn = Conn(reader, writer)
        conn.cut_budget = self._cut_after
        self._conns.add(conn)
        if self._mode is Mode.BLACKHOLE:
            # A black hole lets nothing through, not even our dial: the client holds an
            # open connection to nowhere, which heal() resets.
            conn.gapped = True
        else:
            try:
                conn.up_r, conn.up_w = await self._dial()
            except OSError:
                self._connect_failures += 1
                self._reset_conn(conn)
                return
        if conn.closed:
            # Reset (or closed) while we were dialling: drop the fresh upstream too.
            if conn.up_w is not None:
                rst(conn.up_w)
            return
        conn.tasks = [
            asyncio.ensure_future(self._direction(conn, UP)),
            asyncio.ensure_future(self._direction(conn, DOWN)),
        ]

    async def _dial(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        host, port = self._upstream
        if self._upstream_socket is None:
            return await asyncio.wait_for(
                asyncio.open_connection(host, port, limit=_CHUNK), self._connect_timeout
            )
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = self._upstream_socket(family, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            await asyncio.wait_for(
                asyncio.get_running_loop().sock_connect(sock, (host, port)),
                self._connect_timeout,
            )
        except BaseException:
            sock.close()
            raise
        return await asyncio.open_connection(sock=sock, limit=_CHUNK)

    async def _direction(self, conn: Conn, d: int) -> None:
        """Read one direction into a bounded queue; a second task writes it onwards."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(_QUEUE_CHUNKS)
        writer_task = asyncio.ensure_future(self._write_side(conn, d, queue))
        source = conn.client_r if d == UP else conn.up_r
        try:
            if source is None:
                # Black-holed from the start: nothing will ever come from upstream.
                await asyncio.Future()
                return
            while True:
                data = await source.read(_CHUNK)
                await queue.put((time.monotonic() + self._latency[d], data))
                if not data:
                    break
            await writer_task
        except (OSError, asyncio.IncompleteReadError):
            self._reset_conn(conn)
        finally:
            if not writer_task.done():
                writer_task.cancel()
                with contextlib.suppress(BaseException):
                    await writer_task

    async def _write_side(
        self, conn: Conn, d: int, queue: asyncio.Queue[tuple[float, bytes]]
    ) -> None:
        sink = conn.up_w if d == UP else conn.client_w
        try:
            while True:
                due, data = await queue.get()
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                await self._gate[d].wait()
                if self._mode is Mode.BLACKHOLE or self._holed[d] or sink is None:
                    conn.gapped = True
                    self._dropped[d] += len(data)
                    continue
                if not data:
                    self._eof(conn, d)
                    return
                await self._write(conn, d, sink, data)
                if conn.closed:
                    return
        except OSError:
            self._reset_conn(conn)

    async def _write(self, conn: Conn, d: int, sink: asyncio.StreamWriter, data: bytes) -> None:
        while data:
            piece = data
            bucket = self._buckets[d]
            if bucket is not None:
                piece = data[: bucket.chunk]
                wait = bucket.delay_for(len(piece))
                if wait > 0:
                    await asyncio.sleep(wait)
            cut = d == DOWN and conn.cut_budget is not None and len(piece) >= conn.cut_budget
            if cut and conn.cut_budget is not None:
                piece = piece[: conn.cut_budget]
            if self._mode is Mode.BLACKHOLE or self._holed[d]:
                conn.gapped = True
                self._dropped[d] += len(data)
                return
            sink.write(piece)
            await sink.drain()
            self._bytes[d] += len(piece)
            if cut:
                self._cut_conn(conn)
                return
            if d == DOWN and conn.cut_budget is not None:
                conn.cut_budget -= len(piece)
            data = data[len(piece) :]

    def _eof(self, conn: Conn, d: int) -> None:
        """Pass a FIN onwards; close the connection when both directions ended."""
        conn.eof[d] = True
        sink = conn.up_w if d == UP else conn.client_w
        if sink is not None and sink.can_write_eof() and not sink.is_closing():
            with contextlib.suppress(OSError):
                sink.write_eof()
        if all(conn.eof):
            self._close_conn(conn)

    def _cut_conn(self, conn: Conn) -> None:
        # NOTE: the client gets a FIN mid-frame (as when a broker process exits); the
        # upstream gets a reset so the broker drops its half at once.
        if conn.up_w is not None:
            rst(conn.up_w)
        conn.client_w.close()
        self._forget(conn)

    def _reset_conn(self, conn: Conn) -> None:
        if conn.closed:
            return
        self._reset_count += 1
        for writer in conn.writers():
            rst(writer)
        self._forget(conn)

    def _close_conn(self, conn: Conn) -> None:
        if conn.closed:
            return
        for writer in conn.writers():
            writer.close()
        self._forget(conn)

    def _forget(self, conn: Conn) -> None:
        conn.closed = True
        self._conns.discard(conn)
        current = asyncio.current_task()
        for task in conn.tasks:
            if task is not current and not task.done():
                task.cancel()


class FaultProxies:
    """One :class:`FaultProxy` per broker of a cluster, driven together or one by one.

    ``proxies[i]`` is the proxy of the ``i``-th upstream; :attr:`hosts` is the
    ``host:port,host:port`` list to put in a URL so that clients only ever reach the
    brokers through the proxies. Methods without an index apply to every proxy ("all
    brokers down", "heal everything").
    """

    def __init__(
        self,
        upstreams: Iterable[tuple[str, int]],
        listen_host: str = "127.0.0.1",
        *,
        connect_timeout: float = 5.0,
    ) -> None:
        self._proxies: list[FaultProxy] = []
        try:
            for host, port in upstreams:
                self._proxies.append(
                    FaultProxy(host, port, listen_host, connect_timeout=connect_timeout)
                )
        except BaseException:
            self.close()
            raise
        if not self._proxies:
            raise ValueError("FaultProxies needs at least one upstream")

    @property
    def hosts(self) -> str:
        """``host:port`` of every proxy, comma separated, in upstream order."""
        return ",".join(f"{host}:{port}" for host, port in (p.address for p in self._proxies))

    def __getitem__(self, i: int) -> FaultProxy:
        return self._proxies[i]

    def __len__(self) -> int:
        return len(self._proxies)

    def __iter__(self) -> Iterator[FaultProxy]:
        return iter(self._proxies)

    def blackhole(self) -> None:
        """Black-hole every proxy."""
        self._each(FaultProxy.blackhole)

    def reset(self) -> None:
        """Reset every proxy's connections (and new ones until heal)."""
        self._each(FaultProxy.reset)

    def refuse(self) -> None:
        """Refuse new connections on every proxy."""
        self._each(FaultProxy.refuse)

    def heal(self) -> None:
        """Heal every proxy."""
        self._each(FaultProxy.heal)

    def close(self) -> None:
        """Close every proxy (idempotent)."""
        self._each(FaultProxy.close)

    def _each(self, action: Callable[[FaultProxy], None]) -> None:
        for proxy in self._proxies:
            action(proxy)

    def __enter__(self) -> FaultProxies:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
