"""The pure parts of ``msgsafe nemesis``: the seeded schedule, the history reader, the
checker (each invariant fails on a history that breaks it) and the SVG picture."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from msgsafe.nemesis import checker, history, picture, schedule

TARGETS = {"broker": 3, "producer": 2, "network": 3}


@pytest.fixture(autouse=True)
def _mounts_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plans resolve their disk faults as on a machine where the runner is root (the
    answer is a plan's; a test that needs the other one says so)."""
    from msgsafe.nemesis import runner

    monkeypatch.setattr(runner, "can_mount", lambda: True)


# --- schedule ---------------------------------------------------------------------------


def test_the_same_seed_gives_the_same_schedule() -> None:
    a = schedule.draw(1234, 600, TARGETS)
    b = schedule.draw(1234, 600, dict(reversed(list(TARGETS.items()))))
    assert a == b
    assert a.to_json() == json.loads(json.dumps(a.to_json()))
    assert len(a.windows) > 20


def test_other_seeds_give_other_schedules() -> None:
    drawn = {schedule.draw(seed, 300, TARGETS).windows for seed in range(10)}
    assert len(drawn) == 10


@pytest.mark.parametrize("seed", range(25))
def test_overlap_stays_within_each_roles_bound(seed: int) -> None:
    bounds = {"broker": 1, "producer": 1, "network": 2}
    drawn = schedule.draw(seed, 900, TARGETS, bounds=bounds)
    for role, bound in bounds.items():
        assert 0 < schedule.overlap(drawn.windows, role) <= bound, role
    # Roles overlap each other: composed faults, not one at a time.
    roles_at_once = max(
        len({w.role for w in drawn.windows if w.start <= t < w.end}) for t in range(900)
    )
    assert roles_at_once >= 2


def test_a_bound_of_two_is_reached() -> None:
    bounds = {"broker": 1, "producer": 1, "network": 2}
    reached = [
        schedule.overlap(schedule.draw(seed, 900, TARGETS, bounds=bounds).windows, "network")
        for seed in range(10)
    ]
    assert 2 in reached


@pytest.mark.parametrize("seed", range(25))
def test_quiet_periods_warmup_and_tail_have_no_fault(seed: int) -> None:
    drawn = schedule.draw(seed, 600, TARGETS, warmup=10, tail=20)
    assert drawn.quiet, "a run of 10 minutes has quiet periods"
    for w in drawn.windows:
        assert 10 <= w.start < w.end <= 580
        assert w.action in schedule.ACTIONS[w.role]
        for start, end in drawn.quiet:
            assert w.end <= start or end <= w.start, (w, (start, end))
    # No target is hit by two windows of its role at once.
    for a in drawn.windows:
        for b in drawn.windows:
            if a is not b and (a.role, a.target) == (b.role, b.target):
                assert a.end <= b.start or b.end <= a.start


def test_a_role_without_targets_gets_no_fault() -> None:
    drawn = schedule.draw(7, 300, {"broker": 3, "network": 0})
    assert {w.role for w in drawn.windows} == {"broker"}


def test_events_end_before_start_at_one_instant() -> None:
    w1 = schedule.Window("broker", "kill", 0, 5.0, 10.0)
    w2 = schedule.Window("broker", "pause", 0, 10.0, 12.0)
    drawn = schedule.Schedule(1, 20.0, (w1, w2), ())
    assert [(t, on) for t, on, _ in drawn.events()] == [
        (5.0, True),
        (10.0, False),
        (10.0, True),
        (12.0, False),
    ]


def test_too_short_a_run_is_refused() -> None:
    with pytest.raises(ValueError, match="no time"):
        schedule.draw(1, 8, TARGETS)


# --- history ----------------------------------------------------------------------------


def test_history_is_read_back_in_time_order_and_a_torn_line_is_skipped(tmp_path: Path) -> None:
    with history.History(tmp_path / "p0.jsonl", "p0") as h:
        h.write("attempted", id="a", key="k", seq=0)
        h.write("receipted", id="a", status="confirmed", latency=0.01)
    with (tmp_path / "p0.jsonl").open("a") as f:
        f.write('{"t": 1e12, "p": "p0", "e": "attem')  # killed mid-line
    with history.History(tmp_path / "c.jsonl", "c") as h:
        h.write("received", id="a")
    events = history.read_dir(tmp_path)
    assert [e["e"] for e in events] == ["attempted", "receipted", "received"]
    assert [e["p"] for e in events] == ["p0", "p0", "c"]


# --- checker ----------------------------------------------------------------------------


