"""The ``msgsafe`` command without external brokers: the memory broker (in the command's
own process), outbox files, and the doctor's rules. Commands run as subprocesses."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from msgsafe.adapters.rabbitmq.check import _cluster, _Management, _queue_from_api
from msgsafe.checks.findings import Finding, Severity
from msgsafe.cli._output import ExitCode, with_options
from msgsafe.cli.doctor import exit_code
from msgsafe.endpoints import parse_url
from msgsafe.message import Envelope
from msgsafe.outbox import SqliteOutbox
from tests.support.commands import msgsafe as run


def test_help_lists_every_command() -> None:
    proc = run("--help")
    assert proc.code == 0
    for command in ("demo", "verify", "doctor", "outbox", "send", "consume"):
        assert command in proc.stdout
    outbox = run("outbox", "--help")
    for command in ("status", "list", "drain", "quarantine", "replay", "purge"):
        assert command in outbox.stdout


def test_demo_on_the_memory_broker_reports_lost_0() -> None:
    proc = run("demo", "--url", "memory://unit", "--count", "400", "--keys", "4", "--json")
    assert proc.code == 0, proc.stderr
    report = json.loads(proc.stdout)
    print({k: v for k, v in report.items() if k != "timeline"})
    assert report["sent"] == 400
    assert report["confirmed"] > 0 and report["stored"] > 0
    assert report["confirmed"] + report["stored"] == 400
    assert report["stored_then_delivered"] == report["stored"]
    assert report["consumed"] == 400 and report["lost"] == 0 and report["unexpected"] == 0


def test_demo_human_report_with_the_application_restarting_too() -> None:
    proc = run("demo", "--url", "memory://unit2", "--count", "200", "--restart-app")
    assert proc.code == 0, proc.stderr
    assert "lost = 0" in proc.stdout
    assert "stored then delivered" in proc.stdout
    assert "a new producer opens the same outbox" in proc.stderr


def test_demo_runs_the_users_fault_commands(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    proc = run(
        "demo",
        "--url",
        "memory://unit3",
        "--count",
        "100",
        "--json",
        "--kill-cmd",
        f"touch {marks}.killed",
        "--restart-cmd",
        f"touch {marks}.restarted",
    )
    assert proc.code == 0, proc.stderr
    assert json.loads(proc.stdout)["fault"].startswith("--kill-cmd")
    assert Path(f"{marks}.killed").exists() and Path(f"{marks}.restarted").exists()
    failing = run("demo", "--url", "memory://unit4", "--count", "10", "--kill-cmd", "false")
    assert failing.code == ExitCode.ERROR
    assert "fault command" in failing.stderr


def test_bad_usage_exits_2() -> None:
    assert run("demo", "--count", "0").code == ExitCode.USAGE
    assert run("demo", "--kill-cmd", "true").code == ExitCode.USAGE
    assert run("verify").code == ExitCode.USAGE


def test_bad_url_exits_3_without_echoing_it() -> None:
    proc = run("doctor", "amqp://user:hunter2@bad host", "--json")
    assert proc.code == ExitCode.ERROR
    assert "hunter2" not in proc.stdout + proc.stderr
    assert "error" in json.loads(proc.stdout)


def test_doctor_on_memory_is_informational() -> None:
    proc = run("doctor", "memory://x", "--json")
    assert proc.code == 0
    assert json.loads(proc.stdout)["worst"] == "info"


@pytest.fixture
def outbox_file(tmp_path: Path) -> Iterator[tuple[Path, list[Envelope]]]:
    path = tmp_path / "outbox.sqlite3"
    store = SqliteOutbox(path, target="memory://ob")
    envelopes = [Envelope.build("q", f"m{i}".encode(), key=f"k{i}") for i in range(5)]
    store.put(envelopes)
    for env in store.claim(limit=2, lease_s=30):
        store.failed(env.message_id, error="Rejected: poison", retry_at=None)
    store.close()
    yield path, envelopes


def test_outbox_status_list_quarantine(outbox_file: tuple[Path, list[Envelope]]) -> None:
    path, envelopes = outbox_file
    status = json.loads(run("outbox", "status", str(path), "--json").stdout)
    assert status["waiting"] == 3 and status["quarantined"] == 2
    assert status["target"] == "memory://ob"
    listed = json.loads(run("outbox", "list", str(path), "--json").stdout)
    assert [r["message_id"] for r in listed] == [e.message_id for e in envelopes[2:]]
    quarantined = json.loads(run("outbox", "quarantine", str(path), "--json").stdout)
    assert {r["message_id"] for r in quarantined} == {e.message_id for e in envelopes[:2]}
    assert all("poison" in r["error"] for r in quarantined)
    human = run("outbox", "status", str(path))
    assert human.code == 0 and "quarantined" in human.stdout


def test_outbox_replay_purge_drain(outbox_file: tuple[Path, list[Envelope]]) -> None:
    path, envelopes = outbox_file
    replayed = run("outbox", "replay", str(path), envelopes[0].message_id, "--json")
    assert json.loads(replayed.stdout) == {"replayed": 1}

    # stdin is a pipe here: no question can be asked, so nothing is deleted without --yes.
    refused = run("outbox", "purge", str(path), "--quarantined", stdin="y\n")
    assert refused.code == ExitCode.USAGE
    assert "--yes" in refused.stderr
    assert json.loads(run("outbox", "status", str(path), "--json").stdout)["quarantined"] == 1

    assert run("outbox", "purge", str(path)).code == ExitCode.USAGE
    purged = run("outbox", "purge", str(path), "--quarantined", "--yes", "--json")
    assert json.loads(purged.stdout) == {"purged": 1}

    drained = run("outbox", "drain", str(path), "--url", "memory://ob", "--json")
    assert drained.code == 0, drained.stderr
    assert json.loads(drained.stdout)["delivered"] == 4
    final = json.loads(run("outbox", "status", str(path), "--json").stdout)
    assert final["waiting"] == 0 and final["quarantined"] == 0


def test_outbox_missing_file_exits_3(tmp_path: Path) -> None:
    proc = run("outbox", "status", str(tmp_path / "nope.sqlite3"))
    assert proc.code == ExitCode.ERROR
    assert not (tmp_path / "nope.sqlite3").exists()


def test_send_prints_one_receipt_per_line_and_consume_reads_them() -> None:
    # memory:// lives in one process: send and consume run in the same one here.
    from typer.testing import CliRunner

    from msgsafe.cli import app

    runner = CliRunner()
    sent = runner.invoke(app, ["send", "memory://shell", "q", "--no-outbox"], input="a\nb\n")
    assert sent.exit_code == 0, sent.output
    assert [line.split()[0] for line in sent.stdout.splitlines()] == ["confirmed", "confirmed"]
    got = runner.invoke(app, ["consume", "memory://shell", "q", "--count", "2", "--json"])
    assert got.exit_code == 0, got.output
    bodies = [json.loads(line)["body"] for line in got.stdout.splitlines() if line.startswith("{")]
    assert bodies == ["a", "b"]


def test_exit_code_is_the_worst_finding() -> None:
    def finding(severity: Severity) -> Finding:
        return Finding(severity, "s", "x", "v")

    assert exit_code([]) == ExitCode.OK
    assert exit_code([finding(Severity.INFO), finding(Severity.OK)]) == ExitCode.OK
    assert exit_code([finding(Severity.UNKNOWN), finding(Severity.OK)]) == ExitCode.UNKNOWN
    assert exit_code([finding(Severity.WARNING), finding(Severity.UNKNOWN)]) == ExitCode.WARNING
    assert exit_code([finding(Severity.CRITICAL), finding(Severity.WARNING)]) == 6


def test_with_options_appends_to_the_query() -> None:
    assert with_options("amqp://h/%2F", {}) == "amqp://h/%2F"
    assert with_options("amqp://h", {"declare": "quorum"}) == "amqp://h?declare=quorum"
    assert with_options("kafka://h?a=1", {"b": "2"}) == "kafka://h?a=1&b=2"


class _Api(BaseHTTPRequestHandler):
    routes: ClassVar[dict[str, Any]] = {}

    def do_GET(self) -> None:
        body = json.dumps(self.routes.get(self.path, {})).encode()
        self.send_response(200 if self.path in self.routes else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return None


def test_management_api_findings() -> None:
    _Api.routes = {
        "/api/nodes": [
            {"name": "a@h", "running": True, "partitions": ["b@h"]},
            {"name": "b@h", "running": True, "partitions": []},
        ],
    }
    server = HTTPServer(("127.0.0.1", 0), _Api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = parse_url("amqp://guest:guest@127.0.0.1:5672")
        api = _Management(url, f"http://127.0.0.1:{server.server_address[1]}")
        findings = {(f.setting, f.severity) for f in _cluster(api, {})}
        assert ("nodes", Severity.WARNING) in findings  # 2 nodes
        assert ("partitions", Severity.CRITICAL) in findings
        assert ("cluster_partition_handling", Severity.UNKNOWN) in findings
        assert isinstance(api.get("/api/missing"), str)
    finally:
        server.shutdown()
        server.server_close()
    mirrored = _queue_from_api(
        "q", {"type": "classic", "durable": True, "effective_policy_definition": {"ha-mode": "all"}}
    )
    assert mirrored[0].severity is Severity.CRITICAL and "mirrored" in mirrored[0].value
    assert _queue_from_api("q", {"type": "quorum", "durable": True})[0].severity is Severity.OK
    assert _queue_from_api("q", {"type": "classic", "durable": False})[0].setting == "durable"


def test_kafka_rules_follow_the_failure_stories() -> None:
    from msgsafe.adapters.kafka.check import _broker_defaults, _replication, _topic_configs

    assert _replication("t", 1).severity is Severity.CRITICAL
    assert _replication("t", 2).severity is Severity.WARNING
    assert _replication("t", 3).severity is Severity.OK

    def severities(rf: int, configs: dict[str, str] | str) -> dict[str, Severity]:
        return {f.setting: f.severity for f in _topic_configs("t", rf, configs)}

    safe = {"min.insync.replicas": "2", "unclean.leader.election.enable": "false"}
    assert set(severities(3, safe).values()) == {Severity.OK}
    assert severities(3, {**safe, "min.insync.replicas": "1"})["min.insync.replicas"] == (
        Severity.CRITICAL
    )
    assert severities(2, safe)["min.insync.replicas"] is Severity.WARNING  # min.isr == rf
    unclean = {**safe, "unclean.leader.election.enable": "true"}
    assert severities(3, unclean)["unclean.leader.election.enable"] is Severity.CRITICAL
    assert set(severities(3, "DescribeConfigs failed: x").values()) == {Severity.UNKNOWN}
    assert set(severities(3, {}).values()) == {Severity.UNKNOWN}
    defaults = _broker_defaults(1, {"default.replication.factor": "1"})
    assert {f.setting: f.severity for f in defaults}["default.replication.factor"] is (
        Severity.WARNING
    )


def _json_of(output: str) -> Any:
    return json.loads(output[output.index("{") :])


def test_verify_excuses_refused_sends(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from msgsafe.cli import app
    from msgsafe.testing import MemoryBroker

    MemoryBroker.named("verify-unit").reject_next(3)
    result = CliRunner().invoke(
        app,
        [
            "verify",
            "memory://verify-unit",
            "q",
            "--count",
            "60",
            "--keys",
            "3",
            "--json",
            "--timeout",
            "2",
            "--outbox",
            str(tmp_path / "o.sqlite3"),
        ],
    )
    report = _json_of(result.stdout)
    assert report["failed"] == 3 and report["confirmed"] == 57
    assert report["received"] == 57
    assert report["lost"] == 0  # refused sends were never accepted: the caller was told
    assert result.exit_code == ExitCode.LOSS  # ... and the command still fails for them


def test_verify_catches_messages_taken_behind_its_back(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from msgsafe.cli import app
    from msgsafe.consumer import Consumer

    runner = CliRunner()
    common = ["--count", "60", "--keys", "3", "--run", "r2", "--group", "g", "--json"]
    url = "memory://verify-unit2"
    produced = runner.invoke(
        app,
        [
            "verify",
            url,
            "q",
            "--phase",
            "produce",
            *common,
            "--outbox",
            str(tmp_path / "o.sqlite3"),
        ],
    )
    assert produced.exit_code == 0, produced.output
    with Consumer(url, group="g") as thief:
        thief.subscribe("q")
        taken = 0
        while taken < 5:
            for delivery in thief.poll(max_messages=5 - taken, timeout=1):
                delivery.ack()
                taken += 1
    checked = runner.invoke(
        app, ["verify", url, "q", "--phase", "consume", "--timeout", "1", *common]
    )
    report = _json_of(checked.stdout)
    assert report["lost"] == 5 and report["received"] == 55
    assert checked.exit_code == ExitCode.LOSS


def test_verify_says_when_nothing_of_its_run_came_back(tmp_path: Path) -> None:
    """A run checked on a destination where none of it is (the wrong queue, or a group
    that never got its partitions): every message counts as lost, and the report says
    that nothing was read back and how to read again."""
    from typer.testing import CliRunner

    from msgsafe.cli import app

    runner = CliRunner()
    common = ["--count", "20", "--keys", "2", "--run", "r3", "--json"]
    url = "memory://verify-unit3"
    produced = runner.invoke(
        app,
        ["verify", url, "q", "--phase", "produce", *common, "--outbox", str(tmp_path / "o")],
    )
    assert produced.exit_code == 0, produced.output
    checked = runner.invoke(
        app,
        ["verify", url, "elsewhere", "--phase", "consume", "--join-timeout", "0.5", *common],
    )
    report = _json_of(checked.stdout)
    assert report["lost"] == 20 and report["received"] == 0
    assert "nothing of run r3 was read back within --join-timeout (0.5 s)" in report["note"]
    assert "--phase consume --run r3" in report["note"]
    assert checked.exit_code == ExitCode.LOSS


@pytest.mark.parametrize(
    ("value", "level", "complaint"),
    [
        (None, logging.ERROR, False),
        ("INFO", logging.INFO, False),
        ("debug", logging.DEBUG, False),
        ("30", logging.WARNING, False),
        ("chatty", logging.ERROR, True),
    ],
)
def test_msgsafe_log_level_sets_the_commands_logging(
    value: str | None,
    level: int,
    complaint: bool,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The command logs the library's records from MSGSAFE_LOG_LEVEL up (ERROR without
    it); a value that names no level is said on stderr and ERROR is kept."""
    from msgsafe.cli.app import _log_level

    if value is None:
        monkeypatch.delenv("MSGSAFE_LOG_LEVEL", raising=False)
    else:
        monkeypatch.setenv("MSGSAFE_LOG_LEVEL", value)
    assert _log_level() == level
    assert ("names no level" in capsys.readouterr().err) is complaint


