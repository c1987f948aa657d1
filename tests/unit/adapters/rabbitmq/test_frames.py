"""The batch path writes the same bytes as pika's ``Channel.basic_publish`` would."""

from __future__ import annotations

import pytest
from pika import frame, spec

from msgsafe.adapters.rabbitmq._wire import FrameWriter, header_entries, publish_properties

FRAME_MAX = 4096


def _pika_bytes(exchange: str, routing_key: str, body: bytes, props: object) -> tuple[bytes, int]:
    method = spec.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=True)
    out = [frame.Method(3, method).marshal(), frame.Header(3, len(body), props).marshal()]  # type: ignore[arg-type]
    step = FRAME_MAX - 8
    out.extend(frame.Body(3, body[i : i + step]).marshal() for i in range(0, len(body), step))
    return b"".join(out), len(out)


@pytest.mark.parametrize("routing_key", ["queue", None])
@pytest.mark.parametrize("with_keys", [False, True])
def test_frames_match_pika(routing_key: str | None, with_keys: bool) -> None:
    bodies = [b"x" * 100, b"", b"y" * 10_000, b"z" * 3, b"w" * 100]
    ids = ["0190-abc-0", "0190-abc-1", "0190-abc-2", "a-much-longer-message-id", "0190-abc-4"]
    keys = [None, b"k1", b"k1", "é".encode(), b"k2"] if with_keys else None
    headers = {"a": "b", "trace": "0190-abc-9"}
    writer = FrameWriter(
        channel_number=3,
        frame_max=FRAME_MAX,
        exchange="ex",
        routing_key=routing_key,
        headers=headers,
        id_header="msgsafe-id",
        key_header="msgsafe-key",
        created_at=1234.5,
    )
    order = [4, 0, 1, 2, 3]
    buffers, frames = writer.encode(bodies, ids, keys, order)
    expected = b""
    expected_frames = 0
    for i in order:
        key = None if keys is None else keys[i]
        route = routing_key if routing_key is not None else (key or b"").decode()
        props = publish_properties(ids[i], headers, "msgsafe-id", "msgsafe-key", key, 1234.5)
        data, count = _pika_bytes("ex", route, bodies[i], props)
        expected += data
        expected_frames += count
    assert b"".join(buffers) == expected
    assert frames == expected_frames


@pytest.mark.parametrize("key", [None, b"k1", "é".encode()])
@pytest.mark.parametrize(
    "headers",
    [
        {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
        {"a": "", "ünï": "çødé ✓", "tracestate": "k=v,x=y", "b" * 255: "v" * 5000},
    ],
)
def test_a_single_envelopes_own_headers_match_pika(
    key: bytes | None, headers: dict[str, str]
) -> None:
    """Headers spliced in per message give the bytes basic_publish would write."""
    writer = FrameWriter(
        channel_number=3,
        frame_max=FRAME_MAX * 4,
        exchange="",
        routing_key="queue",
        headers={},
        id_header="msgsafe-id",
        key_header="msgsafe-key",
        created_at=1234.0,
    )
    entries = header_entries(headers, ("msgsafe-id", "msgsafe-key"))
    assert entries is not None
    for mid, body in (("0190-abc-0", b"x" * 100), ("longer-id-0190-abc-1", b"")):
        out: list[bytes] = []
        frames = writer.encode_into(out, (body,), (mid,), (key,), (0,), entries)
        props = publish_properties(mid, headers, "msgsafe-id", "msgsafe-key", key, 1234.0)
        method = spec.Basic.Publish(exchange="", routing_key="queue", mandatory=True)
        expected = [frame.Method(3, method).marshal(), frame.Header(3, len(body), props).marshal()]  # type: ignore[arg-type]
        if body:
            expected.append(frame.Body(3, body).marshal())
        assert b"".join(out) == b"".join(expected)
        assert frames == len(expected)


def test_headers_the_writer_cannot_place_go_through_pika() -> None:
    reserved = ("msgsafe-id", "msgsafe-key")
    assert header_entries({"msgsafe-id": "x"}, reserved) is None
    assert header_entries({"é" * 128: "x"}, reserved) is None  # 256 bytes: no short string
    assert header_entries({}, reserved) == b""


def test_a_batchs_headers_are_encoded_once_not_per_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch's one traceparent: the properties are built once per id length, then
    each message only gets its id spliced in."""
    from msgsafe.adapters.rabbitmq import _wire

    built: list[str] = []

    def counting(message_id: str, *args: object) -> object:
        built.append(message_id)
        return publish_properties(message_id, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(_wire, "publish_properties", counting)
    headers = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    writer = FrameWriter(
        channel_number=1,
        frame_max=FRAME_MAX,
        exchange="",
        routing_key="q",
        headers=headers,
        id_header="msgsafe-id",
        key_header="msgsafe-key",
        created_at=1.0,
    )
    ids = [f"0190-{i:06d}" for i in range(1000)]
    buffers, frames = writer.encode([b"x"] * 1000, ids, None, range(1000))
    assert len(built) == 1 and frames == 3000
    data = b"".join(buffers)
    assert data.count(headers["traceparent"].encode()) == 1000  # on every message
