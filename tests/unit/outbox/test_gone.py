"""An outbox whose file is no longer at its path stores nothing more: every send after
its directory is removed raises OutboxGone (the caller still owns the message), and what
was STORED before is accounted for at ERROR, by count and ids.

Unit tests: the outage is the memory adapter's fault injection, and no broker behaviour
is involved, only the outbox file and its directory (a tmp dir on disk, not tmpfs)."""

from __future__ import annotations

import logging
import os
import pickle
import shutil
from concurrent.futures import Future
from pathlib import Path

import pytest

from msgsafe import Producer, Receipt, RetryPolicy, Status
from msgsafe.errors import OutboxGone
from msgsafe.message import Envelope
from msgsafe.outbox import SqliteOutbox
from msgsafe.testing import MemoryBroker

FAST = RetryPolicy(initial=0.01, maximum=0.05)
BEFORE, AFTER = 73, 127


def test_every_send_after_the_directory_is_removed_raises_outbox_gone(
    memory_broker: MemoryBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "volume"
    directory.mkdir()
    caplog.set_level(logging.ERROR, logger="msgsafe")
    stored: list[str] = []
    refused: list[str] = []
    answered: list[Receipt] = []
    producer = Producer(f"memory://{memory_broker.name}", outbox=directory / "o.db", retry=FAST)
    with producer:
        memory_broker.down()
        for i in range(BEFORE):
            receipt = producer.send("q", b"%d" % i, key=f"k{i % 5}")
            assert receipt.status is Status.STORED
            stored.append(receipt.message_id)
        assert producer.pending() == BEFORE

        shutil.rmtree(directory)  # the pod is rescheduled: its volume goes

        for i in range(AFTER // 2):
            try:
                answered.append(producer.send("q", b"after %d" % i, key=f"k{i % 5}"))
            except OutboxGone as exc:
                assert exc.message_id is not None and exc.at_risk == BEFORE
                refused.append(exc.message_id)
        # Many at once share commit groups: each group is checked, none says STORED.
        futures: list[Future[Receipt]] = [
            producer.send_async("q", b"async %d" % i) for i in range(AFTER - AFTER // 2)
        ]
        for future in futures:
            try:
                answered.append(future.result(10))
            except OutboxGone as exc:
                refused.append(str(exc.message_id))
        assert answered == [] and len(refused) == AFTER == len(set(refused))

        with pytest.raises(OutboxGone, match=f"{BEFORE} waiting messages"):
            producer.pending()
        outbox = producer.outbox
        assert isinstance(outbox, SqliteOutbox) and outbox.stats().gone
        assert outbox.stats().depth == BEFORE  # every STORED one, none of the refused
        stats = producer.stats()
        assert stats.outbox_gone and stats.outbox_depth == BEFORE
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    found = [m for m in errors if "no longer at its path" in m and "directory was removed" in m]
    assert len(found) == 1, errors
    assert f"{BEFORE} waiting messages (ids {stored[0]} .. {stored[-1]}" in found[0]
    assert any(f"{BEFORE} waiting and 0 quarantined messages in it are lost" in m for m in errors)


def test_a_file_replaced_at_its_path_takes_no_more_puts(tmp_path: Path) -> None:
    path = tmp_path / "o.db"
    store = SqliteOutbox(path)
    try:
        store.put([Envelope("q", b"kept")])
        os.rename(path, tmp_path / "moved.db")
        path.write_bytes(b"")  # another file of the same name: not the one opened
        with pytest.raises(OutboxGone, match="another file took its place"):
            store.put([Envelope("q", b"x")])
        with pytest.raises(OutboxGone):
            store.put_async([Envelope("q", b"y")]).result(10)
        assert store.stats().depth == 1 and store.stats().gone
    finally:
        store.close()


def test_outbox_gone_pickles_with_what_is_at_risk() -> None:
    err = OutboxGone("gone", path="/v/o.db", at_risk=3, message_id="id-1")
    back = pickle.loads(pickle.dumps(err))
    assert (back.path, back.at_risk, back.message_id) == ("/v/o.db", 3, "id-1")
    assert back.with_id("id-2").at_risk == 3