def test_version_prints_the_package_version() -> None:
    import msgsafe

    proc = run("--version")
    assert proc.code == 0, proc.stderr
    assert proc.stdout.strip() == f"msgsafe {msgsafe.__version__}"


@pytest.mark.parametrize("verb", ["up", "fetch"])
def test_an_unknown_cluster_kind_is_a_usage_error_naming_the_kinds(
    verb: str, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from msgsafe.cli import app
    from msgsafe.cluster import KINDS

    args = ["cluster", verb, "kafak"] + (["--dir", str(tmp_path / "c")] if verb == "up" else [])
    result = CliRunner().invoke(app, args)
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "kafak" in result.output
    for kind in KINDS:
        assert kind in result.output
    assert not (tmp_path / "c").exists()


def _help_texts(app: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], str]]:
    """(command path, help text as written) of ``app`` and every command and group in it."""
    import inspect

    texts = [(path, app.info.help)] if isinstance(app.info.help, str) else []
    for command in app.registered_commands:
        name = command.name or command.callback.__name__.replace("_", "-")
        texts.append(((*path, name), inspect.getdoc(command.callback) or ""))
    for group in app.registered_groups:
        texts += _help_texts(group.typer_instance, (*path, group.name))
    return texts


def test_every_help_text_reads_as_whole_paragraphs(monkeypatch: pytest.MonkeyPatch) -> None:
    """No sentence of a help text is cut where its docstring's source line ended: with a
    console wide enough that nothing wraps, each paragraph of the docstring (its lines
    joined by spaces) is one line of ``--help``, and the first one is one line of the
    group's command list."""
    import typer.rich_utils
    from typer.testing import CliRunner

    from msgsafe.cli import app

    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", 2000)
    runner = CliRunner()

    def lines(path: tuple[str, ...]) -> list[str]:
        result = runner.invoke(app, [*path, "--help"])
        assert result.exit_code == 0, result.output
        return [" ".join(line.split()) for line in result.output.splitlines()]

    texts = _help_texts(app)
    assert len(texts) > 20  # every command and group, not an empty walk
    for path, text in texts:
        shown = lines(path)
        paragraphs = [" ".join(p.split()) for p in text.split("\n\n") if p.strip()]
        for paragraph in paragraphs:
            assert any(paragraph in line for line in shown), (path, paragraph)
        if path:
            listed = lines(path[:-1])
            assert any(paragraphs[0] in line for line in listed), (path, paragraphs[0])


