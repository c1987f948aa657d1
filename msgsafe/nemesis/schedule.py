"""The fault schedule of a nemesis run, drawn from a seed: pure, no I/O, no clock.

A schedule is a list of :class:`Window`: one fault (``action``) on one ``target`` from
``start`` to ``end`` seconds after the run began. Faults are grouped by the **role** they
hit (``broker``: a node of the cluster; ``producer``: a producer process; ``network``: the
link between the clients and one node; with a PostgreSQL outbox, ``database``: its
primary, killed and replaced by its standby, and ``forwarder``: a forwarder process;
``disk``: the size-limited mount under a producer's outbox, filled; ``leader``: a node
that partition or queue leadership is moved to on purpose).
Within a role at most ``bound`` windows overlap (:data:`BOUNDS`); windows of different
roles overlap freely, which is the point: a node killed while a producer restarts on a
slow link. Some periods are **quiet** (no fault at
all) so that a run shows recovery between storms, and the last ``tail`` seconds are quiet
too, before the runner heals and checks.

The same ``(seed, duration, faults, targets)`` always gives the same schedule
(:func:`draw` uses its own :class:`random.Random`), which is what makes a failing run
replayable with ``msgsafe nemesis KIND --seed S``.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["ACTIONS", "BOUNDS", "FIRST_ROLES", "Schedule", "Window", "draw", "overlap"]

#: Every fault action, by the role it hits.
ACTIONS: dict[str, tuple[str, ...]] = {
    "broker": ("kill", "pause"),
    "producer": ("kill", "pause"),
    "network": (
        "blackhole",
        "blackhole-to-broker",
        "blackhole-to-client",
        "latency",
        "bandwidth",
        "reset",
    ),
    # A run with a PostgreSQL outbox: the primary SIGKILLed and the standby promoted (its
    # end: the old primary rebuilt as the new one's standby).
    "database": ("failover",),
    "forwarder": ("kill", "pause"),
    # A producer's outbox on a size-limited mount, filled (its end frees it).
    "disk": ("full",),
    # Partition or queue leadership moved to another node by the brokers' own tools (its
    # end moves it back).
    "leader": ("move",),
}

#: The roles of the first schedules, drawn one after another from the seed's own
#: generator. A role added later draws from a generator of its own (seed and role), so
#: that adding it leaves every earlier seed's windows as they were (a seed in the
#: evidence tables replays the same faults, plus the new roles' ones).
FIRST_ROLES = frozenset({"broker", "database", "forwarder", "network", "producer"})

#: How many faults of one role may be in effect at once. NOTE: one broker at a time
#: keeps a majority of a 3-node cluster up (quorum queues and a KRaft quorum need two of
#: three); the promise under a lost majority is STORED, which the other roles already show.
BOUNDS: dict[str, int] = {
    "broker": 1,
    "producer": 1,
    "network": 1,
    "database": 1,
    "forwarder": 1,
    "disk": 1,
    "leader": 1,
}

#: Seconds each fault lasts (drawn uniformly in this range), by action.
LENGTHS: dict[str, tuple[float, float]] = {
    "kill": (4.0, 15.0),
    "pause": (3.0, 12.0),
    "blackhole": (3.0, 10.0),
    "blackhole-to-broker": (3.0, 10.0),
    "blackhole-to-client": (3.0, 10.0),
    "latency": (4.0, 12.0),
    "bandwidth": (4.0, 12.0),
    "reset": (1.0, 3.0),
    "failover": (8.0, 20.0),
    "full": (5.0, 15.0),
    "move": (8.0, 20.0),
}


@dataclass(frozen=True, slots=True)
class Window:
    """One fault: ``action`` on ``role`` ``target`` (an index) over ``[start, end)`` s."""

    role: str
    action: str
    target: int
    start: float
    end: float

    @property
    def name(self) -> str:
        """``broker-kill 1``: how reports and the picture label it."""
        return f"{self.role}-{self.action} {self.target}"


@dataclass(frozen=True, slots=True)
class Schedule:
    """What :func:`draw` made, with what it was made from."""

    seed: int
    duration: float
    windows: tuple[Window, ...]
    quiet: tuple[tuple[float, float], ...]
    bounds: Mapping[str, int] = field(default_factory=lambda: dict(BOUNDS))
    #: What the faults mean on the cluster's shape, and the faults it cannot take (and
    #: why they are not drawn), one sentence a line: the report states them.
    description: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``report.json``'s ``schedule``)."""
        return {
            "seed": self.seed,
            "duration": self.duration,
            "bounds": dict(self.bounds),
            "description": list(self.description),
            "quiet": [list(q) for q in self.quiet],
            "windows": [asdict(w) for w in self.windows],
        }

    def events(self) -> list[tuple[float, bool, Window]]:
        """Each window's start (True) and end (False), in time order; at one instant,
        ends before starts, so a target is healed before it is broken again."""
        points = [(w.start, True, w) for w in self.windows] + [
            (w.end, False, w) for w in self.windows
        ]
        return sorted(points, key=lambda p: (p[0], p[1]))