class Run:
    """A synthetic history, one event per call, one second apart."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.t = 1000.0

    def add(self, e: str, **fields: Any) -> Run:
        self.t += 1.0
        self.events.append({"t": self.t, "p": "x", "e": e, **fields})
        return self

    def sent(self, mid: str, key: str, seq: int, status: str = "confirmed") -> Run:
        self.add("attempted", id=mid, key=key, seq=seq)
        return self.add("receipted", id=mid, status=status, latency=0.5)


def _clean() -> Run:
    run = Run()
    for seq in range(3):
        run.sent(f"a{seq}", "k1", seq)
        run.sent(f"b{seq}", "k2", seq, status="stored")
    run.add("depth", outbox="p0", n=3)
    run.add("fault", name="broker-kill 0", on=True).add("fault", name="broker-kill 0", on=False)
    run.add("heal")
    run.add("depth", outbox="p0", n=0)
    for seq in range(3):
        run.add("received", id=f"a{seq}").add("received", id=f"b{seq}")
    return run


def test_a_clean_history_passes() -> None:
    verdict, series = checker.check(_clean().events)
    assert verdict.ok, verdict.problems()
    assert (verdict.receipted, verdict.confirmed, verdict.stored) == (6, 3, 3)
    assert (verdict.lost, verdict.unexpected, verdict.duplicates) == (0, 0, 0)
    assert verdict.recovery_s == 2.0  # from the fault's end to the empty outbox
    assert sum(series.confirmed) == 3 and sum(series.stored) == 3
    assert series.unseen[-1] == 0 and max(series.unseen) == 6
    assert max(series.depth) == 3 and series.depth[-1] == 0
    assert [f[0] for f in series.faults] == ["broker-kill 0"]


def test_a_lost_message_fails() -> None:
    run = _clean()
    run.sent("c0", "k3", 0)
    verdict, _ = checker.check(run.events)
    assert not verdict.ok
    assert verdict.lost == 1 and verdict.examples["lost"] == ["c0"]


def test_an_unexpected_message_fails() -> None:
    verdict, _ = checker.check(_clean().add("received", id="zz").events)
    assert not verdict.ok and verdict.unexpected == 1


def test_duplicates_are_counted_and_a_duplicate_of_an_unknown_id_fails() -> None:
    verdict, _ = checker.check(_clean().add("received", id="a1").add("received", id="a1").events)
    assert verdict.ok and verdict.duplicates == 2
    verdict, _ = checker.check(_clean().add("received", id="q").add("received", id="q").events)
    assert not verdict.ok and verdict.duplicates == 1 and verdict.unexpected == 1


def test_a_reorder_within_a_key_fails_but_a_redelivery_does_not() -> None:
    run = Run()
    for seq in range(3):
        run.sent(f"a{seq}", "k1", seq)
    run.add("received", id="a0").add("received", id="a2").add("received", id="a1")
    verdict, _ = checker.check(run.events)
    assert not verdict.ok and verdict.order_violations == 1
    assert verdict.examples["order"] == ["a1"]
    run = Run()
    for seq in range(3):
        run.sent(f"a{seq}", "k1", seq)
    for mid in ("a0", "a1", "a2", "a0"):  # a0 again: a duplicate, not a reorder
        run.add("received", id=mid)
    verdict, _ = checker.check(run.events)
    assert verdict.ok and verdict.duplicates == 1


def test_an_outbox_not_empty_at_the_end_fails() -> None:
    run = Run().sent("a0", "k", 0).add("received", id="a0")
    run.add("depth", outbox="p0", n=0).add("depth", outbox="p1", n=2).add("heal")
    run.add("depth", outbox="p0", n=0)
    verdict, _ = checker.check(run.events)
    assert not verdict.ok and verdict.recovery_s is None


def test_recovery_counts_until_the_outboxes_are_empty_for_good() -> None:
    run = Run().sent("a0", "k", 0).add("received", id="a0")
    run.add("fault", name="broker-kill 0", on=True).add("fault", name="broker-kill 0", on=False)
    run.add("depth", outbox="p0", n=0).add("depth", outbox="p1", n=2)  # empty, then not
    run.add("depth", outbox="p1", n=0)  # empty for good: 3 s after the fault's end
    run.add("heal").add("depth", outbox="p0", n=0)
    verdict, _ = checker.check(run.events)
    assert verdict.ok and verdict.recovery_s == 3.0


def test_the_slowest_recovery_after_any_fault_is_counted() -> None:
    run = Run().sent("a0", "k", 0).add("received", id="a0")
    run.add("fault", name="broker-kill 0", on=True).add("depth", outbox="p0", n=5)
    run.add("fault", name="broker-kill 0", on=False)  # t=1006
    run.add("depth", outbox="p0", n=3).add("depth", outbox="p0", n=1)
    run.add("depth", outbox="p0", n=0)  # t=1009: 3 s after that fault's end
    run.add("fault", name="network-reset 1", on=True)
    run.add("fault", name="network-reset 1", on=False).add("depth", outbox="p0", n=0)
    verdict, _ = checker.check(run.events)
    # Empty since before the last fault ended: 0 from its end.
    assert verdict.recovery_s == 0.0 and verdict.worst_recovery_s == 3.0


def test_nothing_receipted_fails() -> None:
    verdict, _ = checker.check(Run().add("attempted", id="a", key="k", seq=0).events)
    assert not verdict.ok and verdict.cut_short == 1


# --- picture ----------------------------------------------------------------------------


def test_the_picture_is_svg_with_every_fault_shaded_and_named() -> None:
    run = _clean()
    run.add("fault", name="network-latency 1", on=True)  # still open at the end
    _, series = checker.check(run.events)
    text = picture.svg(series, title="rabbitmq seed 1 <&>")
    root = ET.fromstring(text)
    ns = "{http://www.w3.org/2000/svg}"
    shaded = [r for r in root.iter(f"{ns}rect") if r.get("class") == "fault"]
    assert len(shaded) == 2
    names = [t.text for t in root.iter(f"{ns}text")]
    assert "broker-kill 0" in names and "network-latency 1" in names
    assert "rabbitmq seed 1 <&>" in names
    lines = {p.get("class") for p in root.iter(f"{ns}polyline")}
    assert lines == {"confirmed", "stored", "latency", "depth", "unseen"}


def test_the_picture_of_an_empty_history_is_still_svg() -> None:
    _, series = checker.check([])
    ET.fromstring(picture.svg(series, title="empty"))


# --- the command and the workers, without a broker -----------------------------------------


def test_an_unsupported_kind_is_a_usage_error() -> None:
    from typer.testing import CliRunner

    from msgsafe.cli.app import app

    result = CliRunner().invoke(app, ["nemesis", "nats", "--seed", "1"])
    assert result.exit_code == 2
    words = " ".join(result.output.replace("│", " ").split())
    assert "unknown kind 'nats' (known: artemis, kafka, qpid, rabbitmq)" in words


def test_the_description_is_carried_into_the_schedule_and_changes_no_fault() -> None:
    plain = schedule.draw(77, 300, TARGETS)
    described = schedule.draw(77, 300, TARGETS, description=["a pair: no third voter"])
    assert described.windows == plain.windows and described.quiet == plain.quiet
    assert described.to_json()["description"] == ["a pair: no third voter"]
    assert plain.to_json()["description"] == []


def test_every_kind_states_its_limits_and_the_amqp10_clients_keep_to_the_proxies() -> None:
    from msgsafe.nemesis.runner import KINDS, Plan

    assert set(KINDS) == {"rabbitmq", "kafka", "qpid", "artemis"}
    for kind, setup in KINDS.items():
        assert setup["limits"] and all(isinstance(line, str) for line in setup["limits"]), kind
    for kind in ("qpid", "artemis"):
        # An advertised node address would let a producer bypass its proxy.
        assert KINDS[kind]["options"]["failover_merge"] == "ignore"
    # Artemis's split brain under a long pause is stated, and no pause is drawn that long.
    assert any("split brain" in line for line in KINDS["artemis"]["limits"])
    assert schedule.LENGTHS["pause"][1] < 30.0
    assert Plan(kind="artemis", minutes=1, seed=1, dir=Path("/x")).nodes == 2
    assert Plan(kind="qpid", minutes=1, seed=1, dir=Path("/x")).nodes == 3
    assert Plan(kind="qpid", minutes=1, seed=1, dir=Path("/x"), nodes=5).nodes == 5


def test_the_replay_command_names_the_seed_and_what_differs() -> None:
    from msgsafe.nemesis.runner import Plan, replay_command

    plan = Plan(kind="rabbitmq", minutes=1.5, seed=99, dir=Path("/x"))
    assert replay_command(plan) == "msgsafe nemesis rabbitmq --minutes 1.5 --seed 99"
    plan = Plan(kind="kafka", minutes=2, seed=7, dir=Path("/x"), producers=2)
    assert replay_command(plan) == "msgsafe nemesis kafka --minutes 2 --seed 7 --producers 2"


def test_a_restarted_producer_takes_up_each_keys_sequence(tmp_path: Path) -> None:
    from msgsafe.nemesis.worker import next_seqs

    with history.History(tmp_path / "p0.0.jsonl", "p0") as h:
        h.write("attempted", id="a", key="p0-k0", seq=0)
        h.write("attempted", id="b", key="p0-k1", seq=0)
        h.write("attempted", id="c", key="p0-k0", seq=1)
    with history.History(tmp_path / "p0.1.jsonl", "p0") as h:
        h.write("attempted", id="d", key="p0-k0", seq=2)
    paths = [tmp_path / "p0.0.jsonl", tmp_path / "p0.1.jsonl", tmp_path / "gone.jsonl"]
    assert next_seqs(paths) == {"p0-k0": 3, "p0-k1": 1}


def test_the_command_exits_1_on_a_failed_invariant_and_prints_the_replay(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from msgsafe.cli import nemesis as command
    from msgsafe.cli.app import app
    from msgsafe.nemesis.runner import Outcome, Plan

    def fake_run(plan: Plan, say: Any) -> Outcome:
        run = _clean()
        if plan.seed == 5:
            run.sent("c0", "k3", 0)  # receipted, never received
        verdict, _ = checker.check(run.events)
        return Outcome(plan, verdict, schedule.draw(plan.seed, 60, TARGETS))

    monkeypatch.setattr(command, "run", fake_run)
    failed = CliRunner().invoke(app, ["nemesis", "kafka", "--seed", "5", "--dir", str(tmp_path)])
    assert failed.exit_code == 1
    assert "lost=1" in failed.output
    assert "replay: msgsafe nemesis kafka --minutes 2 --seed 5" in failed.output
    passed = CliRunner().invoke(
        app, ["nemesis", "kafka", "--seed", "6", "--json", "--dir", str(tmp_path)]
    )
    assert passed.exit_code == 0
    report = json.loads(passed.output)
    assert report["ok"] and report["verdict"]["lost"] == 0
    assert report["replay"] == "msgsafe nemesis kafka --minutes 2 --seed 6"


def test_the_evidence_table_has_a_row_per_report_and_says_no_on_a_loss() -> None:
    from msgsafe.nemesis.runner import Outcome, Plan
    from msgsafe.nemesis.table import HEADER, table

    drawn = schedule.draw(3, 120, {"broker": 2, "producer": 3, "network": 2})
    clean, _ = checker.check(_clean().events)
    lossy = _clean()
    lossy.sent("c0", "k3", 0)
    lost, _ = checker.check(lossy.events)
    reports = [
        json.loads(json.dumps(Outcome(Plan("artemis", 2, seed, Path("/x")), v, drawn).report()))
        for seed, v in ((3, clean), (4, lost))
    ]
    lines = table(reports).splitlines()
    assert lines[:2] == HEADER.splitlines() and len(lines) == 4
    roles = [sum(w.role == r for w in drawn.windows) for r in ("broker", "producer", "network")]
    faults = f"{len(drawn.windows)} ({roles[0]} / {roles[1]} / {roles[2]})"
    assert lines[2] == (
        f"| artemis | 3 | 2 | {faults} | 6 (3 / 3) | 6 | 0 | 0 | 0 | 0 | 2.0 / 2.0 | yes | ? |"
    )
    assert lines[3].startswith("| artemis | 4 |") and "| 7 (4 / 3) | 6 | 1 |" in lines[3]
    assert lines[3].endswith("| NO | ? |")


def test_every_network_action_is_its_own_proxy_fault(tmp_path: Path) -> None:
    from msgsafe.nemesis.runner import Plan, _Run

    class Proxy:
        def __init__(self) -> None:
            self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

        def __getattr__(self, name: str) -> Any:
            return lambda *args, **kwargs: self.calls.append((name, args, kwargs))

    r = _Run(Plan(kind="qpid", minutes=1, seed=1, dir=tmp_path), lambda _: None)
    r.cluster = object()  # type: ignore[assignment]
    r.proxies = [Proxy()]  # type: ignore[list-item]
    applied = {}
    with history.History(tmp_path / "runner.jsonl", "runner") as own:
        r.own = own
        for action in schedule.ACTIONS["network"]:
            proxy = r.proxies[0]
            proxy.calls.clear()  # type: ignore[attr-defined]
            w = schedule.Window("network", action, 0, 1.0, 2.0)
            r.apply(w, True)
            applied[action] = proxy.calls[-1]  # type: ignore[attr-defined]
            r.apply(w, False)
            assert proxy.calls[-1][0] == "heal"  # type: ignore[attr-defined]
    assert applied["blackhole"] == ("blackhole", (), {})
    assert applied["blackhole-to-broker"] == ("blackhole", (), {"direction": "upstream"})
    assert applied["blackhole-to-client"] == ("blackhole", (), {"direction": "downstream"})
    assert len({repr(call) for call in applied.values()}) == len(applied)


# --- the shared PostgreSQL outbox ---------------------------------------------------------


def test_a_postgres_outbox_adds_database_and_forwarder_faults_within_their_bounds() -> None:
    from msgsafe.nemesis.runner import PG_LEASE_S, Plan, fault_targets

    plan = Plan("rabbitmq", 5, 11, Path("/x"), outbox="postgres", forwarders=3)
    targets = fault_targets(plan)
    assert targets == {
        "broker": 3,
        "producer": 3,
        "network": 3,
        "database": 1,
        "forwarder": 3,
        "leader": 1,
    }
    drawn = schedule.draw(plan.seed, 300, targets)
    assert drawn == schedule.draw(plan.seed, 300, targets)  # replayable
    roles = {w.role for w in drawn.windows}
    assert {"database", "forwarder"} <= roles
    for role in ("database", "forwarder"):
        assert schedule.overlap(drawn.windows, role) <= schedule.BOUNDS[role] == 1
    failovers = [w for w in drawn.windows if w.role == "database"]
    assert {w.action for w in failovers} == {"failover"} and {w.target for w in failovers} == {0}
    forwarders = [w for w in drawn.windows if w.role == "forwarder"]
    assert {w.action for w in forwarders} == {"kill", "pause"}
    assert {w.target for w in forwarders} <= {0, 1, 2}
    # Every forwarder pause outlasts the lease: its keys are taken over meanwhile.
    assert all(w.end - w.start > PG_LEASE_S for w in forwarders if w.action == "pause")
    assert schedule.LENGTHS["pause"][0] > PG_LEASE_S


def test_an_sqlite_run_draws_no_database_or_forwarder_fault() -> None:
    from msgsafe.nemesis.runner import Plan, fault_targets

    plan = Plan("kafka", 5, 11, Path("/x"))
    assert fault_targets(plan) == {
        "broker": 3,
        "producer": 3,
        "network": 3,
        "disk": 3,
        "leader": 3,
    }
    drawn = schedule.draw(plan.seed, 300, fault_targets(plan))
    assert not {w.role for w in drawn.windows} & {"database", "forwarder"}


def test_a_plan_refuses_an_unknown_outbox_and_a_postgres_one_without_forwarders() -> None:
    from msgsafe.nemesis.runner import Plan

    with pytest.raises(ValueError, match="unknown outbox 'redis'"):
        Plan("rabbitmq", 1, 1, Path("/x"), outbox="redis")
    with pytest.raises(ValueError, match="at least one forwarder"):
        Plan("rabbitmq", 1, 1, Path("/x"), outbox="postgres", forwarders=0)


def test_the_replay_command_names_the_outbox_its_forwarders_and_the_nodes() -> None:
    from msgsafe.nemesis.runner import Plan, replay_command

    plan = Plan("rabbitmq", 1, 9, Path("/x"), outbox="postgres")
    assert replay_command(plan) == "msgsafe nemesis rabbitmq --minutes 1 --seed 9 --outbox postgres"
    plan = Plan("rabbitmq", 1, 9, Path("/x"), nodes=1, outbox="postgres", forwarders=3)
    assert replay_command(plan) == (
        "msgsafe nemesis rabbitmq --minutes 1 --seed 9 --nodes 1 --outbox postgres --forwarders 3"
    )


def test_the_command_passes_the_outbox_forwarders_and_nodes_to_the_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from msgsafe.cli import nemesis as command
    from msgsafe.cli.app import app
    from msgsafe.nemesis.runner import Outcome, Plan, fault_targets

    plans: list[Plan] = []

    def fake_run(plan: Plan, say: Any) -> Outcome:
        plans.append(plan)
        verdict, _ = checker.check(_clean().events)
        return Outcome(plan, verdict, schedule.draw(plan.seed, 60, fault_targets(plan)))

    monkeypatch.setattr(command, "run", fake_run)
    argv = ["nemesis", "rabbitmq", "--seed", "4", "--dir", str(tmp_path), "--json"]
    result = CliRunner().invoke(
        app, [*argv, "--outbox", "postgres", "--forwarders", "3", "--nodes", "1"]
    )
    assert result.exit_code == 0, result.output
    assert (plans[0].outbox, plans[0].forwarders, plans[0].nodes) == ("postgres", 3, 1)
    report = json.loads(result.output)
    assert report["replay"].endswith("--nodes 1 --outbox postgres --forwarders 3")
    refused = CliRunner().invoke(app, [*argv, "--outbox", "redis"])
    assert refused.exit_code == 2
    assert "unknown outbox 'redis'" in " ".join(refused.output.replace("│", " ").split())


def test_the_evidence_table_names_a_postgres_outbox_and_its_faults() -> None:
    from msgsafe.nemesis.runner import Outcome, Plan, fault_targets
    from msgsafe.nemesis.table import row

    plan = Plan("rabbitmq", 5, 11, Path("/x"), outbox="postgres")
    drawn = schedule.draw(plan.seed, 300, fault_targets(plan))
    clean, _ = checker.check(_clean().events)
    line = row(json.loads(json.dumps(Outcome(plan, clean, drawn).report())))
    count = {r: sum(w.role == r for w in drawn.windows) for r in fault_targets(plan)}
    assert line.startswith("| rabbitmq + postgres outbox | 11 | 5 | ")
    leader = f", leader {count['leader']}" if count["leader"] else ""
    assert (
        f"({count['broker']} / {count['producer']} / {count['network']}; "
        f"database {count['database']}, forwarder {count['forwarder']}{leader}) |"
    ) in line


def test_a_late_action_delays_the_rest_so_no_window_is_cut_short(tmp_path: Path) -> None:
    from msgsafe.nemesis.runner import Plan, _Run

    r = _Run(Plan(kind="rabbitmq", minutes=1, seed=1, dir=tmp_path), lambda _: None)
    clock = [0.0]
    done: list[tuple[float, str, bool]] = []

    def wait_until(t: float) -> None:
        clock[0] = max(clock[0], t)

    def apply(w: schedule.Window, on: bool) -> None:
        done.append((clock[0], w.name, on))
        if w.role == "broker" and not on:
            clock[0] += 6.0  # a restart that takes 6 s

    r.wait_until = wait_until  # type: ignore[method-assign]
    r.elapsed = lambda: clock[0]  # type: ignore[method-assign]
    r.apply = apply  # type: ignore[method-assign]
    kill = schedule.Window("broker", "kill", 0, 5.0, 10.0)
    pause = schedule.Window("forwarder", "pause", 1, 12.0, 15.0)
    reset = schedule.Window("network", "reset", 0, 13.0, 14.0)
    behind = r.play(schedule.Schedule(1, 60, (kill, pause, reset), ()).events())
    # The restart ended at 16 s, 4 s after the pause was due: what follows waits 4 s,
    # and the pause and the reset keep their lengths and their order.
    assert behind == 4.0
    assert done == [
        (5.0, "broker-kill 0", True),
        (10.0, "broker-kill 0", False),
        (16.0, "forwarder-pause 1", True),
        (17.0, "network-reset 0", True),
        (18.0, "network-reset 0", False),
        (19.0, "forwarder-pause 1", False),
    ]


def test_database_and_forwarder_windows_fail_over_and_signal_the_forwarder(
    tmp_path: Path,
) -> None:
    import signal

    from msgsafe.nemesis.runner import Plan, _Run

    class Pg:
        primary = 0

        def __init__(self) -> None:
            self.calls: list[tuple[str, int]] = []
            self.down: set[int] = set()

        def kill(self, node: int) -> None:
            self.calls.append(("kill", node))
            self.down.add(node)

        def promote(self, node: int) -> None:
            self.calls.append(("promote", node))
            self.primary = node

        def restart(self, node: int) -> None:
            self.calls.append(("restart", node))
            self.down.discard(node)

        def nodes(self) -> list[Any]:
            from msgsafe.cluster.base import NodeInfo

            return [
                NodeInfo(f"pg{i}", None, "127.0.0.1", 1, i not in self.down, None) for i in range(2)
            ]

    class Proc:
        def __init__(self) -> None:
            self.signals: list[int] = []

        def send_signal(self, sig: int) -> None:
            self.signals.append(sig)

        def wait(self) -> int:
            return -9

    plan = Plan(kind="rabbitmq", minutes=1, seed=1, dir=tmp_path, outbox="postgres")
    r = _Run(plan, lambda _: None)
    r.cluster = object()  # type: ignore[assignment]
    pg = Pg()
    r.pg = pg  # type: ignore[assignment]
    spawned: list[str] = []
    r.spawn = spawned.append  # type: ignore[method-assign]
    f1 = Proc()
    r.workers["f1"] = f1  # type: ignore[assignment]
    with history.History(tmp_path / "runner.jsonl", "runner") as own:
        r.own = own
        failover = schedule.Window("database", "failover", 0, 1.0, 2.0)
        r.apply(failover, True)
        r.apply(failover, False)
        r.apply(failover, True)  # the second fail-over goes back to pg0
        assert pg.calls == [
            ("kill", 0),
            ("promote", 1),
            ("restart", 0),
            ("kill", 1),
            ("promote", 0),
        ]
        pause = schedule.Window("forwarder", "pause", 1, 1.0, 5.0)
        r.apply(pause, True)
        r.apply(pause, False)
        assert f1.signals == [signal.SIGSTOP, signal.SIGCONT]
        kill = schedule.Window("forwarder", "kill", 1, 1.0, 5.0)
        r.apply(kill, True)
        r.apply(kill, False)
        assert f1.signals[-1] == signal.SIGKILL and spawned == ["f1"]


# --- a full disk under an outbox, leadership moved on purpose -------------------------------

LATER = {**TARGETS, "disk": 2, "leader": 3}


@pytest.mark.parametrize("seed", range(10))
def test_new_roles_leave_every_earlier_window_of_a_seed_as_it_was(seed: int) -> None:
    """A seed of the evidence tables replays the faults it had, plus the new roles'."""
    before = schedule.draw(seed, 600, TARGETS)
    after = schedule.draw(seed, 600, LATER)
    assert [w for w in after.windows if w.role in TARGETS] == list(before.windows)
    assert after.quiet == before.quiet
    assert {"disk", "leader"} <= {w.role for w in after.windows}
    assert not {"disk", "leader"} & schedule.FIRST_ROLES


