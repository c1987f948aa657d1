"""The outbox store's own durability (msgsafe/checks/store.py, msgsafe/outbox/_mounts.py):
a SQLite file on memory or a container's writable layer (fake mountinfo, and the real
tmpfs /dev/shm), refused by the producer's default require= and reported by doctor alike,
and the PostgreSQL settings and replication that let a STORED row be lost."""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

import msgsafe.outbox._mounts as mounts
from msgsafe import Guarantee, Producer, Status
from msgsafe.checks.findings import Severity
from msgsafe.checks.store import postgres_findings, sqlite_findings
from msgsafe.cli import app
from msgsafe.errors import ConfigurationError, UnsafeOutbox
from msgsafe.outbox._mounts import ephemeral_mount, file_guarantee, mount_of, parse_mountinfo
from msgsafe.testing import MemoryBroker

#: A container: overlay root, a tmpfs, a persistent volume (ext4) and a path with a space.
MOUNTINFO = """\
612 540 0:55 / / rw,relatime master:313 - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w
613 612 0:58 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
620 612 0:60 / /run/scratch rw,nosuid,nodev - tmpfs tmpfs rw,size=65536k
621 612 8:1 /var/lib/docker/volumes/data/_data /data rw,relatime - ext4 /dev/sda1 rw
622 612 8:1 /srv/my\\040dir /mnt/my\\040dir rw,relatime - ext4 /dev/sda1 rw
623 621 0:61 / /data/tmp rw - tmpfs tmpfs rw
bad line
"""


def test_mountinfo_is_parsed_and_the_deepest_mount_wins() -> None:
    found = parse_mountinfo(MOUNTINFO)
    assert [m.point for m in found] == [
        "/",
        "/proc",
        "/run/scratch",
        "/data",
        "/mnt/my dir",
        "/data/tmp",
    ]
    assert mount_of(Path("/data/o.db"), found).fstype == "ext4"  # type: ignore[union-attr]
    assert mount_of(Path("/data/tmp/o.db"), found).fstype == "tmpfs"  # type: ignore[union-attr]
    assert mount_of(Path("/database/o.db"), found).point == "/"  # type: ignore[union-attr]
    assert mount_of(Path("/mnt/my dir/o.db"), found).fstype == "ext4"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("path", "fstype"),
    [
        ("/app/outbox.db", "overlay"),
        ("/run/scratch/outbox.db", "tmpfs"),
        ("/data/tmp/outbox.db", "tmpfs"),
        ("/data/outbox.db", None),
        ("/mnt/my dir/outbox.db", None),
    ],
)
def test_ephemeral_filesystems(path: str, fstype: str | None) -> None:
    found = ephemeral_mount(path, MOUNTINFO)
    assert (found.fstype if found else None) == fstype
    assert file_guarantee(path, MOUNTINFO)[0] is (Guarantee.NONE if fstype else Guarantee.DURABLE)
    findings = sqlite_findings(Path(path), MOUNTINFO)
    assert [f.severity for f in findings] == [Severity.CRITICAL if fstype else Severity.OK]
    assert findings[0].setting == "filesystem"


def test_unreadable_mountinfo_says_nothing_is_known(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mounts, "_MOUNTINFO", Path("/nonexistent/mountinfo"))
    assert ephemeral_mount("/app/o.db") is None
    assert file_guarantee("/app/o.db") == (Guarantee.UNKNOWN, None)
    assert [f.severity for f in sqlite_findings(Path("/app/o.db"))] == [Severity.UNKNOWN]


def _fake_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fstype: str) -> None:
    """This process's mountinfo, as if ``tmp_path`` were a mount of ``fstype``."""
    info = tmp_path / "mountinfo"
    info.write_text(
        "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n"
        f"2 1 0:50 / {tmp_path.resolve()} rw - {fstype} {fstype} rw\n"
    )
    monkeypatch.setattr(mounts, "_MOUNTINFO", info)


@pytest.mark.parametrize("fstype", ["tmpfs", "ramfs", "overlay"])
def test_the_default_refuses_an_outbox_that_does_not_outlive_the_machine(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, memory_broker: MemoryBroker, fstype: str
) -> None:
    _fake_root(monkeypatch, tmp_path, fstype)
    path = tmp_path / "o.db"
    for require in ("durable", "replicated"):
        with pytest.raises(UnsafeOutbox) as info:
            Producer(f"memory://{memory_broker.name}", outbox=path, require=require)
        err = info.value
        assert isinstance(err, ConfigurationError)
        assert err.store == str(path) and err.fix is not None and err.fix in str(err)
        assert f"require={require!r}" in str(err) and fstype in str(err)
        for fix in ("persistent volume", "postgresql://", "require='any'"):
            assert fix in err.fix
    # Refused before anything was kept open: the file is free for the next producer.
    with Producer(f"memory://{memory_broker.name}", outbox=path, require="any"):
        pass


