"""Run a legacy producer script as a subprocess, kill a broker mid-run, and count.

A script prints one line per event as it sees it: ``sent N`` / ``delivered N`` (it
believes N is safe) or ``failed N``. :func:`run_script` streams those lines, kills the
broker the script is connected to once a third of the events are acknowledged (and
restarts it, when asked, once two thirds are reported), and returns what the script
saw; the test then reads what the broker holds and reports
``lost`` (produced, never received) and ``silently lost`` (acknowledged, never
received).
"""

from __future__ import annotations

import difflib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

HERE = Path(__file__).parent
REPO = HERE.parents[2]

#: Whole-run limit for one script (it normally takes seconds).
SCRIPT_TIMEOUT_S = 90.0


def wrap(script: Path, old: str, new: str, dest: Path) -> Path:
    """Write ``script`` with its import line ``old`` replaced by ``new`` — and nothing else
    changed — to ``dest``."""
    text = script.read_text()
    if text.count(f"\n{old}\n") != 1:
        raise AssertionError(f"{script.name} must contain the line {old!r} exactly once")
    wrapped = text.replace(f"\n{old}\n", f"\n{new}\n")
    changed = [
        line
        for line in difflib.ndiff(text.splitlines(), wrapped.splitlines())
        if line.startswith(("- ", "+ "))
    ]
    if changed != [f"- {old}", f"+ {new}"]:
        raise AssertionError(f"the wrapped script differs by more than the import: {changed}")
    dest.write_text(wrapped)
    return dest


def connected_ports(pid: int, ports: Iterable[int]) -> list[int]:
    """Which of ``ports`` (on loopback) process ``pid`` has an established connection to."""
    wanted = set(ports)
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return []
    found = {
        c.raddr.port
        for c in conns
        if c.raddr and c.status == psutil.CONN_ESTABLISHED and c.raddr.port in wanted
    }
    return sorted(found)


@dataclass
class Run:
    """What one script run produced, saw and what arrived."""

    label: str
    count: int
    acknowledged: set[int] = field(default_factory=set)
    failed: set[int] = field(default_factory=set)
    received: Counter[int] = field(default_factory=Counter)
    killed: str = ""
    kill_at: int = 0
    restarted_at: int = 0
    seconds: float = 0.0
    returncode: int | None = None
    left_in_outbox: int = 0
    stderr_tail: str = ""

    @property
    def lost(self) -> set[int]:
        """Produced by the script and never received."""
        return set(range(self.count)) - set(self.received)

    @property
    def silently_lost(self) -> set[int]:
        """Acknowledged to the script and never received."""
        return self.acknowledged - set(self.received)

    @property
    def duplicates(self) -> int:
        return sum(n - 1 for n in self.received.values() if n > 1)

    @property
    def unknown(self) -> set[int]:
        return {i for i in self.received if not 0 <= i < self.count}

    def summary(self) -> str:
        return (
            f"{self.label}: produced={self.count} acknowledged={len(self.acknowledged)} "
            f"failed={len(self.failed)} received={len(set(self.received))} "
            f"lost={len(self.lost)} silently_lost={len(self.silently_lost)} "
            f"duplicates={self.duplicates} unknown={len(self.unknown)} "
            f"left_in_outbox_at_exit={self.left_in_outbox} killed={self.killed} "
            f"at_ack={self.kill_at} restarted_at_report={self.restarted_at or '-'} "
            f"exit={self.returncode} seconds={self.seconds:.1f}"
        )


def script_env(data_dir: Path) -> dict[str, str]:
    """The environment of a script run: msgsafe importable, its outbox under ``data_dir``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["XDG_DATA_HOME"] = str(data_dir)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_script(
    run: Run,
    script: Path,
    args: list[str],
    *,
    env: dict[str, str],
    log: Path,
    kill: Callable[[int], str],
    restart: Callable[[], None] | None = None,
) -> Run:
    """Run ``script`` and record what it printed; call ``kill(pid)`` (which returns a
    label of what it killed) once a third of ``run.count`` events are acknowledged, and
    ``restart()`` (if given) once two thirds are reported either way."""
    started = time.monotonic()
    lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, str(script), *args],
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        assert proc.stdout is not None
        stdout = proc.stdout

        def pump() -> None:
            for line in stdout:
                lines.put(line)
            lines.put(None)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            deadline = started + SCRIPT_TIMEOUT_S
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{run.label} did not finish in {SCRIPT_TIMEOUT_S}s")
                try:
                    line = lines.get(timeout=left)
                except queue.Empty:
                    continue
                if line is None:
                    break
                word, _, rest = line.partition(" ")
                if word in ("sent", "delivered"):
                    run.acknowledged.add(int(rest.split()[0]))
                elif word == "failed":
                    run.failed.add(int(rest.split()[0]))
                if not run.killed and len(run.acknowledged) >= run.count // 3:
                    run.kill_at = len(run.acknowledged)
                    run.killed = kill(proc.pid)
                reported = len(run.acknowledged) + len(run.failed)
                if (
                    run.killed
                    and restart is not None
                    and not run.restarted_at
                    and reported >= 2 * run.count // 3
                ):
                    run.restarted_at = reported
                    restart()
            run.returncode = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    run.seconds = time.monotonic() - started
    run.stderr_tail = "\n".join(log.read_text().splitlines()[-15:])
    return run


def event_id(body: bytes) -> int:
    """The id in a legacy script's event body."""
    value: int = json.loads(body)["id"]
    return value
