"""The checker of a nemesis run: what the history says about the promise.

Invariants (each must hold for the run to pass):

- **lost** = 0: no id that a ``send()`` receipted (CONFIRMED or STORED) is missing from
  what the consumer received;
- **unexpected** = 0: no id was received that no producer attempted (so every duplicate
  carries a known id);
- **order** = 0 violations: per key, the first arrivals of the messages whose send did
  not fail come in send order (a send that failed saying the broker may hold the
  message, a confirm that timed out, may arrive any time later: it is not judged);
- **denied** = 0: no message arrived whose send failed saying the broker could not
  hold it (``maybe_delivered`` false: an outbox that refused a message never sent);
- **recovered**: after the last heal, every outbox became empty;
- **receipted** > 0: a run that receipted nothing checked nothing.

Also counted, not judged: duplicates (deliveries beyond the first), sends that raised
(among them **refused**: ``OutboxFull``, a full disk or a bound, nothing stored nor sent,
so never receipted and never lost; **in doubt**: failed saying the broker may hold the
message, and among those how many arrived),
sends cut short by a producer's death (attempted, neither receipted nor failed), and the
series the picture draws (:class:`Series`).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["REFUSALS", "Series", "Verdict", "check"]

#: The errors of a send() that stored nothing on purpose (a full disk, a bound).
REFUSALS = frozenset({"OutboxFull"})


@dataclass(frozen=True, slots=True)
class Series:
    """Per-bucket figures over the run, ``step`` seconds apart from ``t0`` (wall clock)."""

    t0: float
    step: float
    confirmed: list[int]  #: receipts CONFIRMED in the bucket
    stored: list[int]  #: receipts STORED in the bucket
    latency: list[float]  #: slowest send() that returned in the bucket (s)
    depth: list[int]  #: messages in all outboxes at the bucket's end
    unseen: list[int]  #: receipted by the bucket's end, not yet received
    faults: list[tuple[str, float, float]]  #: (name, start, end) relative to t0


@dataclass(frozen=True, slots=True)
class Verdict:
    """The checker's result; :attr:`ok` when every invariant holds."""

    attempted: int
    receipted: int
    confirmed: int
    stored: int
    failed: int
    cut_short: int
    received: int
    lost: int
    unexpected: int
    duplicates: int
    order_violations: int
    recovery_s: float | None
    #: The longest time from the end of any fault window to empty outboxes (None: the
    #: outboxes were not empty at the end).
    worst_recovery_s: float | None
    errors: dict[str, int]
    examples: dict[str, list[str]] = field(default_factory=dict)
    #: Sends that raised OutboxFull (of :attr:`failed`), the broker never given them.
    refused: int = 0
    #: Failed sends whose error says the broker may hold the message; how many arrived.
    in_doubt: int = 0
    in_doubt_arrived: int = 0
    #: Arrived although their send failed saying the broker could not hold them.
    denied: int = 0
    #: Of :attr:`lost`, those a producer's forwarder removed from its outbox on the
    #: broker's accept (history ``forwarded``): the broker accepted them, then lost them.
    lost_forwarded: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems()

    def problems(self) -> list[str]:
        """One line per invariant that does not hold (empty: the run passed)."""
        out: list[str] = []
        if self.receipted == 0:
            out.append("nothing was receipted: the run checked nothing")
        if self.lost:
            how = f"; {self.lost_forwarded} forwarded, accepted" if self.lost_forwarded else ""
            out.append(f"lost={self.lost} (receipted, never received{how})")
        if self.unexpected:
            out.append(f"unexpected={self.unexpected} (received, never attempted)")
        if self.denied:
            out.append(f"denied={self.denied} (arrived, its send failed saying it could not)")
        if self.order_violations:
            out.append(f"order_violations={self.order_violations} (per key, first arrival)")
        if self.recovery_s is None:
            out.append("an outbox was not empty at the end of the run")
        return out

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok, "problems": self.problems()}


def check(events: Sequence[dict[str, Any]], *, step: float = 1.0) -> tuple[Verdict, Series]:
    """Check a run's ``events`` (:func:`msgsafe.nemesis.history.read_dir`'s list, in
    time order) and make the series of its picture, ``step`` seconds per bucket."""
    attempted: dict[str, tuple[str, int]] = {}
    statuses: dict[str, str] = {}
    failed: dict[str, str] = {}
    doubted: set[str] = set()
    arrivals: list[str] = []
    forwarded: set[str] = set()
    for e in events:
        kind = e["e"]
        if kind == "attempted":
            attempted[e["id"]] = (str(e.get("key")), int(e.get("seq", 0)))
        elif kind == "receipted":
            statuses[e["id"]] = e["status"]
        elif kind == "failed":
            failed[e["id"]] = e.get("error", "?")
            if e.get("maybe", _maybe_delivered(failed[e["id"]])):
                doubted.add(e["id"])
        elif kind == "received":
            arrivals.append(e["id"])
        elif kind == "forwarded":
            forwarded.update(e["ids"])
    seen = Counter(arrivals)
    lost = sorted(set(statuses) - set(seen))
    unexpected = sorted(set(seen) - set(attempted))
    judged = {mid: ks for mid, ks in attempted.items() if mid not in failed}
    violations = _order_violations(arrivals, judged)
    denied = sorted((set(failed) - doubted) & set(seen))
    verdict = Verdict(
        attempted=len(attempted),
        receipted=len(statuses),
        confirmed=sum(1 for s in statuses.values() if s == "confirmed"),
        stored=sum(1 for s in statuses.values() if s == "stored"),
        failed=len(failed),
        cut_short=len(set(attempted) - set(statuses) - set(failed)),
        received=len(arrivals),
        lost=len(lost),
        unexpected=len(unexpected),
        duplicates=sum(n - 1 for n in seen.values()),
        order_violations=len(violations),
        recovery_s=_recovery(events),
        worst_recovery_s=_worst_recovery(events),
        errors=dict(Counter(failed.values())),
        examples={
            "lost": lost[:10],
            "unexpected": unexpected[:10],
            "order": violations[:10],
            "denied": denied[:10],
            "lost_forwarded": [m for m in lost if m in forwarded][:10],
        },
        refused=sum(1 for m, error in failed.items() if error in REFUSALS and m not in doubted),
        in_doubt=len(doubted),
        in_doubt_arrived=len(doubted & set(seen)),
        denied=len(denied),
        lost_forwarded=len(forwarded.intersection(lost)),
    )
    return verdict, _series(events, step)


