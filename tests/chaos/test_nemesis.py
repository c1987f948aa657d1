"""A short slice of ``msgsafe nemesis`` per protocol: a minute of composed faults on a
cluster of its own, on a seed that changes with every run and is printed (with the
command that replays it), then the checker: lost = 0, unexpected = 0, per-key order,
every outbox empty, no fault action or worker failure.

The AMQP 1.0 slices (Qpid Broker-J, Artemis) start only clusters of their own, so they
run in the Kafka lane of ``make test`` (``lane`` marker), the shorter one.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from msgsafe.nemesis import history, schedule
from msgsafe.nemesis.runner import KINDS, Plan, replay_command, run

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

MINUTES = 1.0


def _seed(kind: str) -> int:
    """A seed from the clock whose minute holds at least one broker fault and three
    faults in all (a short schedule can draw fewer): a slice that injects nothing
    checks nothing."""
    seed = time.time_ns() % 2**31
    nodes = KINDS[kind]["nodes"]
    targets = {"broker": nodes, "producer": 3, "network": nodes if KINDS[kind]["proxied"] else 0}
    while True:
        windows = schedule.draw(seed, MINUTES * 60, targets).windows
        if len(windows) >= 3 and any(w.role == "broker" for w in windows):
            return seed
        seed += 1


@pytest.mark.parametrize(
    "kind",
    [
        "rabbitmq",
        "kafka",
        pytest.param("qpid", marks=pytest.mark.lane("kafka")),
        pytest.param("artemis", marks=pytest.mark.lane("kafka")),
    ],
)
def test_a_minute_of_composed_faults_loses_nothing(kind: str, tmp_path: Path) -> None:
    plan = Plan(kind=kind, minutes=MINUTES, seed=_seed(kind), dir=tmp_path / "run")
    print(f"nemesis {kind}: seed {plan.seed}; replay: {replay_command(plan)}")
    outcome = run(plan, say=print)
    v = outcome.verdict
    print(outcome.report()["verdict"])
    applied = [e for e in history.read_dir(plan.dir / "history") if e["e"] == "fault"]
    # Every window was applied and undone: the faults really happened.
    assert len(applied) == 2 * len(outcome.schedule.windows) >= 6
    assert v.receipted >= 1000, f"only {v.receipted} receipted in a minute"
    assert v.received >= v.receipted
    assert outcome.ok, (
        f"{v.problems() + outcome.notes}; examples {v.examples}; "
        f"replay: {replay_command(plan)}; files kept in {plan.dir}"
    )
    assert (plan.dir / "picture.svg").read_text().startswith("<svg")
    assert not (plan.dir / "cluster").exists(), "a passing run removes the cluster's files"
