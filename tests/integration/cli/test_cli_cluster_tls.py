"""``msgsafe cluster up rabbitmq --tls --json``: the certificates are written into the
cluster dir (private keys 0600), their paths and a TLS URL are in the JSON, and that URL
carries messages over mutual TLS; ``status`` finds them again from another process;
a kind without TLS says so (exit 3).

Why tansu: it is the one kind the launcher starts without TLS, so only it can show the
refusal."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tests.support.commands import msgsafe
from tests.support.tls_checks import round_trip

pytestmark = pytest.mark.integration


def test_cluster_up_tls_writes_certificates_and_serves_mutual_tls(tmp_path: Path) -> None:
    where = str(tmp_path / "rabbit")
    up = msgsafe("cluster", "up", "rabbitmq", "--nodes", "1", "--tls", "--dir", where, "--json")
    try:
        assert up.code == 0, up.stderr
        tls = up.json()["tls"]
        for key in ("ca", "server_cert", "server_key", "client_cert", "client_key"):
            assert Path(tls[key]).is_file(), key
            assert Path(tls[key]).parent == tmp_path / "rabbit" / "tls"
        for key in ("server_key", "client_key"):
            assert stat.S_IMODE(Path(tls[key]).stat().st_mode) == 0o600, key
        assert tls["url"].startswith("amqps://") and len(tls["ports"]) == 1
        assert round_trip(tls["url"], "cli-tls", count=20, declare="quorum") == (20, 20)
        again = msgsafe("cluster", "status", "--dir", where, "--json")
        assert again.code == 0 and again.json()["tls"] == tls
    finally:
        down = msgsafe("cluster", "down", "--dir", where)
    assert down.code == 0, down.stderr


def test_a_kind_without_tls_says_so(tmp_path: Path) -> None:
    run = msgsafe("cluster", "up", "tansu", "--tls", "--dir", str(tmp_path / "t"))
    assert run.code == 3
    assert "tansu has no --tls" in run.stderr and "rabbitmq" in run.stderr