@pytest.mark.parametrize("seed", range(25))
def test_disk_and_leader_windows_are_seeded_and_within_their_bounds(seed: int) -> None:
    drawn = schedule.draw(seed, 900, LATER)
    assert drawn == schedule.draw(seed, 900, dict(reversed(list(LATER.items()))))
    for role, action, count in (("disk", "full", 2), ("leader", "move", 3)):
        windows = [w for w in drawn.windows if w.role == role]
        assert windows, role
        assert schedule.overlap(drawn.windows, role) <= schedule.BOUNDS[role] == 1
        low, high = schedule.LENGTHS[action]
        for w in windows:
            assert w.action == action and 0 <= w.target < count
            assert low <= round(w.end - w.start, 2) <= high
            assert all(w.end <= q[0] or q[1] <= w.start for q in drawn.quiet)
    # Leadership is never moved to a node that a broker window breaks meanwhile.
    for move in (w for w in drawn.windows if w.role == "leader"):
        for b in (w for w in drawn.windows if w.role == "broker" and w.target == move.target):
            assert move.end <= b.start or b.end <= move.start, (move, b)


def test_a_move_to_a_broken_node_is_dropped_and_the_broker_window_kept() -> None:
    kill = schedule.Window("broker", "kill", 1, 10.0, 20.0)
    away = schedule.Window("leader", "move", 2, 12.0, 22.0)
    onto = schedule.Window("leader", "move", 1, 5.0, 12.0)
    assert schedule._no_move_to_a_broken_node([onto, kill, away]) == [kill, away]


