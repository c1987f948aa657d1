"""The RabbitMQ adapter's two shortcuts through pika, against pika's own path (no broker):
frames written straight to the socket, and confirms read without pika's callbacks."""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from pika import frame, spec
from pika.adapters.select_connection import SelectConnection
from pika.adapters.utils.io_services_utils import _AsyncPlaintextTransport
from pika.channel import Channel

from msgsafe.adapters.rabbitmq._wire import fast_confirms, read_once, write_frames


class _Loop:
    """What pika's transport asks of its I/O loop: which fd it watches, and how."""

    def __init__(self) -> None:
        self.writers: list[int] = []

    def set_reader(self, fd: int, callback: Any) -> None:
        pass

    def set_writer(self, fd: int, callback: Any) -> None:
        self.writers.append(fd)


class _Conn:
    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self.bytes_sent = 0
        self.frames_sent = 0


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    yield ours, peer
    ours.close()
    peer.close()


def _read(peer: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        data += peer.recv(count - len(data))
    return data


def test_frames_go_straight_to_an_idle_socket_and_behind_what_pika_buffered(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    ours, peer = pair
    loop = _Loop()
    transport = _AsyncPlaintextTransport(ours, None, loop)  # type: ignore[arg-type]
    conn = _Conn(transport)
    assert write_frames(conn, transport.write, b"first", 3)
    # Written at once: pika buffered nothing and did not watch the socket for it.
    assert not transport._tx_buffers and loop.writers == []
    assert _read(peer, 5) == b"first"
    assert (conn.bytes_sent, conn.frames_sent) == (5, 3)
    # Something of pika's own waits in its buffer: later frames queue behind it.
    transport.write(b"pika's")
    assert write_frames(conn, transport.write, b"second", 3)
    assert list(transport._tx_buffers) == [b"pika's", b"second"]
    assert len(loop.writers) == 1


def test_what_a_full_socket_does_not_take_waits_in_pikas_buffer(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    ours, peer = pair
    loop = _Loop()
    transport = _AsyncPlaintextTransport(ours, None, loop)  # type: ignore[arg-type]
    conn = _Conn(transport)
    data = bytes(range(256)) * 40_000  # more than a socket buffer holds
    assert write_frames(conn, transport.write, data, 1)
    assert len(loop.writers) == 1 and transport._tx_buffers
    assert 0 < transport.get_write_buffer_size() < len(data)
    received = b""
    while len(received) < len(data):
        with contextlib.suppress(BlockingIOError):
            transport._produce()  # pika's writable handler: the rest, in order
        received += peer.recv(1 << 20)
    assert received == data and not transport._tx_buffers


class _Protocol:
    """What pika's transport hands what it reads to."""

    def __init__(self) -> None:
        self.reads: list[bytes] = []

    def data_received(self, data: bytes) -> None:
        self.reads.append(data)


def test_one_read_per_readable_event_and_the_rest_at_the_next(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    ours, peer = pair
    protocol = _Protocol()
    transport = _AsyncPlaintextTransport(ours, protocol, _Loop())  # type: ignore[arg-type]
    assert read_once(_Conn(transport))
    peer.sendall(b"confirm")
    # One recv: no second one that would only raise EAGAIN.
    transport._on_socket_readable()
    assert protocol.reads == [b"confirm"]
    data = bytes(range(256)) * 400  # 100 KiB: more than one read takes
    peer.sendall(data)
    while sum(map(len, protocol.reads)) < len(data) + 7:
        before = len(protocol.reads)
        transport._on_socket_readable()
        assert len(protocol.reads) == before + 1
    assert b"".join(protocol.reads) == b"confirm" + data
    assert max(map(len, protocol.reads)) <= 65536


def test_read_once_leaves_other_transports_alone() -> None:
    assert not read_once(object())
    assert _AsyncPlaintextTransport._MAX_CONSUME_BYTES > 1  # the class is untouched


@pytest.fixture
def connections() -> Iterator[list[SelectConnection]]:
    made: list[SelectConnection] = []
    yield made
    for conn in made:
        conn.ioloop.close()


def _connection(made: list[SelectConnection]) -> tuple[SelectConnection, Channel]:
    """A pika connection that never connects, and its open channel 1."""
    conn = SelectConnection(pika.ConnectionParameters(), internal_connection_workflow=False)
    made.append(conn)
    channel = Channel(conn, 1, lambda _channel: None)
    channel._set_state(Channel.OPEN)
    return conn, channel


def _method(channel_number: int, method: Any) -> bytes:
    return frame.Method(channel_number, method).marshal()


def _stream() -> bytes:
    return b"".join(
        [
            _method(1, spec.Basic.Ack(delivery_tag=1)),
            _method(1, spec.Basic.Ack(delivery_tag=3, multiple=True)),
            _method(2, spec.Basic.Ack(delivery_tag=9)),  # another channel's
            frame.Heartbeat().marshal(),
            _method(1, spec.Basic.Nack(delivery_tag=4)),
            _method(1, spec.Basic.Ack(delivery_tag=(1 << 63) + 5, multiple=True)),
        ]
    )


@pytest.mark.parametrize("cut", [None, 10, 21, 30, 70, 84, 95])
def test_confirms_are_read_as_pika_reads_them(
    cut: int | None, connections: list[SelectConnection]
) -> None:
    data = _stream()
    chunks = [data] if cut is None else [data[:cut], data[cut:]]
    seen: dict[str, list[tuple[int, bool, bool]]] = {"pika": [], "fast": []}
    counters = {}
    for how in ("pika", "fast"):
        conn, channel = _connection(connections)

        def through_pika(method_frame: Any, how: str = how) -> None:
            method = method_frame.method
            nack = isinstance(method, spec.Basic.Nack)
            seen[how].append((method.delivery_tag, bool(method.multiple), nack))

        conn.callbacks.add(1, spec.Basic.Ack, through_pika, False)
        conn.callbacks.add(1, spec.Basic.Nack, through_pika, False)
        if how == "fast":
            assert fast_confirms(
                channel, lambda tag, multiple, nack: seen["fast"].append((tag, multiple, nack))
            )
        for chunk in chunks:
            conn._on_data_available(chunk)
        counters[how] = (conn.bytes_received, conn.frames_received, conn._frame_buffer)
    assert (
        seen["fast"]
        == seen["pika"]
        == [
            (1, False, False),
            (3, True, False),
            (4, False, True),
            ((1 << 63) + 5, True, False),
        ]
    )
    assert counters["fast"] == counters["pika"]


def test_a_closed_channels_confirms_are_left_to_pika(connections: list[SelectConnection]) -> None:
    conn, channel = _connection(connections)
    seen: list[int] = []
    assert fast_confirms(channel, lambda tag, multiple, nack: seen.append(tag))
    channel._set_state(Channel.CLOSED)
    conn._on_data_available(_method(1, spec.Basic.Ack(delivery_tag=1)))
    assert seen == [] and conn.frames_received == 1


def test_the_layout_read_is_a_confirms() -> None:
    ack = _method(7, spec.Basic.Ack(delivery_tag=42, multiple=True))
    nack = _method(7, spec.Basic.Nack(delivery_tag=43, multiple=False, requeue=True))
    assert len(ack) == len(nack) == 21
    assert struct.unpack(">BHIIQBB", ack) == (1, 7, 13, (60 << 16) | 80, 42, 1, 0xCE)
    assert struct.unpack(">BHIIQBB", nack)[3:6] == ((60 << 16) | 120, 43, 2)
