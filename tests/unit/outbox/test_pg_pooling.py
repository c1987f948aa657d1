"""Behind a pooler without a server: the options every store connection is opened with,
the pooling heuristic on scripted connections, the doctor's finding, and the PgBouncer
launcher's configuration and state (no process started)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from msgsafe.checks.findings import Severity
from msgsafe.checks.store import pooling_finding
from msgsafe.cli import app
from msgsafe.cluster.base import ClusterError
from msgsafe.cluster.postgres import PostgresCluster
from msgsafe.errors import ConfigurationError, OutboxError, OutboxPoolingUnsupported
from msgsafe.outbox import _pg_pooling
from msgsafe.outbox._pg_pooling import CONNECT_OPTIONS, pooling_mode


class _Conn:
    """A connection whose ``pg_backend_pid()`` answers come from ``pids`` in turn, whose
    handshake announced ``announced``; ``refuse_begin``: a statement-mode pooler."""

    def __init__(self, announced: int, pids: list[int], *, refuse_begin: bool = False) -> None:
        self.info = type("Info", (), {"backend_pid": announced})()
        self._pids = pids
        self._refuse_begin = refuse_begin
        self.statements: list[str] = []
        self.closed = False

    def execute(self, sql: str) -> _Conn:
        self.statements.append(sql)
        if sql == "BEGIN" and self._refuse_begin:
            raise RuntimeError("transaction blocks not allowed in statement pooling mode")
        return self

    def fetchone(self) -> tuple[int]:
        return (self._pids.pop(0),)

    def close(self) -> None:
        self.closed = True


def _opener(conn: _Conn) -> Callable[[], _Conn]:
    return lambda: conn


def test_every_store_connection_prepares_nothing_and_autocommits() -> None:
    # psycopg prepares a query after its fifth run; a transaction pooler hands the next
    # transaction another server connection, where the prepared name does not exist.
    assert CONNECT_OPTIONS == {"autocommit": True, "prepare_threshold": None}


def test_the_store_and_the_doctor_connect_with_those_options(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import psycopg

    from msgsafe.outbox.postgres import PostgresOutbox

    seen: list[dict[str, Any]] = []

    def connect(conninfo: str, **options: Any) -> Any:
        seen.append(options)
        raise psycopg.OperationalError("no server here")

    monkeypatch.setattr(psycopg, "connect", connect)
    with pytest.raises(OutboxError):
        PostgresOutbox("host=127.0.0.1 port=1 dbname=x", write_timeout=0.01)
    from msgsafe.checks.store import check_store

    findings = check_store("postgresql://u:pw@127.0.0.1:1/db")
    assert findings[0].severity is Severity.UNKNOWN
    assert seen and all(o["prepare_threshold"] is None and o["autocommit"] for o in seen)


def test_a_direct_server_announces_its_own_pid() -> None:
    conn = _Conn(41, [41])
    assert pooling_mode(conn, lambda: pytest.fail("no second connection needed")) == "direct"


def test_transaction_pooling_hands_the_released_server_to_the_next_transaction() -> None:
    # PgBouncer's made-up pid; the second client's BEGIN gets server 7 (the first's).
    first = _Conn(-123, [7, 8])
    other = _Conn(-456, [7])
    assert pooling_mode(first, _opener(other)) == "transaction"
    assert other.statements[0] == "BEGIN" and other.statements[-1] == "ROLLBACK"
    assert other.closed


def test_transaction_pooling_moves_the_first_client_to_another_server() -> None:
    first = _Conn(-123, [7, 9])
    other = _Conn(-456, [8])
    assert pooling_mode(first, _opener(other)) == "transaction"


def test_session_pooling_keeps_each_client_on_its_server() -> None:
    first = _Conn(-123, [7, 7])
    other = _Conn(-456, [8])
    assert pooling_mode(first, _opener(other)) == "session"


def test_statement_pooling_refuses_the_begin() -> None:
    other = _Conn(-456, [], refuse_begin=True)
    assert pooling_mode(_Conn(-123, [7]), _opener(other)) == "statement"
    assert other.closed


def test_another_error_of_the_second_connection_is_not_taken_for_a_mode() -> None:
    class Broken(_Conn):
        def execute(self, sql: str) -> _Conn:
            raise RuntimeError("server closed the connection")

    with pytest.raises(RuntimeError, match="server closed"):
        pooling_mode(_Conn(-123, [7]), _opener(Broken(-456, [])))


@pytest.mark.parametrize("mode", _pg_pooling.POOL_MODES)
def test_the_doctor_reports_the_mode_it_found(mode: Any) -> None:
    finding = pooling_finding("outbox postgresql://h/db", mode)
    assert finding.value == mode and "heuristic" in finding.setting
    if mode == "statement":
        assert finding.severity is Severity.CRITICAL and "pool_mode" in finding.fix
    elif mode == "direct":
        assert finding.severity is Severity.OK
    else:
        assert finding.severity is Severity.INFO
    if mode == "transaction":
        assert "poll" in finding.why and "prepared" in finding.why


def test_the_statement_mode_refusal_is_a_configuration_error() -> None:
    error = OutboxPoolingUnsupported("pool_mode", endpoint="postgresql://h/db")
    assert isinstance(error, OutboxError) and isinstance(error, ConfigurationError)


# --- the launcher: msgsafe cluster up postgres --pooler ---------------------------------


def test_the_pooler_is_configured_for_transaction_pooling_on_loopback(tmp_path: Path) -> None:
    cluster = PostgresCluster(nodes=2, dir=tmp_path, base_port=47100, pooler=True)
    assert cluster.ports == [47100, 47101]
    assert cluster.pooler is not None and cluster.pooler.port == 47102
    try:
        cluster.pooler.run_as = None  # written as this user: nothing to chown to
        cluster.pooler.repoint(47101)  # what a promotion does; nothing runs to reload
        ini = cluster.pooler.ini.read_text()
        assert "pool_mode = transaction\n" in ini
        assert "listen_addr = 127.0.0.1\n" in ini and "listen_port = 47102\n" in ini
        assert "msgsafe = host=127.0.0.1 port=47101 dbname=msgsafe\n" in ini
        assert "unix_socket_dir =\n" in ini and "server_login_retry = 1\n" in ini
        users = cluster.pooler.files / "userlist.txt"
        assert users.read_text() == '"msgsafe" "msgsafe"\n"postgres" "msgsafe"\n'
        assert users.stat().st_mode & 0o077 == 0
        assert cluster.pooler_url == "postgresql://msgsafe:msgsafe@127.0.0.1:47102/msgsafe"
    finally:
        # Run as root, the files live under the spare data root (outside tmp_path).
        cluster.delete_data()
    assert not cluster.pooler.files.exists()


def test_the_pooler_is_found_again_from_cluster_json(tmp_path: Path) -> None:
    cluster = PostgresCluster(nodes=1, dir=tmp_path, base_port=47200, pooler=True)
    assert cluster.pooler is not None
    cluster.pooler.pid = 999_999_999
    state = json.loads(json.dumps(cluster.state()))
    again = PostgresCluster.from_state(tmp_path, state)
    assert again.pooler is not None
    assert again.pooler.port == 47201 and again.pooler.pid == 999_999_999
    assert again.pooler_url == cluster.pooler_url
    plain = PostgresCluster.from_state(tmp_path, PostgresCluster(nodes=1, dir=tmp_path).state())
    assert plain.pooler is None
    with pytest.raises(ClusterError, match="no pooler"):
        _ = plain.pooler_url


def test_up_refuses_pooler_for_a_kind_without_one(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["cluster", "up", "tansu", "--dir", str(tmp_path / "t"), "--pooler"]
    )
    assert result.exit_code == 3
    assert "tansu has no --pooler" in result.stderr and "postgres" in result.stderr


def test_a_missing_pgbouncer_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    from msgsafe.cluster import _pgbouncer

    monkeypatch.setattr(_pgbouncer.shutil, "which", lambda *a, **k: None)
    with pytest.raises(ClusterError, match="apt-get install -y pgbouncer"):
        _pgbouncer.pgbouncer_bin()