def test_verify_names_why_sends_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from typer.testing import CliRunner

    from msgsafe.cli import app
    from msgsafe.testing import MemoryBroker

    common = ["q", "--count", "30", "--keys", "3", "--timeout", "1"]
    broker = MemoryBroker.named("verify-unit-errors")
    broker.reject_next(3)
    with caplog.at_level(logging.INFO, logger="msgsafe.cli.verify"):
        result = CliRunner().invoke(
            app,
            [
                "verify",
                "memory://verify-unit-errors",
                *common,
                "--json",
                "--outbox",
                str(tmp_path / "o"),
            ],
        )
    report = _json_of(result.stdout)
    assert report["failed"] == 3 and result.exit_code == ExitCode.LOSS
    [rejected] = report["errors"]
    assert rejected["type"] == "Rejected" and rejected["count"] == 3
    assert "broker rejected the message" in rejected["example"]
    assert any(
        "3 send(s) raised Rejected, e.g. broker rejected the message" in r.getMessage()
        for r in caplog.records
    )

    broker.reject_next(2)
    human = CliRunner().invoke(
        app, ["verify", "memory://verify-unit-errors", *common, "--outbox", str(tmp_path / "p")]
    )
    assert human.exit_code == ExitCode.LOSS
    assert "2 not accepted (send raised: 2 Rejected), none lost" in " ".join(human.stdout.split())
    assert "broker rejected the message" in human.stdout  # the example, in the errors table


def test_error_summary_counts_each_type_with_its_first_example() -> None:
    from msgsafe.cli.verify import error_summary
    from msgsafe.errors import Rejected, SendTimeout, Unroutable

    errors = [
        Unroutable("no queue bound for 'a'"),
        Rejected("nope"),
        Unroutable("no queue bound for 'b'"),
        SendTimeout("slow"),
    ]
    assert error_summary(errors) == [
        {"type": "Unroutable", "count": 2, "example": "no queue bound for 'a'"},
        {"type": "Rejected", "count": 1, "example": "nope"},
        {"type": "SendTimeout", "count": 1, "example": "slow"},
    ]
    assert error_summary([]) == []
