"""A short slice of ``msgsafe nemesis`` per protocol: a minute of composed faults on a
cluster of its own, on a seed that changes with every run and is printed (with the
command that replays it), then the checker: lost = 0, unexpected = 0, per-key order,
every outbox empty, no fault action or worker failure. Run as root (as the suite is),
the minute may also fill a producer's outbox's disk, and on Kafka, RabbitMQ and Qpid move
a leader on purpose: those roles draw from generators of their own and add windows to
the same minute, never minutes to it.

The AMQP 1.0 slices (Qpid Broker-J, Artemis) start only clusters of their own, so they
run in the Kafka lane of ``make test`` (``lane`` marker), the shorter one, and so does the
slice of the shared PostgreSQL outbox: producers storing into a primary + synchronous
standby, ``msgsafe outbox forward`` processes draining it to a RabbitMQ node, the
primary killed and the standby promoted, forwarders killed and paused past their lease.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from msgsafe.nemesis import history, schedule
from msgsafe.nemesis.runner import (
    KINDS,
    Plan,
    fault_targets,
    keeps_brokers_files,
    replay_command,
    run,
)

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
    # A passing run removes the cluster's files, unless it recovered slowly.
    assert (plan.dir / "cluster").exists() == keeps_brokers_files(outcome)


def _pg_seed(plan: Plan) -> int:
    """A seed from the clock whose minute holds a fail-over of the database, a forwarder
    fault and a broker fault."""
    seed = time.time_ns() % 2**31
    while True:
        roles = {w.role for w in schedule.draw(seed, MINUTES * 60, fault_targets(plan)).windows}
        if {"database", "forwarder", "broker"} <= roles:
            return seed
        seed += 1


@pytest.mark.lane("kafka")
def test_a_minute_of_composed_faults_through_a_shared_postgres_outbox_loses_nothing(
    tmp_path: Path,
) -> None:
    # One RabbitMQ node: a broker fault is an outage, so the forwarders carry the
    # backlog the producers stored; the database and forwarder faults land on it.
    shape = Plan(
        kind="rabbitmq", minutes=MINUTES, seed=0, dir=tmp_path / "run", nodes=1, outbox="postgres"
    )
    plan = dataclasses.replace(shape, seed=_pg_seed(shape))
    print(f"nemesis rabbitmq + postgres outbox: seed {plan.seed}; replay: {replay_command(plan)}")
    outcome = run(plan, say=print)
    v = outcome.verdict
    print(outcome.report()["verdict"])
    events = history.read_dir(plan.dir / "history")
    applied = [e for e in events if e["e"] == "fault"]
    assert len(applied) == 2 * len(outcome.schedule.windows)
    assert {e["name"].split("-")[0] for e in applied} >= {"database", "forwarder", "broker"}
    assert v.receipted >= 1000, f"only {v.receipted} receipted in a minute"
    assert v.stored > 0, "nothing went through the shared outbox"
    # The runner sampled the shared table: the recovery is measured on it.
    assert any(e["e"] == "depth" and e["outbox"] == "pg" for e in events)
    assert outcome.ok, (
        f"{v.problems() + outcome.notes}; examples {v.examples}; "
        f"replay: {replay_command(plan)}; files kept in {plan.dir}"
    )
    assert v.recovery_s is not None
    assert not (plan.dir / "pg").exists(), "a passing run removes the database's files"
