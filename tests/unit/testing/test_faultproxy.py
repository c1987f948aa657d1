"""FaultProxy against a small echo server on loopback: each fault does what it says.

Timing assertions measure with generous bounds (this machine is shared); nothing here
sleeps to synchronise — conditions are polled with deadlines.
"""

from __future__ import annotations

import errno
import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from msgsafe.testing.faultproxy import FaultProxies, FaultProxy, ProxyStats
from tests.support.waiting import wait_until


class _EchoHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server = self.server
        assert isinstance(server, _EchoServer)
        with server.lock:
            server.open += 1
        try:
            while data := self.request.recv(65536):
                self.request.sendall(data)
        except OSError:
            pass
        finally:
            with server.lock:
                server.open -= 1


class _EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _EchoHandler)
        self.lock = threading.Lock()
        self.open = 0

    @property
    def port(self) -> int:
        return int(self.server_address[1])


@pytest.fixture
def echo() -> Iterator[_EchoServer]:
    server = _EchoServer()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.fixture
def proxy(echo: _EchoServer) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", echo.port) as p:
        yield p


def connect(p: FaultProxy, timeout: float = 5.0) -> socket.socket:
    sock = socket.create_connection(p.address, timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"EOF after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def roundtrip(sock: socket.socket, payload: bytes = b"ping") -> bytes:
    sock.sendall(payload)
    return recv_exactly(sock, len(payload))


def still_open(sock: socket.socket) -> bool:
    """True when the peer neither closed nor reset and nothing is waiting to be read."""
    saved = sock.gettimeout()
    sock.setblocking(False)
    try:
        sock.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        sock.settimeout(saved)
    return False


def test_transparent_pipe_and_counters(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        assert roundtrip(sock, b"x" * 1000) == b"x" * 1000
        wait_until(lambda: proxy.stats().bytes_downstream == 1000, 5, "1000 bytes down")
    stats = proxy.stats()
    assert isinstance(stats, ProxyStats)
    assert stats.bytes_upstream == 1000
    assert stats.connections_accepted == 1
    wait_until(lambda: proxy.stats().connections_active == 0, 5, "connection closed")
    print(stats)


def test_half_close_is_forwarded(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        sock.sendall(b"last words")
        sock.shutdown(socket.SHUT_WR)
        assert recv_exactly(sock, 10) == b"last words"
        assert sock.recv(1) == b""  # the echo server saw our FIN and closed


def test_blackhole_hangs_reads_but_keeps_connections_open(
    proxy: FaultProxy, echo: _EchoServer
) -> None:
    with connect(proxy) as sock:
        assert roundtrip(sock) == b"ping"
        proxy.blackhole()
        sock.settimeout(0.5)
        sock.sendall(b"lost")
        with pytest.raises(TimeoutError):
            sock.recv(10)
        assert still_open(sock)
        assert proxy.stats().connections_active == 1
        assert echo.open == 1  # the server side is open too, and heard nothing
        wait_until(lambda: proxy.stats().dropped_upstream == 4, 5, "4 dropped bytes")

        # A new connection opens, but nothing comes back.
        with connect(proxy, timeout=0.5) as fresh:
            fresh.sendall(b"hello")
            with pytest.raises(TimeoutError):
                fresh.recv(10)
            assert still_open(fresh)

            proxy.heal()
            # Both streams have a gap, so heal resets them rather than resume corrupt.
            for broken in (sock, fresh):
                broken.settimeout(5)
                with pytest.raises((ConnectionResetError, ConnectionError)):
                    roundtrip(broken)

    with connect(proxy) as sock:
        assert roundtrip(sock) == b"ping"


def test_blackhole_swallows_the_servers_fin(proxy: FaultProxy, echo: _EchoServer) -> None:
    with connect(proxy) as sock:
        assert roundtrip(sock) == b"ping"
        proxy.blackhole()
        sock.shutdown(socket.SHUT_WR)  # the FIN vanishes: the server never closes
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(1)
        assert echo.open == 1


def test_a_one_way_blackhole_cuts_one_direction_and_the_other_flows(
    proxy: FaultProxy, echo: _EchoServer
) -> None:
    with connect(proxy) as sock:
        assert roundtrip(sock) == b"ping"
        proxy.blackhole(direction="downstream")
        sock.settimeout(0.5)
        sock.sendall(b"heard")
        # The server got it and answered (upstream flows); the answer vanished.
        wait_until(lambda: proxy.stats().dropped_downstream == 5, 5, "5 answer bytes dropped")
        assert proxy.stats().bytes_upstream == 4 + 5 and proxy.stats().dropped_upstream == 0
        with pytest.raises(TimeoutError):
            sock.recv(10)
        assert still_open(sock)
        # A new connection is still dialled upstream (a one-way cut, not a dead node).
        with connect(proxy, timeout=0.5) as fresh:
            wait_until(lambda: echo.open == 2, 5, "the new connection reaches the server")
            fresh.sendall(b"x")
            with pytest.raises(TimeoutError):
                fresh.recv(1)
        proxy.heal()
        sock.settimeout(5)
        with pytest.raises((ConnectionResetError, ConnectionError)):
            roundtrip(sock)  # its stream has a gap: reset, not resumed corrupt

    with connect(proxy) as sock:
        proxy.blackhole(direction="upstream")
        sock.settimeout(0.5)
        sock.sendall(b"lost")
        wait_until(lambda: proxy.stats().dropped_upstream == 4, 5, "4 bytes dropped upstream")
        with pytest.raises(TimeoutError):
            sock.recv(10)
        proxy.heal()
    with connect(proxy) as sock:
        assert roundtrip(sock) == b"ping"


def test_reset_sends_rst_to_current_and_new_connections(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        assert roundtrip(sock) == b"ping"
        proxy.reset()
        with pytest.raises(ConnectionResetError) as info:
            sock.recv(10)
        assert info.value.errno == errno.ECONNRESET

    # The RST may even beat connect() back to the caller on loopback.
    with pytest.raises(ConnectionResetError), connect(proxy) as fresh:
        roundtrip(fresh)
    assert proxy.stats().connections_reset >= 2

    proxy.heal()
    with connect(proxy) as sock:
        assert roundtrip(sock) == b"ping"


def test_refuse_closes_the_listener_until_heal(proxy: FaultProxy) -> None:
    with connect(proxy) as old:
        assert roundtrip(old) == b"ping"
        proxy.refuse()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(proxy.address, timeout=2).close()
        assert roundtrip(old) == b"ping"  # existing connections are untouched
    port = proxy.port
    proxy.heal()
    assert proxy.port == port
    with connect(proxy) as sock:
        assert roundtrip(sock) == b"ping"


def test_latency_delays_each_direction(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        roundtrip(sock)
        proxy.latency(0.2)
        start = time.monotonic()
        roundtrip(sock)
        both = time.monotonic() - start

        proxy.latency(0.3, direction="upstream")  # downstream keeps its 0.2
        proxy.latency(0.0, direction="downstream")
        start = time.monotonic()
        roundtrip(sock)
        upstream_only = time.monotonic() - start

        proxy.heal()
        start = time.monotonic()
        roundtrip(sock)
        healed = time.monotonic() - start
    print(f"round trip: latency 0.2 each way {both:.3f}s, 0.3 up only {upstream_only:.3f}s, "
          f"healed {healed:.3f}s")  # fmt: skip
    assert 0.4 <= both < 2.0
    assert 0.3 <= upstream_only < 1.5
    assert healed < 0.2


def test_latency_keeps_throughput(proxy: FaultProxy) -> None:
    # Delay is not a rate limit: many chunks in flight share the same 0.2 s.
    payload = b"z" * 200_000
    with connect(proxy) as sock:
        proxy.latency(0.2)
        start = time.monotonic()
        sender = threading.Thread(target=sock.sendall, args=(payload,))
        sender.start()
        assert recv_exactly(sock, len(payload)) == payload
        elapsed = time.monotonic() - start
        sender.join()
    print(f"200 kB through 0.2 s latency each way: {elapsed:.3f}s")
    assert 0.4 <= elapsed < 3.0


def test_bandwidth_caps_throughput(proxy: FaultProxy) -> None:
    rate = 50_000
    payload = b"b" * 100_000
    with connect(proxy) as sock:
        proxy.bandwidth(rate, direction="downstream")
        start = time.monotonic()
        sender = threading.Thread(target=sock.sendall, args=(payload,))
        sender.start()
        assert recv_exactly(sock, len(payload)) == payload
        elapsed = time.monotonic() - start
        sender.join()
        measured = len(payload) / elapsed
        print(f"bandwidth cap {rate} B/s: measured {measured:.0f} B/s over {elapsed:.2f}s")
        assert 0.5 * rate <= measured <= 1.25 * rate

        proxy.heal()
        start = time.monotonic()
        roundtrip(sock, payload)
        assert time.monotonic() - start < 1.0


def test_cut_mid_frame_closes_after_n_bytes(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        assert roundtrip(sock) == b"ping"
        proxy.cut_mid_frame(300)
        sock.sendall(b"f" * 1000)  # the "frame" the server answers with
        got = bytearray()
        while chunk := sock.recv(4096):
            got += chunk
        assert bytes(got) == b"f" * 300
    # While set, new connections are cut too; heal lets whole frames through again.
    with connect(proxy) as sock:
        sock.sendall(b"g" * 1000)
        with pytest.raises(ConnectionError):
            recv_exactly(sock, 1000)
    proxy.heal()
    with connect(proxy) as sock:
        assert roundtrip(sock, b"h" * 1000) == b"h" * 1000


def test_stall_holds_bytes_and_heal_delivers_them(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        proxy.stall()
        sock.sendall(b"held")
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(10)
        proxy.heal()
        sock.settimeout(5)
        assert recv_exactly(sock, 4) == b"held"  # nothing lost, stream intact
        assert roundtrip(sock) == b"ping"


def test_heal_clears_every_fault_at_once(proxy: FaultProxy) -> None:
    proxy.latency(1.0)
    proxy.bandwidth(1000)
    proxy.cut_mid_frame(1)
    proxy.refuse()
    proxy.heal()
    with connect(proxy) as sock:
        start = time.monotonic()
        assert roundtrip(sock, b"k" * 10_000) == b"k" * 10_000
        assert time.monotonic() - start < 0.5


def test_upstream_down_resets_the_client() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]
    with FaultProxy("127.0.0.1", dead_port) as p:
        with pytest.raises(ConnectionResetError), connect(p) as sock:
            roundtrip(sock)
        wait_until(lambda: p.stats().upstream_connect_failures == 1, 5, "1 failed dial")


def test_close_closes_every_socket_and_the_thread(echo: _EchoServer) -> None:
    threads_before = threading.active_count()
    p = FaultProxy("127.0.0.1", echo.port)
    sock = connect(p)
    try:
        assert roundtrip(sock) == b"ping"
        p.close()
        p.close()  # idempotent
        sock.settimeout(5)
        assert sock.recv(1) == b""
        wait_until(lambda: echo.open == 0, 5, "server side closed")
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(p.address, timeout=2).close()
        # The echo server's handler thread for this connection may still be on its way
        # out after it counted the close; the proxy's own thread must be gone too.
        wait_until(lambda: threading.active_count() <= threads_before, 5, "proxy thread stopped")
        with pytest.raises(RuntimeError):
            p.blackhole()
    finally:
        sock.close()


def test_many_proxies_are_cheap(echo: _EchoServer) -> None:
    start = time.monotonic()
    proxies = [FaultProxy("127.0.0.1", echo.port) for _ in range(20)]
    try:
        for p in proxies:
            with connect(p) as sock:
                assert roundtrip(sock) == b"ping"
    finally:
        for p in proxies:
            p.close()
    elapsed = time.monotonic() - start
    print(f"20 proxies started, used and closed in {elapsed:.3f}s")
    assert elapsed < 5.0


def test_rejects_bad_arguments(proxy: FaultProxy) -> None:
    with pytest.raises(ValueError):
        FaultProxy("127.0.0.1", 0)
    with pytest.raises(ValueError):
        proxy.latency(-1)
    with pytest.raises(ValueError):
        proxy.bandwidth(0)
    with pytest.raises(ValueError):
        proxy.cut_mid_frame(-1)
    with pytest.raises(ValueError):
        proxy.latency(1, direction="sideways")  # type: ignore[arg-type]
    assert "127.0.0.1" in repr(proxy)


def test_fault_proxies_front_a_cluster(echo: _EchoServer) -> None:
    other = _EchoServer()
    thread = threading.Thread(target=other.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        with FaultProxies([("127.0.0.1", echo.port), ("127.0.0.1", other.port)]) as cluster:
            assert len(cluster) == 2
            hosts = cluster.hosts.split(",")
            assert hosts == [f"127.0.0.1:{p.port}" for p in cluster]
            cluster.refuse()  # all brokers down
            for proxy in cluster:
                with pytest.raises(ConnectionRefusedError):
                    socket.create_connection(proxy.address, timeout=2).close()
            cluster.heal()
            cluster[1].blackhole()  # one broker black-holed, the other fine
            with connect(cluster[0]) as sock:
                assert roundtrip(sock) == b"ping"
            with connect(cluster[1], timeout=0.3) as sock:
                sock.sendall(b"ping")
                with pytest.raises(TimeoutError):
                    sock.recv(4)
        with pytest.raises(RuntimeError):
            cluster[0].heal()  # closed with the set
    finally:
        other.shutdown()
        other.server_close()
        thread.join(5)
    with pytest.raises(ValueError):
        FaultProxies([])