def test_which_kinds_and_outboxes_take_disk_and_leader_faults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from msgsafe.nemesis import runner
    from msgsafe.nemesis.runner import Plan, fault_targets, replay_command

    def targets(kind: str, **kw: Any) -> dict[str, int]:
        return fault_targets(Plan(kind, 5, 1, Path("/x"), **kw))

    assert targets("kafka")["leader"] == 3 and targets("kafka")["disk"] == 3
    assert targets("rabbitmq")["leader"] == 1  # whichever node leads the queue
    assert targets("qpid")["leader"] == 3  # the node mastership is handed to
    assert "leader" not in targets("artemis")  # a pair: a fail-over is a broker kill
    assert "leader" not in targets("kafka", nodes=1)  # nowhere to move it to
    assert targets("qpid", producers=2)["disk"] == 2
    assert "disk" not in targets("kafka", outbox="postgres")
    assert "disk" not in targets("kafka", disk_faults=False)
    with pytest.raises(ValueError, match="not with --outbox postgres"):
        Plan("kafka", 1, 1, Path("/x"), outbox="postgres", disk_faults=True)
    plan = Plan("kafka", 1, 3, Path("/x"), disk_faults=False)
    assert replay_command(plan) == "msgsafe nemesis kafka --minutes 1 --seed 3 --no-disk-faults"
    # Not root: no mount, so no disk fault, and the replay says so.
    monkeypatch.setattr(runner, "can_mount", lambda: False)
    assert Plan("kafka", 1, 3, Path("/x")).disk_faults is False
    assert "disk" not in targets("kafka")


