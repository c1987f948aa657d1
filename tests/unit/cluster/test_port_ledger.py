"""The ledger of drawn ports: a port another process drew is not drawn again while that
process lives or for a while after, so two processes starting nodes side by side never
give two nodes one port (a suite run once lost a RabbitMQ cluster to EADDRINUSE on a
port outside the ephemeral range, drawn twice)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from msgsafe.cluster import _port_ledger, _process
from msgsafe.cluster._port_ledger import HOLD_S, PortLedger


@pytest.fixture
def ledger_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "ledger"
    monkeypatch.setattr(_port_ledger, "ledger_dir", lambda: folder)
    return folder


def _free_run(count: int) -> int:
    """The first of ``count`` consecutive ports, all free now, above the ephemeral range."""
    high = _process._ephemeral_range()[1]
    for first in range(high + 1, 65535 - count, count):
        if all(_process.port_free(p) for p in range(first, first + count)):
            return first
    pytest.fail("no run of free ports above the ephemeral range")


@pytest.fixture
def four_ports(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Four free ports, made the only ones free_ports may draw."""
    first = _free_run(4)
    monkeypatch.setattr(_process, "_LOWEST_PORT", first)
    monkeypatch.setattr(_process, "_ephemeral_range", lambda: (first + 4, 65535))
    yield list(range(first, first + 4))


def _draw_in_child(ledger: Path) -> subprocess.Popen[str]:
    """A process that draws three ports through the ledger, prints them, and waits."""
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from msgsafe.cluster import _port_ledger, _process\n"
        f"_port_ledger.ledger_dir = lambda: Path({str(ledger)!r})\n"
        f"_process._LOWEST_PORT = {_process._LOWEST_PORT}\n"
        f"_process._ephemeral_range = lambda: {_process._ephemeral_range()!r}\n"
        "print(' '.join(map(str, _process.free_ports(3))), flush=True)\n"
        "sys.stdin.read()\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


def test_a_port_another_process_drew_is_not_drawn_again(
    ledger_dir: Path, four_ports: list[int]
) -> None:
    child = _draw_in_child(ledger_dir)
    try:
        assert child.stdout is not None
        theirs = {int(p) for p in child.stdout.readline().split()}
        assert len(theirs) == 3 and theirs <= set(four_ports)
        # None of the three is bound: only the ledger keeps them from being drawn.
        assert all(_process.port_free(p) for p in theirs)
        mine = _process.free_ports(1)
        assert mine == [p for p in four_ports if p not in theirs]
        # This process holds its own draw too: with all four held, a port 0 gives.
        assert _process.free_ports(1)[0] not in four_ports
    finally:
        child.kill()
        child.wait()


def test_a_port_stays_held_for_a_while_after_its_process_ended(
    ledger_dir: Path, four_ports: list[int]
) -> None:
    child = _draw_in_child(ledger_dir)
    assert child.stdout is not None
    theirs = [int(p) for p in child.stdout.readline().split()]
    child.kill()
    child.wait()
    with PortLedger.open() as ledger:
        assert ledger is not None
        assert all(ledger.held(p) for p in theirs), "held for HOLD_S after the end"
        # Once HOLD_S has passed, a port of an ended process is free to draw.
        old = time.time() - HOLD_S - 1
        for port in theirs:
            os.utime(ledger_dir / str(port), (old, old))
        assert not any(ledger.held(p) for p in theirs)


def test_a_port_of_a_living_process_is_held_however_old(ledger_dir: Path) -> None:
    with PortLedger.open() as ledger:
        assert ledger is not None
        ledger.record([12345])
        old = time.time() - 10 * HOLD_S
        os.utime(ledger_dir / "12345", (old, old))
        assert ledger.held(12345), "this process lives"
        assert not ledger.held(12346), "never drawn"


def test_drawing_goes_on_without_a_ledger_it_cannot_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    monkeypatch.setattr(_port_ledger, "ledger_dir", lambda: blocked / "ledger")
    ports = _process.free_ports(5)
    assert len(set(ports)) == 5


def test_entries_no_longer_held_are_swept_once_a_minute(
    ledger_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_port_ledger, "_SWEEP_AT", 4)
    ledger_dir.mkdir()
    gone = _ended_pid()

    def stale(*ports: int) -> None:
        old = time.time() - HOLD_S - 1
        for port in ports:
            (ledger_dir / str(port)).write_text(f"{gone}\n")
            os.utime(ledger_dir / str(port), (old, old))

    def entries() -> list[str]:
        return sorted(p.name for p in ledger_dir.iterdir() if p.name.isdigit())

    stale(20001, 20002, 20003, 20004)
    (ledger_dir / "20005").write_text(f"{os.getpid()}\n")
    with PortLedger.open():
        pass
    assert entries() == ["20005"]
    # Within the minute after a sweep, none: a draw does not read every entry each time.
    stale(20001, 20002, 20003, 20004)
    with PortLedger.open():
        pass
    assert len(entries()) == 5
    old = time.time() - _port_ledger._SWEEP_EVERY_S - 1
    os.utime(ledger_dir / ".swept", (old, old))
    with PortLedger.open():
        pass
    assert entries() == ["20005"]


def _ended_pid() -> int:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout)
