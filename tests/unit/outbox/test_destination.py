"""The default outbox belongs to the destination, not to the spelling of a URL.

Naming: every spelling of one destination (options, their order, URL query or keyword,
``localhost`` or ``127.0.0.1``, host order, credentials) names one file; another
scheme, host set or virtual host names another. Adoption: files with waiting messages
for the same destination — named under the earlier rule (a hash of the whole URL), or a
dead process's slot — are emptied into the producer's file and forwarded, with one
WARNING naming them. The counted test on a real broker is
``tests/integration/outbox/test_outbox_destination_rabbitmq.py``.
"""

from __future__ import annotations

import hashlib
import logging
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import msgsafe
from msgsafe.endpoints import parse_url
from msgsafe.message import Envelope
from msgsafe.outbox import SqliteOutbox, default_path, open_store
from msgsafe.outbox.destination import destination_of
from msgsafe.outbox.discovery import default_dir, find_outboxes
from msgsafe.outbox.location import slot_path
from msgsafe.testing import MemoryBroker

ROOT = Path(__file__).resolve().parents[3]


# Default outboxes of these tests live under tmp_path (tests/unit/conftest.py).
pytestmark = pytest.mark.usefixtures("data_home")


def path_of(url: str, **options: object) -> Path:
    return default_path(parse_url(url), options)


def old_path(url: str) -> Path:
    """The name the default outbox had before it was keyed by destination: a hash of
    the whole URL without credentials, options included."""
    target = parse_url(url)
    digest = hashlib.sha256(target.redacted().encode()).hexdigest()[:16]
    unsafe = re.compile(r"[^A-Za-z0-9._-]+")
    label = unsafe.sub("_", f"{target.scheme}_{','.join(map(str, target.endpoints))}")[:40]
    if target.protocol == "memory":
        label = unsafe.sub("_", f"memory_{target.path}")[:40]
    return default_dir() / f"{label}-{digest}.sqlite3"


def store_rows(path: Path, target: str, count: int, *, key: str | None = None) -> list[str]:
    path.parent.mkdir(parents=True, exist_ok=True)
    store = SqliteOutbox(path, target=target)
    envelopes = [Envelope.build("q", f"m{i}".encode(), key=key) for i in range(count)]
    store.put(envelopes)
    store.close()
    return [e.message_id for e in envelopes]


def test_every_spelling_of_one_destination_names_one_file() -> None:
    base = path_of("amqp://guest:guest@127.0.0.1:5672,127.0.0.1:5673/%2F")
    same = [
        path_of("amqp://guest:guest@127.0.0.1:5672,127.0.0.1:5673/%2F?confirm_timeout=6"),
        path_of("amqp://localhost:5672,localhost:5673/%2F"),
        path_of("amqp://u:other@127.0.0.1:5673,127.0.0.1:5672/%2F"),
        path_of("amqp://LOCALHOST.:5673,[::1]:5672?heartbeat=5&confirm_timeout=6"),
        path_of("amqp://127.0.0.1,127.0.0.1:5673", confirm_timeout=6, declare="quorum"),
        path_of("amqp://localhost:5672,127.0.0.1:5673/%2F?declare=quorum&confirm_timeout=6"),
    ]
    assert set(same) == {base}
    different = [
        path_of("amqps://127.0.0.1:5672,127.0.0.1:5673/%2F"),  # another listener
        path_of("amqp://127.0.0.1:5672/%2F"),  # another host set
        path_of("amqp://127.0.0.1:5672,127.0.0.1:5673/prod"),  # another vhost
        path_of("amqp10://127.0.0.1:5672,127.0.0.1:5673"),  # another protocol
        path_of("amqp://10.0.0.1:5672,127.0.0.1:5673/%2F"),
    ]
    assert len({base, *different}) == 1 + len(different)
    assert path_of("amqp10://h:5672", virtual_host="a") == path_of("amqp10://h?virtual_host=a")
    assert path_of("amqp10://h:5672", virtual_host="a") != path_of("amqp10://h:5672")
    assert path_of("kafka://b1:9092,b2:9092?acks_timeout=1") == path_of("kafka://B2,b1")
    assert path_of("memory://x?confirm_timeout=6") == path_of("memory://x")
    for name in (base.name, *(p.name for p in different)):
        assert "guest" not in name and "other" not in name
    assert base.parent == default_dir()