def test_the_command_passes_no_disk_faults_and_refuses_them_with_postgres(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from msgsafe.cli import nemesis as command
    from msgsafe.cli.app import app
    from msgsafe.nemesis.runner import Outcome, Plan, fault_targets

    plans: list[Plan] = []

    def fake_run(plan: Plan, say: Any) -> Outcome:
        plans.append(plan)
        verdict, _ = checker.check(_clean().events)
        return Outcome(plan, verdict, schedule.draw(plan.seed, 60, fault_targets(plan)))

    monkeypatch.setattr(command, "run", fake_run)
    argv = ["nemesis", "kafka", "--seed", "4", "--dir", str(tmp_path)]
    result = CliRunner().invoke(app, [*argv, "--no-disk-faults", "--json"])
    assert result.exit_code == 0, result.output
    assert plans[-1].disk_faults is False
    assert json.loads(result.output)["replay"].endswith("--seed 4 --no-disk-faults")
    result = CliRunner().invoke(app, [*argv])
    assert result.exit_code == 0 and plans[-1].disk_faults is True
    assert "(refused 0, in doubt 0, of which arrived 0)" in result.output
    refused = CliRunner().invoke(app, [*argv, "--outbox", "postgres", "--disk-faults"])
    assert refused.exit_code == 2
    assert "not with --outbox postgres" in " ".join(refused.output.replace("│", " ").split())


def test_a_send_refused_by_a_full_disk_is_counted_refused_not_lost() -> None:
    run = _clean()
    run.add("attempted", id="z", key="k1", seq=3)
    run.add("failed", id="z", error="OutboxFull")
    run.add("attempted", id="y", key="k1", seq=4)
    run.add("failed", id="y", error="SendTimeout")
    verdict, _ = checker.check(run.events)
    assert verdict.ok and verdict.lost == 0
    assert (verdict.failed, verdict.refused) == (2, 1)
    assert verdict.to_json()["refused"] == 1


def test_a_disk_window_fills_then_frees_that_producers_disk(tmp_path: Path) -> None:
    from msgsafe.nemesis.runner import Plan, _Run

    r = _Run(Plan(kind="kafka", minutes=1, seed=1, dir=tmp_path), lambda _: None)
    r.cluster = object()  # type: ignore[assignment]
    filled: list[int] = []

    def fill(producer: int) -> int:
        filled.append(producer)
        (tmp_path / "outboxes" / f"p{producer}" / "ballast").write_bytes(b"x")
        return 1

    r.fill_disk = fill  # type: ignore[method-assign]
    (tmp_path / "outboxes" / "p2").mkdir(parents=True)
    assert r.outbox_path("p2") == tmp_path / "outboxes" / "p2" / "p2.db"
    with history.History(tmp_path / "runner.jsonl", "runner") as own:
        r.own = own
        w = schedule.Window("disk", "full", 2, 1.0, 5.0)
        r.apply(w, True)
        assert filled == [2] and (tmp_path / "outboxes" / "p2" / "ballast").exists()
        r.apply(w, False)
        assert not (tmp_path / "outboxes" / "p2" / "ballast").exists()
    events = history.read_dir(tmp_path)
    assert [e["e"] for e in events] == ["fault", "ballast", "fault"]


class _Mover:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[str, int]] = []
        self.fail = fail

    def move(self, target: int) -> str:
        self.calls.append(("move", target))
        if self.fail:
            from msgsafe.cluster.base import ClusterError

            raise ClusterError("node 1 not elected")
        return f"led by {target}"

    def back(self, target: int) -> str:
        self.calls.append(("back", target))
        return "back"

    def heal(self) -> None:
        self.calls.append(("heal", -1))


