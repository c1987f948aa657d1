"""``msgsafe doctor URL --outbox postgresql://...`` against real servers: the synchronous
pair is fine; the same pair with its standby made asynchronous, and a throwaway server
with fsync, full_page_writes and synchronous_commit off, are named with their fixes."""

from __future__ import annotations

from typing import Any

import pytest

from msgsafe.cluster.postgres import PostgresCluster
from tests.support.commands import msgsafe
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration


def _doctor(store: str) -> tuple[int, list[dict[str, Any]]]:
    run = msgsafe("doctor", "memory://doctor", "--outbox", store, "--json")
    assert ":msgsafe@" not in run.stdout + run.stderr  # the password is never shown
    report = run.json()
    return run.code, [f for f in report["findings"] if f["subject"].startswith("outbox ")]


def _sync_states(pair: PostgresCluster) -> list[str]:
    return [r[0] for r in pair._query(pair.primary, "SELECT sync_state FROM pg_stat_replication")]


def test_the_synchronous_pair_passes_and_an_asynchronous_standby_is_critical(
    pg_pair: PostgresCluster,
) -> None:
    code, findings = _doctor(pg_pair.url)
    assert code == 0, findings
    assert {f["severity"] for f in findings} == {"ok"}
    assert any(f["setting"] == "replication" and "pg1" in f["value"] for f in findings)

    pg_pair._execute(
        0, "ALTER SYSTEM SET synchronous_standby_names = ''", "SELECT pg_reload_conf()"
    )
    try:
        wait_until(lambda: _sync_states(pg_pair) == ["async"], 60, "the standby to be async")
        code, findings = _doctor(pg_pair.url)
        assert code == 6, findings
        [bad] = [f for f in findings if f["severity"] == "critical"]
        assert bad["setting"] == "replication" and bad["value"] == "asynchronous: pg1"
        assert "synchronous_standby_names" in bad["fix"]
    finally:
        pg_pair._execute(
            0, "ALTER SYSTEM RESET synchronous_standby_names", "SELECT pg_reload_conf()"
        )
        wait_until(
            lambda: _sync_states(pg_pair) in (["sync"], ["quorum"]), 60, "the standby sync again"
        )


def test_a_server_with_unsafe_settings_is_named_setting_by_setting() -> None:
    single = PostgresCluster(nodes=1)
    single.start()
    try:
        single._execute(
            0,
            "ALTER SYSTEM SET fsync = off",
            "ALTER SYSTEM SET full_page_writes = off",
            "ALTER SYSTEM SET synchronous_commit = off",
            "SELECT pg_reload_conf()",
        )
        code, findings = _doctor(single.url)
    finally:
        single.stop()
    assert code == 6, findings
    critical = {f["setting"]: f for f in findings if f["severity"] == "critical"}
    assert set(critical) == {"fsync", "full_page_writes", "synchronous_commit"}, findings
    assert all(f["value"] == "off" and f["fix"] for f in critical.values())