def test_outbox_follows_the_destination_through_respellings() -> None:
    """Three messages STORED, then the URL edited five ways: each producer sees them
    waiting (the same file), and the last one delivers all of them (memory broker:
    naming only; the real-broker version is in tests/integration/outbox)."""
    broker = MemoryBroker.named("respell")
    broker.refuse_writes()
    receipts = []
    with msgsafe.Producer("memory://respell", send_timeout=5) as producer:
        for i in range(3):
            receipts.append(producer.send("q", f"m{i}".encode()))
    assert {r.status for r in receipts} == {msgsafe.Status.STORED}
    spellings: list[tuple[str, dict[str, object]]] = [
        ("memory://respell?confirm_timeout=6", {}),
        ("memory://respell", {"confirm_timeout": 6}),
        ("memory://respell?max_in_flight=10&confirm_timeout=6", {}),
        ("memory://respell?confirm_timeout=6&max_in_flight=10", {}),
    ]
    for url, options in spellings:
        with msgsafe.Producer(url, send_timeout=5, **options) as producer:  # type: ignore[arg-type]
            assert producer.pending() == 3, url
    broker.accept_writes()
    with msgsafe.Producer("memory://respell/", send_timeout=5, max_in_flight=7) as producer:
        assert producer.drain(timeout=10) == 0
    got = set(broker.ids("q"))
    MemoryBroker.forget("respell")
    assert {r.message_id for r in receipts} <= got, "lost"


def test_a_file_named_under_the_old_rule_is_adopted_and_forwarded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    old_url = "memory://migrate?confirm_timeout=6"
    old = old_path(old_url)
    ids = store_rows(old, parse_url(old_url).redacted(), 40, key="k")
    broker = MemoryBroker.named("migrate")
    with (
        caplog.at_level(logging.WARNING, logger="msgsafe.outbox"),
        msgsafe.Producer("memory://migrate", send_timeout=5) as producer,
    ):
        assert producer.outbox is not None and producer.outbox.path != old  # type: ignore[attr-defined]
        # The forwarder starts with the producer: it may have sent some already (the
        # adoption's count is the log line's "40 waiting", checked below).
        assert producer.pending() <= 40
        assert producer.drain(timeout=10) == 0
    adopted = [r for r in caplog.records if "adopted" in r.getMessage()]
    assert len(adopted) == 1 and str(old) in adopted[0].getMessage()
    assert "40 waiting" in adopted[0].getMessage()
    assert not old.exists(), "the emptied file is removed"
    got = broker.ids("q")
    MemoryBroker.forget("migrate")
    assert got == ids, "every adopted message, in its order"


def test_adopted_messages_go_ahead_of_the_ones_already_waiting() -> None:
    url = parse_url("memory://order")
    mine = store_rows(default_path(url), url.redacted(), 5, key="k")
    theirs = store_rows(old_path("memory://order?max_in_flight=3"), "memory://order", 5, key="k")
    store = open_store(True, url)
    try:
        assert isinstance(store, SqliteOutbox)
        assert [e.envelope.message_id for e in store.list()] == theirs + mine
        assert store.has_key(b"k") and store.pending() == 10
    finally:
        assert store is not None
        store.close()


def test_other_destinations_are_left_and_overlapping_ones_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    other = old_path("amqp://h9:5672/%2F")
    store_rows(other, "amqp://h9:5672/%2F", 2)
    nearby = old_path("amqp://h1:5672,h2:5672/%2F")
    store_rows(nearby, "amqp://h1:5672,h2:5672/%2F", 3)
    with caplog.at_level(logging.WARNING, logger="msgsafe.outbox"):
        store = open_store(True, parse_url("amqp://h1:5672,h3:5672/%2F"))
    assert store is not None
    try:
        assert store.stats().depth == 0
    finally:
        store.close()
    assert other.exists() and nearby.exists()
    text = " ".join(r.getMessage() for r in caplog.records)
    assert str(nearby) in text and f"msgsafe outbox drain {nearby}" in text
    assert str(other) not in text


_SLOT_TAKER = textwrap.dedent(
    """
    import os, sys
    from msgsafe.endpoints import parse_url
    from msgsafe.message import Envelope
    from msgsafe.outbox import open_store
    store = open_store(True, parse_url(sys.argv[1]))
    store.put([Envelope.build("q", b"from-the-child") for _ in range(7)])
    print(store.path, flush=True)
    os._exit(0)  # dies holding its rows: nothing closes the file
    """
)


def test_a_second_process_takes_a_slot_and_a_dead_ones_rows_are_adopted() -> None:
    url = parse_url("memory://slots")
    destination = destination_of(url)
    first = open_store(True, url)
    assert isinstance(first, SqliteOutbox)
    try:
        assert first.path == slot_path(destination, 0)
        child = subprocess.run(
            [sys.executable, "-c", _SLOT_TAKER, "memory://slots?confirm_timeout=3"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        # Not OutboxLocked: the child took the next slot, stored there and died.
        taken = Path(child.stdout.strip())
        assert taken == slot_path(destination, 1)
        assert {f.path: f.waiting for f in find_outboxes()}[taken] == 7
        assert first.pending() == 0
    finally:
        first.close()
    again = open_store(True, url)
    assert isinstance(again, SqliteOutbox)
    try:
        assert again.path == slot_path(destination, 0) and again.pending() == 7
    finally:
        again.close()
    assert not taken.exists()