def test_a_leader_window_moves_on_a_thread_and_back(tmp_path: Path) -> None:
    from msgsafe.nemesis.runner import Plan, _Run

    r = _Run(Plan(kind="kafka", minutes=1, seed=1, dir=tmp_path), lambda _: None)
    r.cluster = object()  # type: ignore[assignment]
    mover = r.mover = _Mover()
    with history.History(tmp_path / "runner.jsonl", "runner") as own:
        r.own = own
        w = schedule.Window("leader", "move", 2, 1.0, 5.0)
        r.apply(w, True)
        r.apply(w, False)
        assert r.moving is not None
        r.moving.join(10)
    assert mover.calls == [("move", 2), ("back", 2)]
    moved = [e for e in history.read_dir(tmp_path) if e["e"] == "moved"]
    assert [(e["on"], e["what"]) for e in moved] == [(True, "led by 2"), (False, "back")]
    assert not r.notes


@pytest.mark.parametrize("under_a_broker_fault", [True, False])
def test_a_refused_move_is_declined_only_under_a_broker_fault(
    tmp_path: Path, under_a_broker_fault: bool
) -> None:
    from msgsafe.nemesis.runner import Plan, _Run

    r = _Run(Plan(kind="kafka", minutes=1, seed=1, dir=tmp_path), lambda _: None)
    r.cluster = object()  # type: ignore[assignment]
    r.mover = _Mover(fail=True)
    if under_a_broker_fault:
        r.active.add(schedule.Window("broker", "kill", 0, 0.0, 9.0))
    with history.History(tmp_path / "runner.jsonl", "runner") as own:
        r.own = own
        r.move_leader(schedule.Window("leader", "move", 1, 1.0, 5.0), True)
        assert r.moving is not None
        r.moving.join(10)
    notes = [e["text"] for e in history.read_dir(tmp_path) if e["e"] == "note"]
    assert len(notes) == 1 and "node 1 not elected" in notes[0]
    assert notes[0].startswith("declined") == under_a_broker_fault
    assert bool(r.notes) != under_a_broker_fault


def test_the_kafka_mover_reorders_elects_and_restores_the_order_as_created() -> None:
    from msgsafe.cluster.base import ClusterError
    from msgsafe.nemesis.leaders import KafkaMover

    class Kafka:
        def __init__(self) -> None:
            self.lists = {0: [0, 1, 2], 1: [1, 2, 0], 2: [2, 0, 1]}
            self.calls: list[str] = []
            self.refuse: dict[int, str] = {}

        def replicas(self, topic: str) -> dict[int, list[int]]:
            return {p: list(r) for p, r in self.lists.items()}

        def reassign(self, topic: str, replicas: dict[int, list[int]]) -> None:
            self.calls.append("reassign")
            self.lists = {p: list(r) for p, r in replicas.items()}

        def elect_preferred(self, topic: str) -> dict[int, str]:
            self.calls.append("elect")
            return self.refuse

    kafka = Kafka()
    mover = KafkaMover(kafka, "t")  # type: ignore[arg-type]
    mover.move(1)
    assert kafka.lists == {0: [1, 0, 2], 1: [1, 2, 0], 2: [1, 2, 0]}
    mover.back(1)
    assert kafka.lists == {0: [0, 1, 2], 1: [1, 2, 0], 2: [2, 0, 1]}
    assert kafka.calls == ["reassign", "elect", "reassign", "elect"]
    mover.heal()  # the order as created already: an election only
    assert kafka.calls[-1] == "elect" and kafka.calls.count("reassign") == 2
    kafka.refuse = {2: "NOT_CONTROLLER"}
    with pytest.raises(ClusterError, match="node 0 not elected"):
        mover.move(0)