def overlap(windows: Sequence[Window], role: str) -> int:
    """The most windows of ``role`` in effect at one instant."""
    points = sorted(
        [(w.start, 1) for w in windows if w.role == role]
        + [(w.end, -1) for w in windows if w.role == role]
    )
    most = now = 0
    for _, step in points:
        now += step
        most = max(most, now)
    return most


def draw(
    seed: int,
    duration: float,
    targets: Mapping[str, int],
    *,
    actions: Mapping[str, Sequence[str]] | None = None,
    bounds: Mapping[str, int] | None = None,
    warmup: float = 5.0,
    tail: float = 5.0,
    quiet_share: float = 0.2,
    description: Sequence[str] = (),
) -> Schedule:
    """A schedule of ``duration`` seconds for the roles in ``targets`` (role -> how many
    targets: nodes, producers, proxied links; a role with 0 targets gets no fault).

    ``actions``: the actions allowed per role (default :data:`ACTIONS`); ``bounds``: the
    most overlapping windows per role (default :data:`BOUNDS`). No fault in the first
    ``warmup`` or last ``tail`` seconds, nor in the quiet periods (about ``quiet_share``
    of the time, in pieces of 5-20 s). ``description`` is carried into the schedule
    as it is (it does not change the draw).
    """
    if duration <= warmup + tail:
        raise ValueError(f"duration {duration} s leaves no time between warmup and tail")
    rng = random.Random(seed)
    allowed = {role: tuple(a) for role, a in (actions or ACTIONS).items()}
    limit = dict(bounds or BOUNDS)
    quiet = _quiet_periods(rng, warmup, duration - tail, quiet_share)
    windows: list[Window] = []
    # Sorted: the draw order, hence the schedule, must not depend on a dict's order.
    for role in sorted(targets):
        count, choices = targets[role], allowed.get(role, ())
        if count <= 0 or not choices:
            continue
        own = rng if role in FIRST_ROLES else random.Random(f"{seed}:{role}")
        for _lane in range(limit.get(role, 1)):
            windows.extend(_lane_windows(own, role, choices, count, warmup, duration - tail))
    kept = [w for w in windows if not any(_meets(w, q) for q in quiet)]
    kept = _no_shared_target(kept)
    kept = _no_move_to_a_broken_node(kept)
    kept.sort(key=lambda w: (w.start, w.role, w.target))
    return Schedule(seed, duration, tuple(kept), tuple(quiet), limit, tuple(description))


def _quiet_periods(
    rng: random.Random, begin: float, end: float, share: float
) -> list[tuple[float, float]]:
    periods: list[tuple[float, float]] = []
    budget = (end - begin) * share
    t = begin
    while budget > 0 and t < end:
        t += rng.uniform(10.0, 40.0)
        length = min(rng.uniform(5.0, 20.0), budget, max(0.0, end - t))
        if length <= 0:
            break
        periods.append((round(t, 3), round(t + length, 3)))
        budget -= length
        t += length
    return periods


def _lane_windows(
    rng: random.Random,
    role: str,
    choices: Sequence[str],
    count: int,
    begin: float,
    end: float,
) -> list[Window]:
    """One lane of ``role``: windows one after another, with gaps between them."""
    out: list[Window] = []
    t = begin + rng.uniform(0.0, 5.0)
    while True:
        action = rng.choice(list(choices))
        low, high = LENGTHS.get(action, (3.0, 10.0))
        length = rng.uniform(low, high)
        target = rng.randrange(count)
        if t + length > end:
            return out
        out.append(Window(role, action, target, round(t, 3), round(t + length, 3)))
        t += length + rng.uniform(2.0, 15.0)


def _no_move_to_a_broken_node(windows: list[Window]) -> list[Window]:
    """Drop a leader move whose node (its target) a broker window breaks while the move
    is in effect: leadership cannot be handed to a killed or frozen node. The broker
    window stays, so the other roles' windows never depend on the leader's."""
    brokers = [w for w in windows if w.role == "broker"]
    return [
        w
        for w in windows
        if w.role != "leader"
        or not any(b.target == w.target and b.start < w.end and w.start < b.end for b in brokers)
    ]


def _meets(w: Window, period: tuple[float, float]) -> bool:
    return w.start < period[1] and period[0] < w.end


def _no_shared_target(windows: list[Window]) -> list[Window]:
    """Drop a window whose target is already broken by an earlier window of its role
    (two lanes of one role never hit one node at once: a pause of a killed node means
    nothing)."""
    kept: list[Window] = []
    for w in sorted(windows, key=lambda w: (w.start, w.role, w.target, w.action)):
        if not any(
            k.role == w.role and k.target == w.target and k.start < w.end and w.start < k.end
            for k in kept
        ):
            kept.append(w)
    return kept