def _maybe_delivered(error: str) -> bool:
    """Whether the error class of that name says the broker may hold the message (a
    history written before the workers recorded it per send)."""
    from msgsafe import errors

    cls = getattr(errors, error, None)
    return bool(getattr(cls, "maybe_delivered", False))


def _order_violations(arrivals: Sequence[str], attempted: dict[str, tuple[str, int]]) -> list[str]:
    """Ids whose first arrival came after that of a later message of their key."""
    highest: dict[str, int] = {}
    first: set[str] = set()
    out: list[str] = []
    for mid in arrivals:
        if mid in first or mid not in attempted:
            continue
        first.add(mid)
        key, seq = attempted[mid]
        if seq < highest.get(key, -1):
            out.append(mid)
        highest[key] = max(seq, highest.get(key, -1))
    return out


def _recovery(events: Sequence[dict[str, Any]]) -> float | None:
    """Seconds from the last heal (the end of the last fault window; the runner's
    ``heal`` event in a run without windows) to the moment every outbox was empty for
    good (from then to the end of the history); None when an outbox was not empty at
    the end. 0.0 for a run without a heal or without outboxes."""
    ends = [float(e["t"]) for e in events if e["e"] == "fault" and not e["on"]]
    heals = [float(e["t"]) for e in events if e["e"] == "heal"]
    if not ends and not heals:
        return 0.0
    healed = max(ends) if ends else heals[-1]
    latest: dict[str, int] = {}
    empty_at: float | None = None
    for e in events:
        if e["e"] != "depth":
            continue
        latest[str(e["outbox"])] = int(e["n"])
        if any(latest.values()):
            empty_at = None
        elif empty_at is None:
            empty_at = float(e["t"])
    if not latest:
        return 0.0
    if empty_at is None:
        return None
    return max(0.0, empty_at - healed)


def _worst_recovery(events: Sequence[dict[str, Any]]) -> float | None:
    """The longest wait, over every fault window's end, until all outboxes were empty."""
    waiting: list[float] = []  # ends of windows not yet followed by empty outboxes
    latest: dict[str, int] = {}
    worst = 0.0
    for e in events:
        if e["e"] == "fault" and not e["on"]:
            waiting.append(float(e["t"]))
        elif e["e"] == "depth":
            latest[str(e["outbox"])] = int(e["n"])
            if waiting and not any(latest.values()):
                worst = max(worst, float(e["t"]) - waiting[0])
                waiting = []
    return None if waiting and latest else worst


def _series(events: Sequence[dict[str, Any]], step: float) -> Series:
    if not events:
        return Series(0.0, step, [], [], [], [], [], [])
    t0 = float(events[0]["t"])
    size = int((float(events[-1]["t"]) - t0) / step) + 1
    confirmed, stored, depth, unseen = [0] * size, [0] * size, [0] * size, [0] * size
    latency = [0.0] * size
    sampled = [False] * size
    receipted_at: dict[str, float] = {}
    first_seen: dict[str, float] = {}
    latest: dict[str, int] = {}
    opened: dict[str, float] = {}
    faults: list[tuple[str, float, float]] = []
    for e in events:
        t = float(e["t"]) - t0
        i = min(size - 1, int(t / step))
        kind = e["e"]
        if kind == "receipted":
            (confirmed if e["status"] == "confirmed" else stored)[i] += 1
            latency[i] = max(latency[i], float(e.get("latency", 0.0)))
            receipted_at.setdefault(e["id"], t)
        elif kind == "received":
            first_seen.setdefault(e["id"], t)
        elif kind == "depth":
            latest[str(e["outbox"])] = int(e["n"])
            depth[i] = sum(latest.values())
            sampled[i] = True
        elif kind == "fault":
            if e["on"]:
                opened[e["name"]] = t
            elif e["name"] in opened:
                faults.append((e["name"], opened.pop(e["name"]), t))
    end = size * step
    faults.extend((name, start, end) for name, start in opened.items())
    # Outbox depth carries over buckets without a sample.
    for i in range(1, size):
        if not sampled[i]:
            depth[i] = depth[i - 1]
    recs = sorted(receipted_at.values())
    seen = sorted(t for mid, t in first_seen.items() if mid in receipted_at)
    for i in range(size):
        edge = (i + 1) * step
        unseen[i] = bisect.bisect_right(recs, edge) - bisect.bisect_right(seen, edge)
    return Series(t0, step, confirmed, stored, latency, depth, unseen, faults)