def test_the_kafka_mover_waits_for_a_preferred_leader_back_in_sync(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A long run (kafka seed 1533116067) asked a moment after node 1's pause ended:
    # "The preferred leader was not available." until it was back in the ISR.
    from msgsafe.cluster.base import ClusterError
    from msgsafe.nemesis import leaders

    monkeypatch.setattr(leaders, "_LEADER_POLL_S", 0.0)

    class Kafka:
        def __init__(self, refusals: int) -> None:
            self.refusals = refusals
            self.elections = 0

        def replicas(self, topic: str) -> dict[int, list[int]]:
            return {0: [0, 1, 2], 1: [1, 2, 0]}

        def reassign(self, topic: str, replicas: dict[int, list[int]]) -> None:
            pass

        def elect_preferred(self, topic: str) -> dict[int, str]:
            self.elections += 1
            if self.elections > self.refusals:
                return {}
            return {1: "The preferred leader was not available."}

    kafka = Kafka(refusals=3)
    mover = leaders.KafkaMover(kafka, "t", wait=30.0)  # type: ignore[arg-type]
    assert mover.back(0) == "the partitions of t back to their preferred leaders"
    assert kafka.elections == 4
    stuck = leaders.KafkaMover(Kafka(refusals=10**9), "t", wait=0.0)  # type: ignore[arg-type]
    with pytest.raises(ClusterError, match="preferred leaders not elected again"):
        stuck.back(0)


def test_the_rabbit_mover_drains_the_queues_leader_and_revives_it() -> None:
    from types import SimpleNamespace

    from msgsafe.nemesis.leaders import RabbitMover

    cluster = SimpleNamespace(
        members=[SimpleNamespace(name=f"n{i}@localhost") for i in range(3)],
        is_running=lambda node: node != 0,
    )
    mover = RabbitMover(cluster, "q")  # type: ignore[arg-type]
    calls: list[tuple[str, int, tuple[str, ...]]] = []

    def tool(name: str, node: int, *args: str, timeout: float = 60.0) -> str:
        calls.append((name, node, args))
        status = [
            {"Node Name": "n0@localhost", "Raft State": "noproc"},
            {"Node Name": "n1@localhost", "Raft State": "follower"},
            {"Node Name": "n2@localhost", "Raft State": "leader"},
        ]
        return json.dumps(status) if name == "rabbitmq-queues" else ""

    mover._tool = tool  # type: ignore[method-assign]
    assert mover.move(0) == "node 2, the leader of q, drained"
    mover.back(0)
    mover.heal()  # nothing left drained: no revive
    # The status asked of a running node (node 0 is down), then drain and revive node 2.
    assert calls == [
        ("rabbitmq-queues", 1, ("quorum_status", "q", "--formatter", "json")),
        ("rabbitmq-upgrade", 2, ("drain",)),
        ("rabbitmq-upgrade", 2, ("revive",)),
    ]


def test_the_rabbit_mover_waits_for_the_queue_to_elect_a_leader() -> None:
    # A long run (rabbitmq seed 571915487) asked seconds after a node's pause ended,
    # while the queue's members were electing: every node named no leader.
    from types import SimpleNamespace

    from msgsafe.cluster.base import ClusterError
    from msgsafe.nemesis.leaders import RabbitMover

    cluster = SimpleNamespace(
        members=[SimpleNamespace(name=f"n{i}@localhost") for i in range(3)],
        is_running=lambda node: True,
    )
    mover = RabbitMover(cluster, "q")  # type: ignore[arg-type]
    asked: list[int] = []

    def tool(name: str, node: int, *args: str, timeout: float = 60.0) -> str:
        asked.append(node)
        elected = len(asked) > 6  # two rounds of three nodes say "candidate"
        state = "leader" if elected else "candidate"
        status = [
            {"Node Name": "n0@localhost", "Raft State": "follower"},
            {"Node Name": "n1@localhost", "Raft State": state},
            {"Node Name": "n2@localhost", "Raft State": "follower"},
        ]
        return json.dumps(status) if name == "rabbitmq-queues" else ""

    mover._tool = tool  # type: ignore[method-assign]
    assert mover.leader(wait=30) == 1
    with pytest.raises(ClusterError, match="every running node names none"):
        asked.clear()
        mover.leader(wait=0)


def test_the_evidence_table_counts_disk_and_leader_faults() -> None:
    from msgsafe.nemesis.runner import Outcome, Plan, fault_targets
    from msgsafe.nemesis.table import row

    plan = Plan("kafka", 5, 100, Path("/x"))
    drawn = schedule.draw(plan.seed, 300, fault_targets(plan))
    clean, _ = checker.check(_clean().events)
    line = row(json.loads(json.dumps(Outcome(plan, clean, drawn).report())))
    count = {r: sum(w.role == r for w in drawn.windows) for r in fault_targets(plan)}
    assert count["disk"] and count["leader"]
    assert (
        f"({count['broker']} / {count['producer']} / {count['network']}; "
        f"disk {count['disk']}, leader {count['leader']}) |"
    ) in line


def test_the_qpid_mover_hands_mastership_over_and_back() -> None:
    from msgsafe.nemesis.leaders import QpidMover

    class Qpid:
        def __init__(self) -> None:
            self.now = 0
            self.calls: list[int] = []

        def master(self) -> int:
            return self.now

        def transfer_master(self, node: int) -> None:
            self.calls.append(node)
            self.now = node

    qpid = Qpid()
    mover = QpidMover(qpid)  # type: ignore[arg-type]
    assert mover.move(2) == "node 2 master (was 0)"
    assert mover.back(2) == "node 0 master again"
    assert qpid.calls == [2, 0]
    mover.move(0)  # already master: the back has nothing to undo
    assert mover.back(0) == "no move to undo" and qpid.calls == [2, 0, 0]


def test_a_defect_in_a_move_fails_the_run_even_under_a_broker_fault(tmp_path: Path) -> None:
    """Seed 100 on Kafka: the election raised TypeError on the mover's thread, which
    ended unseen and the run would have passed without its leader moves."""
    from msgsafe.nemesis.runner import Plan, _Run

    class Broken(_Mover):
        def move(self, target: int) -> str:
            raise TypeError("function takes at most 4 arguments (5 given)")

    r = _Run(Plan(kind="kafka", minutes=1, seed=1, dir=tmp_path), lambda _: None)
    r.cluster = object()  # type: ignore[assignment]
    r.mover = Broken()
    r.active.add(schedule.Window("broker", "kill", 0, 0.0, 9.0))
    with history.History(tmp_path / "runner.jsonl", "runner") as own:
        r.own = own
        r.move_leader(schedule.Window("leader", "move", 1, 1.0, 5.0), True)
        assert r.moving is not None
        r.moving.join(10)
    assert r.notes and "TypeError" in r.notes[0]


@dataclass(frozen=True)
class _Part:
    topic: str
    partition: int


def test_the_preferred_election_passes_no_keyword_the_client_rejects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """confluent-kafka 2.16's elect_leaders fails on any keyword argument (seed 100 on
    Kafka: TypeError, then SystemError); the election bounds its wait on the future."""
    from concurrent.futures import Future
    from types import SimpleNamespace

    from msgsafe.cluster import kafka_admin

    class Error:
        def __init__(self, code: int) -> None:
            self._code = code

        def code(self) -> int:
            return self._code

        def str(self) -> str:
            return f"error {self._code}"

    class Admin:
        def __init__(self, config: dict[str, Any]) -> None:
            pass

        def elect_leaders(self, kind: str, partitions: list[Any], **kwargs: Any) -> Future[Any]:
            if kwargs:
                raise TypeError("function takes at most 4 arguments (5 given)")
            done: Future[Any] = Future()
            done.set_result({p: (Error(84) if p.partition else None) for p in partitions})
            return done

    ck = SimpleNamespace(
        admin=SimpleNamespace(AdminClient=Admin),
        TopicPartition=_Part,
        ElectionType=SimpleNamespace(PREFERRED="preferred"),
        KafkaError=SimpleNamespace(ELECTION_NOT_NEEDED=84),
        KafkaException=RuntimeError,
    )
    monkeypatch.setattr(kafka_admin, "confluent", lambda: ck)
    monkeypatch.setattr(kafka_admin, "partitions", lambda *a, **k: {0: None, 1: None})
    # Partition 1's election was not needed (led by its preferred replica already).
    assert kafka_admin.elect_preferred("127.0.0.1:1", "t") == {}


def test_a_send_failed_in_doubt_may_arrive_late_and_one_denied_may_not() -> None:
    """Qpid seed 100: a send whose confirm timed out (a paused master) went to a full
    outbox and raised OutboxFull; the master, resumed, delivered it 30 s later, after
    later messages of its key. In doubt (the error says the broker may have it): its
    arrival is counted, not judged for order. Denied (the error says it could not): its
    arrival fails the run."""
    run = _clean()
    run.add("attempted", id="late", key="k1", seq=3)
    run.add("failed", id="late", error="OutboxFull", maybe=True)
    run.sent("a4", "k1", 4)
    run.add("received", id="a4").add("received", id="late")
    verdict, _ = checker.check(run.events)
    assert verdict.ok, verdict.problems()
    assert (verdict.in_doubt, verdict.in_doubt_arrived, verdict.refused) == (1, 1, 0)
    assert verdict.order_violations == 0
    denied = _clean()
    denied.add("attempted", id="no", key="k2", seq=3)
    denied.add("failed", id="no", error="OutboxFull", maybe=False)
    denied.add("received", id="no")
    verdict, _ = checker.check(denied.events)
    assert verdict.denied == 1 and verdict.examples["denied"] == ["no"]
    assert any("denied=1" in p for p in verdict.problems())


def test_a_history_without_the_doubt_of_each_failure_takes_its_error_class() -> None:
    run = _clean()
    run.add("attempted", id="t", key="k9", seq=0).add("failed", id="t", error="SendTimeout")
    run.add("attempted", id="f", key="k9", seq=1).add("failed", id="f", error="OutboxFull")
    run.add("received", id="t")
    verdict, _ = checker.check(run.events)
    assert verdict.ok and (verdict.in_doubt, verdict.refused) == (1, 1)
    run.add("received", id="f")
    assert checker.check(run.events)[0].denied == 1


def test_a_move_refused_after_a_broker_fault_ended_during_it_is_declined(
    tmp_path: Path,
) -> None:
    """Kafka seed 1449592700 (the suite's slice): the move back began while node 2 was
    paused; the reassignment waited on it and failed just after its resume, when no
    broker fault was in effect any more."""
    import threading

    from msgsafe.nemesis.runner import Plan, _Run

    started, go = threading.Event(), threading.Event()

    class Slow(_Mover):
        def back(self, target: int) -> str:
            started.set()
            go.wait(10)
            from msgsafe.cluster.base import ClusterError

            raise ClusterError("kafka-reassign-partitions failed")

    r = _Run(Plan(kind="kafka", minutes=1, seed=1, dir=tmp_path), lambda _: None)
    r.cluster = type("C", (), {"pause": lambda s, n: None, "resume": lambda s, n: None})()  # type: ignore[assignment]
    r.mover = Slow()
    pause = schedule.Window("broker", "pause", 2, 0.0, 9.0)
    with history.History(tmp_path / "runner.jsonl", "runner") as own:
        r.own = own
        r.apply(pause, True)
        r.move_leader(schedule.Window("leader", "move", 0, 1.0, 5.0), False)
        assert started.wait(10)
        r.apply(pause, False)  # the node resumes; then the move fails
        go.set()
        assert r.moving is not None
        r.moving.join(10)
    notes = [e["text"] for e in history.read_dir(tmp_path) if e["e"] == "note"]
    assert len(notes) == 1 and notes[0].startswith("declined"), notes
    assert not r.notes


def test_filling_a_disk_stops_at_enospc_on_a_partial_write(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Artemis seed 205468141 (the suite's slice): the disk took part of the last chunk,
    and the buffered file raised ENOSPC again when closed, failing the fault action.
    The ballast is written unbuffered; ENOSPC ends it, whatever the disk took counts."""
    import errno

    from msgsafe.nemesis import runner
    from msgsafe.nemesis.runner import Plan, _Run

    (tmp_path / "outboxes" / "p1").mkdir(parents=True)
    takes = [65536, 1000]

    def write(fd: int, data: bytes) -> int:
        if not takes:
            raise OSError(errno.ENOSPC, "No space left on device")
        return takes.pop(0)

    monkeypatch.setattr(runner.os, "write", write)
    r = _Run(Plan(kind="artemis", minutes=1, seed=1, dir=tmp_path), lambda _: None)
    assert r.fill_disk(1) == 66536
    assert (tmp_path / "outboxes" / "p1" / "ballast").exists()

    def broken(fd: int, data: bytes) -> int:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(runner.os, "write", broken)
    with pytest.raises(OSError, match="I/O error"):  # not a full disk: the action fails
        r.fill_disk(1)


def test_the_evidence_table_says_when_and_at_which_commit_a_run_ended() -> None:
    from msgsafe.nemesis.runner import Outcome, Plan, fault_targets
    from msgsafe.nemesis.table import HEADER, row

    plan = Plan("qpid", 30, 7, Path("/x"))
    drawn = schedule.draw(plan.seed, 60, fault_targets(plan))
    clean, _ = checker.check(_clean().events)
    report = json.loads(
        json.dumps(Outcome(plan, clean, drawn, finished="2026-12-07 17:02").report())
    )
    assert report["finished"] == "2026-12-07 17:02" and report["msgsafe"]
    assert row(report).endswith("| yes | 2026-12-07 17:02 |")
    report["commit"] = "67b8681"
    assert row(report).endswith("| yes | 2026-12-07 17:02, 67b8681 |")
    # A report made before runs said when: the row still has every column.
    del report["finished"], report["commit"]
    assert row(report).count("|") == HEADER.splitlines()[0].count("|")


def test_a_passing_run_that_recovered_slowly_keeps_its_brokers_files() -> None:
    # RabbitMQ seed 1614532448 passed with outboxes that took 224 s to be empty, and its
    # brokers' logs, which would have said why, were gone with the cluster's directory.
    from dataclasses import replace

    from msgsafe.nemesis.runner import (
        STALL_KEEP_S,
        Outcome,
        Plan,
        fault_targets,
        keeps_brokers_files,
    )

    plan = Plan("rabbitmq", 5, 100, Path("/x"))
    drawn = schedule.draw(plan.seed, 300, fault_targets(plan))
    clean, _ = checker.check(_clean().events)
    assert clean.ok
    quick = replace(clean, worst_recovery_s=STALL_KEEP_S / 2)
    slow = replace(clean, worst_recovery_s=STALL_KEEP_S * 2)
    assert not keeps_brokers_files(Outcome(plan, quick, drawn))
    assert keeps_brokers_files(Outcome(plan, slow, drawn))
    assert keeps_brokers_files(Outcome(plan, quick, drawn, ["heal: ClusterError: x"]))


def test_a_lost_message_its_forwarder_saw_accepted_is_counted_as_such() -> None:
    # Artemis seed 126338297 lost a STORED message whose outbox row was gone: whether
    # the forwarder had removed it on the broker's accept, the history could not say.
    run = _clean()
    run.sent("c0", "k3", 0, status="stored")
    run.sent("c1", "k3", 1, status="stored")
    run.add("forwarded", ids=["c0", "b0"])
    verdict, _ = checker.check(run.events)
    assert verdict.lost == 2 and verdict.lost_forwarded == 1
    assert verdict.examples["lost_forwarded"] == ["c0"]
    assert "lost=2 (receipted, never received; 1 forwarded, accepted)" in verdict.problems()


def test_the_producers_outbox_records_what_its_forwarder_delivered(tmp_path: Path) -> None:
    from msgsafe.message import Envelope
    from msgsafe.nemesis.worker import Spec, _outbox

    with history.History(tmp_path / "p0.jsonl", "p0") as h:
        spec = Spec(
            "produce",
            "p0",
            "memory://x",
            "q",
            str(tmp_path / "p0.jsonl"),
            outbox=str(tmp_path / "p0.db"),
        )
        store = _outbox(spec, h)
        assert not isinstance(store, str)
        try:
            store.put([Envelope.build("q", b"x", message_id=f"m{i}") for i in range(3)])
            claimed = store.claim(limit=2, lease_s=30.0)
            store.delivered([env.message_id for env in claimed])
        finally:
            store.close()
    events = history.read_dir(tmp_path)
    assert [e["ids"] for e in events if e["e"] == "forwarded"] == [["m0", "m1"]]


def test_a_producer_whose_outbox_cannot_be_opened_yet_tries_again(tmp_path: Path) -> None:
    # A producer restarted while its outbox's disk is full is refused the file: it notes
    # the refusal and tries again a second later, as for a broker that refuses it.
    import threading

    from msgsafe.nemesis.worker import Spec, _open_producer

    later = tmp_path / "later"
    spec = Spec(
        "produce",
        "p0",
        "memory://nemesis-retry",
        "q",
        str(tmp_path / "p0.jsonl"),
        outbox=str(later / "p0.db"),
        require="any",
    )
    threading.Timer(0.3, later.mkdir).start()
    with history.History(spec.history, "p0") as h:
        producer = _open_producer(spec, h, threading.Event())
        producer.close()
    notes = [e["text"] for e in history.read_dir(tmp_path) if e["e"] == "note"]
    assert len(notes) == 1 and notes[0].startswith("producer not opened: ConfigurationError")