def test_require_any_accepts_a_memory_outbox_and_its_receipts_say_so(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    memory_broker: MemoryBroker,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _fake_root(monkeypatch, tmp_path, "tmpfs")
    path = tmp_path / "o.db"
    url = f"memory://{memory_broker.name}"
    with (
        caplog.at_level(logging.WARNING, logger="msgsafe.outbox"),
        Producer(url, outbox=path, require="any") as first,
    ):
        confirmed = first.send("q", b"x")
        assert (confirmed.status, confirmed.store_guarantee) == (Status.CONFIRMED, None)
        memory_broker.down()
        stored = first.send("q", b"y")
        assert (stored.status, stored.store_guarantee) == (Status.STORED, Guarantee.NONE)
        batch = first.send_batch("q", [b"a", b"b"])
        assert batch.stored == 2 and batch.store_guarantee is Guarantee.NONE
        assert {r.store_guarantee for r in batch.receipts()} == {Guarantee.NONE}
        with Producer(url, outbox=path, require="any"):
            pass  # the same file again in this process: no second warning
        memory_broker.up()
    warned = [r for r in caplog.records if "outbox" in r.getMessage() and "tmpfs" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING
    assert str(path) in warned[0].getMessage() and "memory" in warned[0].getMessage()


def test_an_outbox_on_dev_shm_is_refused(memory_broker: MemoryBroker) -> None:
    # /dev/shm is a real tmpfs on the machines the suite runs on: no fake mount table.
    directory = Path(tempfile.mkdtemp(dir="/dev/shm"))
    try:
        assert file_guarantee(directory)[0] is Guarantee.NONE
        with pytest.raises(UnsafeOutbox, match="tmpfs mounted at /dev/shm"):
            Producer(f"memory://{memory_broker.name}", outbox=directory / "o.db")
    finally:
        shutil.rmtree(directory)


def test_an_outbox_on_a_disk_is_rated_durable_without_a_warning(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    memory_broker: MemoryBroker,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _fake_root(monkeypatch, tmp_path, "xfs")
    with (
        caplog.at_level(logging.WARNING, logger="msgsafe.outbox"),
        Producer(f"memory://{memory_broker.name}", outbox=tmp_path / "o.db") as producer,
    ):
        memory_broker.down()
        receipt = producer.send("q", b"x")
        assert (receipt.status, receipt.store_guarantee) == (Status.STORED, Guarantee.DURABLE)
        memory_broker.up()
    assert not [r for r in caplog.records if "outlive" in r.getMessage()]


@pytest.mark.parametrize("fstype", ["tmpfs", "ramfs", "overlay", "aufs", "ext4", "xfs", "nfs4"])
def test_doctor_and_the_producer_agree(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, memory_broker: MemoryBroker, fstype: str
) -> None:
    _fake_root(monkeypatch, tmp_path, fstype)
    path = tmp_path / "o.db"
    result = CliRunner().invoke(
        app, ["doctor", f"memory://{memory_broker.name}", "--outbox", str(path), "--json"]
    )
    [finding] = [f for f in json.loads(result.output)["findings"] if f["setting"] == "filesystem"]
    try:
        Producer(f"memory://{memory_broker.name}", outbox=path).close()
        refused = False
    except UnsafeOutbox:
        refused = True
    assert refused == (finding["severity"] == "critical") == (fstype in mounts.EPHEMERAL)
    assert result.exit_code == (6 if refused else 0), result.output


# --- PostgreSQL -------------------------------------------------------------------------

SAFE = {
    "fsync": "on",
    "full_page_writes": "on",
    "synchronous_commit": "on",
    "synchronous_standby_names": 'ANY 1 ("pg0", "pg1")',
}


def _worst(settings: dict[str, str], standbys: list[tuple[str, str, str | None]]) -> Severity:
    return max(f.severity for f in postgres_findings("outbox pg", settings, standbys))


def _settings(findings_of: dict[str, str]) -> dict[str, str]:
    return {**SAFE, **findings_of}


def test_a_synchronous_pair_is_fine() -> None:
    findings = postgres_findings("outbox pg", SAFE, [("pg1", "streaming", "quorum")])
    assert max(f.severity for f in findings) is Severity.OK
    assert any(f.setting == "replication" and "pg1" in f.value for f in findings)
    remote_apply = _settings({"synchronous_commit": "remote_apply"})
    assert _worst(remote_apply, [("pg1", "streaming", "sync")]) is Severity.OK


@pytest.mark.parametrize("setting", ["fsync", "full_page_writes", "synchronous_commit"])
def test_each_unsafe_setting_is_critical(setting: str) -> None:
    findings = postgres_findings(
        "outbox pg", _settings({setting: "off"}), [("pg1", "streaming", "sync")]
    )
    [bad] = [f for f in findings if f.severity is Severity.CRITICAL]
    assert bad.setting == setting and bad.value == "off" and bad.fix


def test_asynchronous_replication_is_critical_and_names_the_standby() -> None:
    settings = _settings({"synchronous_standby_names": ""})
    findings = postgres_findings("outbox pg", settings, [("pg1", "streaming", "async")])
    [bad] = [f for f in findings if f.severity is Severity.CRITICAL]
    assert bad.setting == "replication" and "pg1" in bad.value and "STORED" in bad.why
    # Beside a synchronous standby, an asynchronous one is a warning (promote the other).
    both = [("pg1", "streaming", "quorum"), ("pg2", "streaming", "async")]
    assert _worst(SAFE, both) is Severity.WARNING


def test_synchronous_commit_below_on_with_a_standby() -> None:
    standby = [("pg1", "streaming", "quorum")]
    assert _worst(_settings({"synchronous_commit": "local"}), standby) is Severity.CRITICAL
    assert _worst(_settings({"synchronous_commit": "remote_write"}), standby) is Severity.WARNING
    # One server: local is as durable as on.
    alone = _settings({"synchronous_commit": "local", "synchronous_standby_names": ""})
    assert _worst(alone, []) is Severity.INFO


def test_a_missing_standby_and_a_hidden_state() -> None:
    assert _worst(SAFE, []) is Severity.WARNING  # commits wait for the absent standby
    assert _worst(SAFE, [("pg1", "streaming", None)]) is Severity.UNKNOWN
