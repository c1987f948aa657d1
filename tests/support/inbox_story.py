"""The inbox story on a real cluster, counted: the parts every broker's test shares.

Keyed messages (2% poison that always raises, 5% failing on their first attempt) are
sent; the consumer service (:mod:`tests.support.inbox_consumer`) is started, SIGKILLed
at given numbers of committed effects and started again; a broker's test adds its own
node kill; then the ledger counts, per message id, the effects applied (an ``effects``
table in the service's SQLite database, written in the inbox's transaction), the dead
letters read back and the per-key order of the effects.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from msgsafe import Consumer, Producer
from msgsafe.consuming.dead_letter import DLQ_ATTEMPTS, DLQ_MESSAGE_ID
from tests.integration.compat.legacy import REPO, script_env
from tests.support.inbox_consumer import MAX_ATTEMPTS, STATS
from tests.support.waiting import wait_until

__all__ = ["InboxStory", "Tally", "kind"]


def kind(i: int) -> str:
    """What message ``i`` does to its handler: ``poison``, ``flaky`` or ``ok``."""
    return "poison" if i % 50 == 7 else "flaky" if i % 20 == 3 else "ok"


@dataclass(frozen=True, slots=True)
class Tally:
    """What the ledger found; :meth:`check` asserts the promise."""

    sent: int
    effects: int
    applied_twice: dict[str, int]
    missing: set[str]
    poison_with_effect: set[str]
    unknown: set[str]
    dead_lettered: set[str]
    dead_letter_copies: int
    poison: set[str]
    attempts_below_max: int
    out_of_order: dict[str, list[int]]
    keys: int

    def line(self) -> str:
        return (
            f"sent={self.sent} effects={self.effects} applied_twice={len(self.applied_twice)} "
            f"missing={len(self.missing)} poison_with_effect={len(self.poison_with_effect)} "
            f"dead_lettered={len(self.dead_lettered)}/{len(self.poison)} "
            f"dead_letter_copies={self.dead_letter_copies} keys={self.keys} "
            f"out_of_order_keys={len(self.out_of_order)}"
        )

    def check(self) -> None:
        assert self.applied_twice == {}
        assert self.missing == set()
        assert self.poison_with_effect == set()
        assert self.unknown == set()
        assert self.dead_lettered == self.poison  # every poison there; copies carry its id
        assert self.attempts_below_max == 0
        assert self.out_of_order == {}  # each key's effects in the order it was sent


@dataclass
class InboxStory:
    """One run of the story: ``url`` of the cluster, the consumed ``queue`` and the
    dead-letter ``dlq``, files under ``dir``."""

    url: str
    queue: str
    dlq: str
    dir: Path
    count: int
    keys: int = 40
    ids: list[str] = field(default_factory=list)
    #: The consumer group the services join (Kafka), None for none.
    group: str | None = None
    #: The services' first retry backoff in seconds, None for the service's default.
    retry_initial: float | None = None

    @property
    def db(self) -> Path:
        return self.dir / "app.db"

    @property
    def inbox(self) -> str:
        """The services' inbox: a SQLite database beside the effects table."""
        return f"sqlite://{self.db}"

    def outbox(self, n: int) -> Path:
        """Service ``n``'s outbox for its dead letters: one for every service, so the
        rows a killed one left are forwarded by the next."""
        return self.dir / "dead-letters.sqlite3"

    @property
    def poison(self) -> set[str]:
        return {m for i, m in enumerate(self.ids) if kind(i) == "poison"}

    def send(self) -> None:
        """Make the effects table and send every message (no outbox: all CONFIRMED)."""
        (self.dir / "logs").mkdir(exist_ok=True)
        with sqlite3.connect(self.db) as conn:
            conn.execute("CREATE TABLE effects (message_id TEXT, key TEXT, body BLOB, pid INTEGER)")
        with Producer(self.url, outbox=False) as producer:
            self.ids = [
                producer.send(
                    self.queue, f"{kind(i)}:{i}".encode(), key=f"k{i % self.keys}"
                ).message_id
                for i in range(self.count)
            ]

    def effects(self) -> list[tuple[str, str, bytes]]:
        with sqlite3.connect(self.db, timeout=30) as conn:
            rows = conn.execute("SELECT message_id, key, body FROM effects ORDER BY rowid")
            return rows.fetchall()

    def applied(self) -> int:
        """Effect rows committed so far."""
        with sqlite3.connect(self.db, timeout=30) as conn:
            return int(conn.execute("SELECT count(*) FROM effects").fetchone()[0])

    def start(self, n: int) -> subprocess.Popen[bytes]:
        """Start service ``n`` (its output in ``logs/consumer-n.log``)."""
        argv = [sys.executable, "-m", "tests.support.inbox_consumer", self.url, self.queue]
        argv += [self.dlq, self.inbox, str(self.outbox(n))]
        argv += ["--calls", str(self.dir / "logs" / f"calls-{n}.txt")]
        if self.group is not None:
            argv += ["--group", self.group]
        if self.retry_initial is not None:
            argv += ["--retry-initial", str(self.retry_initial)]
        with self.log_path(n).open("ab") as out:  # a service started again appends
            return subprocess.Popen(
                argv,
                cwd=REPO,
                env=script_env(self.dir),
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def log_path(self, n: int) -> Path:
        return self.dir / "logs" / f"consumer-{n}.log"

    def log_of(self, n: int) -> str:
        """The end of service ``n``'s output."""
        return self.log_path(n).read_text()[-3000:]

    def calls(self, n: int) -> list[tuple[str, int]]:
        """``(message_id, attempt)`` of service ``n``'s handler calls, in call order (a
        SIGKILL can cut the last line short: only complete lines count)."""
        path = self.dir / "logs" / f"calls-{n}.txt"
        if not path.exists():
            return []
        found = []
        for line in path.read_text().splitlines(keepends=True):
            if line.endswith("\n"):
                message_id, attempt = line.split()
                found.append((message_id, int(attempt)))
        return found

    def wait_applied(self, child: subprocess.Popen[bytes], n: int, threshold: int) -> None:
        """Wait until ``threshold`` effects are committed, service ``n`` still running."""
        wait_until(
            lambda: child.poll() is not None or self.applied() >= threshold,
            120,
            f"{threshold} effects under service {n}",
            diagnose=lambda: self.log_of(n),
        )
        assert child.poll() is None, self.log_of(n)

    @contextmanager
    def running(self, n: int) -> Iterator[subprocess.Popen[bytes]]:
        """Service ``n``, started; SIGKILLed on the way out unless it exited already."""
        child = self.start(n)
        try:
            yield child
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(30)

    def kill_at(self, n: int, threshold: int) -> None:
        """Start service ``n``, SIGKILL it once ``threshold`` effects are committed."""
        with self.running(n) as child:
            self.wait_applied(child, n, threshold)

    def kill_when(self, n: int, ready: Callable[[], bool], what: str) -> None:
        """Start service ``n``, SIGKILL it once ``ready()``."""
        with self.running(n) as child:
            wait_until(
                lambda: child.poll() is not None or ready(),
                120,
                f"{what} under service {n}",
                diagnose=lambda: self.log_of(n),
            )
            assert child.poll() is None, self.log_of(n)

    def wait_all_handled(self, child: subprocess.Popen[bytes], n: int, timeout: float) -> None:
        """Wait until every non-poison message has an effect."""
        done = set(self.ids) - self.poison
        wait_until(
            lambda: child.poll() is not None or {e[0] for e in self.effects()} >= done,
            timeout,
            "every non-poison message's effect",
            diagnose=lambda: self.log_of(n),
        )

    def read_dead_letters(self, timeout: float) -> list[tuple[str, int]]:
        """(original id, attempts) of the dead letters read until every poison id is there."""
        dead: list[tuple[str, int]] = []
        poison = self.poison
        with Consumer(self.url).subscribe(self.dlq) as reader:

            def take() -> bool:
                for d in reader.poll(0.5, max_messages=100):
                    dead.append((d.headers[DLQ_MESSAGE_ID], int(d.headers[DLQ_ATTEMPTS])))
                return {m for m, _ in dead} >= poison

            wait_until(
                take,
                timeout,
                "every poison message on the dead-letter destination",
                diagnose=lambda: f"{len({m for m, _ in dead})} of {len(poison)}",
            )
        return dead

    def stop(self, child: subprocess.Popen[bytes], n: int, deadline: float) -> dict[str, int]:
        """SIGTERM service ``n``: it must exit 0 within ``deadline``; returns its stats."""
        child.send_signal(signal.SIGTERM)
        assert child.wait(deadline) == 0, self.log_of(n)
        lines = self.log_of(n).splitlines()
        stats: dict[str, int] = json.loads(lines[-1].removeprefix(STATS))
        return stats

    def tally(self, dead: list[tuple[str, int]]) -> Tally:
        effects = self.effects()
        per_id = Counter(e[0] for e in effects)
        poison = self.poison
        by_key: dict[str, list[int]] = defaultdict(list)
        for _, key, body in effects:
            by_key[key].append(int(body.split(b":")[1]))
        dead_ids = Counter(m for m, _ in dead)
        return Tally(
            sent=len(self.ids),
            effects=len(effects),
            applied_twice={m: n for m, n in per_id.items() if n > 1},
            missing=set(self.ids) - poison - set(per_id),
            poison_with_effect=poison & set(per_id),
            unknown=set(per_id) - set(self.ids),
            dead_lettered=set(dead_ids),
            dead_letter_copies=sum(dead_ids.values()),
            poison=poison,
            attempts_below_max=sum(attempts < MAX_ATTEMPTS for _, attempts in dead),
            out_of_order={k: seq for k, seq in by_key.items() if seq != sorted(seq)},
            keys=len(by_key),
        )

    def left_in_queue(self) -> int:
        """Messages still in the consumed queue (read for 2 s, given back)."""
        with Consumer(self.url).subscribe(self.queue) as again:
            return len(again.poll(2.0, max_messages=10))
