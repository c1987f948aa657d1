"""Bad input at scale: 10,000 generated examples per target, each property cheap.

- URLs: anything parses or raises ConfigurationError, and never shows its password;
- headers, keys and message ids: an envelope is built or InvalidMessage raised (nothing
  else escapes), and what is built survives the outbox row exactly;
- outbox rows: whatever was accepted comes back from the SQLite store byte for byte, and
  a row whose stored columns are garbage is an OutboxCorrupt, not a crash.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from msgsafe.endpoints import parse_url
from msgsafe.errors import ConfigurationError, InvalidMessage
from msgsafe.message import Envelope
from msgsafe.outbox import SqliteOutbox
from msgsafe.outbox._rows import decode_headers, encode_headers

# Three minutes of CPU on two cores: the full run's first phase has them, the fast tier
# (make test-fast, under three minutes) leaves them out.
pytestmark = pytest.mark.slow

#: Examples per target, in one run.
EXAMPLES = 10_000
AT_SCALE = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    database=None,
)

_PIECES = st.sampled_from(
    [
        *"abc:/@,?&=%[]#.-_ 19;+",
        "amqp://",
        "amqps://",
        "kafka://",
        "kafka+ssl://",
        "amqp10://",
        "amqp10s://",
        "memory://",
        "%2F",
        "%zz",
        "::1",
        "[::1]",
        ":65536",
        ":0",
        "\x00",
        "é",
        "\ud800",
        "tls_ca_file=",
        "sasl_mechanism=",
    ]
)
_SECRET = "Zq9~secret"


@AT_SCALE
@given(
    text=st.lists(_PIECES, max_size=25).map("".join),
    password=st.text(max_size=8),
)
def test_urls(text: str, password: str) -> None:
    # The secret as the password of the URL's authority (where credentials live).
    planted = text.replace("://", f"://user:{quote(_SECRET + password, safe='')}@", 1)
    for candidate in (text, planted):
        try:
            parsed = parse_url(candidate)
        except ConfigurationError as exc:
            assert _SECRET not in str(exc) and _SECRET not in repr(exc)
            continue
        shown = f"{parsed!r} {parsed} {parsed.redacted()}"
        assert _SECRET not in shown
        assert quote(_SECRET, safe="") not in shown
        assert parse_url(parsed.redacted()).endpoints == parsed.endpoints


#: Any code point, lone surrogates included (hypothesis leaves them out by default).
_TEXT = st.text(st.characters(exclude_categories=[]), max_size=12)
_ANY = st.one_of(_TEXT, st.binary(max_size=8), st.integers(), st.none(), st.floats())


@AT_SCALE
@given(
    headers=st.one_of(
        st.dictionaries(_TEXT, _TEXT, max_size=4),
        st.dictionaries(_ANY.filter(lambda v: v.__hash__ is not None), _ANY, max_size=3),
        _ANY,
    )
)
def test_headers(headers: object) -> None:
    try:
        envelope = Envelope.build("q", b"x", headers=headers)  # type: ignore[arg-type]
    except InvalidMessage:
        return
    # What is accepted is stored and read back exactly.
    assert decode_headers(encode_headers(envelope.headers)) == dict(envelope.headers)
    encoded = encode_headers(envelope.headers)
    if encoded is not None:
        encoded.encode("utf-8")  # SQLite stores text as UTF-8


@AT_SCALE
@given(message_id=st.one_of(_TEXT, _ANY), key=st.one_of(_TEXT, _ANY))
def test_message_ids_and_keys(message_id: object, key: object) -> None:
    try:
        envelope = Envelope.build("q", b"x", key=key, message_id=message_id)  # type: ignore[arg-type]
    except InvalidMessage:
        return
    assert isinstance(envelope.message_id, str) and envelope.message_id
    envelope.message_id.encode("utf-8")
    assert envelope.key is None or isinstance(envelope.key, bytes)


_FIELDS = st.fixed_dictionaries(
    {
        "destination": _TEXT,
        "body": st.binary(max_size=64),
        "key": st.one_of(st.none(), st.binary(max_size=8), _TEXT),
        "headers": st.one_of(st.none(), st.dictionaries(_TEXT, _TEXT, max_size=3)),
        "message_id": st.one_of(st.none(), _TEXT),
    }
)


def test_outbox_rows(tmp_path: Path) -> None:
    # Memory-backed when the machine has it: the property is about rows, not fsync, and
    # 10,000 one-row commits on a disk take half a minute.
    shm = Path("/dev/shm")
    where = Path(tempfile.mkdtemp(dir=shm)) if shm.is_dir() else tmp_path
    store = SqliteOutbox(where / "rows.db")
    tried: list[bool] = []  # one entry per example: was it accepted?

    @AT_SCALE
    @given(fields=_FIELDS)
    def stored_exactly(fields: dict[str, object]) -> None:
        try:
            envelope = Envelope.build(**fields)  # type: ignore[arg-type]
        except InvalidMessage:
            tried.append(False)
            return
        tried.append(True)
        store.put([envelope])
        (back,) = store.claim(limit=1, lease_s=60)
        store.delivered([back.message_id])
        assert (back.message_id, back.destination, back.body, back.key) == (
            envelope.message_id,
            envelope.destination,
            envelope.body,
            envelope.key,
        )
        assert dict(back.headers) == dict(envelope.headers)

    try:
        stored_exactly()
    finally:
        store.close()
        if where != tmp_path:
            shutil.rmtree(where, ignore_errors=True)
    assert len(tried) >= EXAMPLES and sum(tried) >= EXAMPLES // 2, (len(tried), sum(tried))
