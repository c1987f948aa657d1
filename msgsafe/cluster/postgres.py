"""A PostgreSQL primary with synchronous streaming standbys, on loopback, from the
machine's own PostgreSQL (Debian ``postgresql``: ``/usr/lib/postgresql/<version>/bin``).

Node 0 starts as the *primary*; every other node is a *standby* made with
``pg_basebackup`` from it, streaming through a physical replication slot of its own and
named in the primary's ``synchronous_standby_names = 'ANY 1 (...)'``: a commit the
primary reports has reached one standby's disk (``synchronous_commit = on``), so a
promoted standby holds every commit a client was told of. A single node (``nodes=1``)
has no standby: it commits on its own disk alone (``synchronous_standby_names`` empty).

``initdb`` and ``postgres`` refuse to run as root: started by root, every server
process runs as ``run_as`` (default ``postgres``, the Debian package's user). Its data
lives in ``dir/<name>/data`` when that user can reach ``dir``; otherwise (a ``dir`` under
root's own 0700 directories, such as pytest's temp dirs) in a directory of its own under
``/var/tmp/msgsafe-postgres/``, named in ``cluster.json`` and removed with an owned dir.

Each node runs ``postgres`` itself (no ``pg_ctl``, no shell): ``kill`` SIGKILLs the
postmaster and every process it started, as a crash of its machine would (a postmaster
killed alone leaves backends that keep its shared memory), ``pause`` SIGSTOPs them all. Roles
are asked of the server (``pg_is_in_recovery()``): ``primary``, ``standby``, ``paused``
or None (stopped or not answering).

Fail-over is manual, as with a real pair without an HA manager: ``promote(NAME)`` turns a
standby into the primary once the primary is not running (two primaries would be a split
brain), and relaxes the new primary's ``synchronous_standby_names`` while it has no
standby (otherwise every commit would wait for one forever). ``restart`` of a node that a
promotion left behind rebuilds it as a standby of the new primary (a fresh
``pg_basebackup``: its unreplicated tail is discarded, as ``pg_rewind`` would) and
restores the synchronous standby on the primary once it streams.

Login: ``user``/``password`` (``msgsafe``/``msgsafe``) own the database ``database``;
:attr:`url` names every node with ``target_session_attrs=read-write``, so libpq finds the
primary whichever node it is. The superuser ``postgres`` has the same password (the
launcher's own connections, replication). Authentication is SCRAM on 127.0.0.1 only.

``pooler=True`` (``msgsafe cluster up postgres --pooler``) also starts PgBouncer in
transaction pooling mode in front of the primary (:mod:`msgsafe.cluster._pgbouncer`):
:attr:`pooler_url` is its address, re-pointed at a promoted standby by :meth:`promote`;
:meth:`stop` stops it too.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Self
from urllib.parse import quote

from msgsafe.cluster._pgbouncer import POOL_MODE, Pooler
from msgsafe.cluster._process import (
    free_ports,
    pid_alive,
    pid_paused,
    port_open,
    signal_pid,
    spawn,
    tail,
    wait_for,
)
from msgsafe.cluster.base import STATE_FILE, ClusterError, LocalCluster, NodeInfo

__all__ = ["INSTALL_HINT", "PostgresCluster", "postgres_bin"]

INSTALL_HINT = "apt-get install -y postgresql (or scripts/bootstrap.sh all)"

_HOST = "127.0.0.1"
_START_TIMEOUT = 60.0
_STOP_GRACE = 20.0
_SUPERUSER = "postgres"
#: Where data goes when the run-as user cannot reach the cluster's dir.
_SPARE_ROOT = Path("/var/tmp/msgsafe-postgres")
#: In a cluster's dir whose data lives under the spare root: that data is this dir's.
_SPARE_MARKER = "postgres-data"

#: Settings every node shares (written into postgresql.conf, which pg_basebackup copies).
#: Durable ones explicit: the outbox's promise rests on them (msgsafe doctor checks them).
_SETTINGS = {
    "listen_addresses": f"'{_HOST}'",
    "unix_socket_directories": "''",
    "max_connections": "200",
    "shared_buffers": "64MB",
    "wal_level": "replica",
    "max_wal_senders": "10",
    "max_replication_slots": "10",
    "wal_keep_size": "256MB",
    "hot_standby": "on",
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "wal_receiver_status_interval": "1s",
    "wal_sender_timeout": "10s",
    "wal_receiver_timeout": "10s",
    "logging_collector": "off",
    "log_min_messages": "warning",
}

_log = logging.getLogger("msgsafe.cluster.postgres")


def postgres_bin(program: str = "postgres") -> Path:
    """``program`` of the newest PostgreSQL under ``/usr/lib/postgresql`` (or
    ``$MSGSAFE_PG_BIN``); :class:`ClusterError` with the install command when absent."""
    folder = os.environ.get("MSGSAFE_PG_BIN")
    if folder:
        found = Path(folder) / program
    else:
        versions = sorted(
            (p for p in Path("/usr/lib/postgresql").glob("*/bin") if p.is_dir()),
            key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        )
        if not versions:
            raise ClusterError(f"PostgreSQL is not installed: {INSTALL_HINT}")
        found = versions[-1] / program
    if not found.is_file():
        raise ClusterError(f"{found} is missing: {INSTALL_HINT}")
    return found


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:
        raise ClusterError(
            "the postgres launcher needs psycopg: pip install 'msgsafe[postgres]'"
        ) from exc
    return psycopg


def _children(pid: int) -> list[int]:
    """Live (not zombie) child processes of ``pid``: a postmaster's backends and helpers.

    NOTE: not its process group: every PostgreSQL child calls setsid() when it starts,
    so a signal to the postmaster's group reaches the postmaster alone."""
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            # After the command: state, ppid.
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


def _signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        signal_pid(pid, sig)


def _reachable(path: Path, user: pwd.struct_passwd) -> bool:
    """Whether ``user`` may traverse every directory from / down to ``path``."""
    groups = {user.pw_gid} | {
        g.gr_gid for g in __import__("grp").getgrall() if user.pw_name in g.gr_mem
    }
    for folder in [*reversed(path.parents), path]:
        try:
            st = folder.stat()
        except FileNotFoundError:
            return True  # made by us below, owned by the user
        mode = st.st_mode
        if st.st_uid == user.pw_uid:
            ok = bool(mode & stat.S_IXUSR)
        elif st.st_gid in groups:
            ok = bool(mode & stat.S_IXGRP)
        else:
            ok = bool(mode & stat.S_IXOTH)
        if not ok:
            return False
    return True


class PostgresCluster(LocalCluster):
    """``nodes`` PostgreSQL servers in ``dir``: node 0 the primary, the others its
    synchronous streaming standbys (see the module docstring).

    ``dir`` None: a temp dir, removed by :meth:`stop`. Node ``i`` listens on
    ``base_port + i``, or on free ports. ``detached`` servers outlive this process
    (``msgsafe cluster up``); otherwise they die with it. ``run_as``: the user the
    servers run as when this process is root (ignored otherwise).
    """

    kind = "postgres"
    #: ``msgsafe cluster up postgres --pooler``: PgBouncer in front of the primary.
    supports_pooler = True

    def __init__(
        self,
        nodes: int = 2,
        dir: str | Path | None = None,
        base_port: int | None = None,
        detached: bool = False,
        *,
        user: str = "msgsafe",
        password: str = "msgsafe",
        database: str = "msgsafe",
        run_as: str = "postgres",
        pooler: bool = False,
        pooler_port: int | None = None,
    ) -> None:
        if nodes < 1:
            raise ClusterError("a PostgreSQL cluster has at least 1 node")
        self._take_dir(dir, "msgsafe-postgres-")
        self.detached = detached
        self.user = user
        self.password = password
        self.database = database
        self.names = [f"pg{i}" for i in range(nodes)]
        # The pooler's port is picked with the nodes' (after them), so that none comes twice.
        count = nodes + (1 if pooler else 0)
        picked = free_ports(count) if base_port is None else [base_port + i for i in range(count)]
        self.ports: list[int] = picked[:nodes]
        self.pids: list[int | None] = [None] * nodes
        #: The node that is (or, stopped, was last) the primary.
        self.primary = 0
        #: Whether the primary's synchronous standby requirement is relaxed (promoted alone).
        self.relaxed = False
        self.run_as: str | None = run_as if os.geteuid() == 0 else None
        self.data_root = self._pick_data_root()
        #: PgBouncer in front of the primary (``pooler=True``), else None.
        self.pooler: Pooler | None = None
        if pooler:
            self.pooler = Pooler(
                port=picked[nodes] if pooler_port is None else pooler_port,
                files=self.data_root / "pgbouncer",
                log_path=self.dir / "pgbouncer.log",
                database=database,
                logins={user: password, _SUPERUSER: password},
                run_as=self.run_as,
                detached=detached,
            )

    # --- files -----------------------------------------------------------------------------

    def _account(self) -> pwd.struct_passwd | None:
        if self.run_as is None:
            return None
        try:
            return pwd.getpwnam(self.run_as)
        except KeyError:
            raise ClusterError(
                f"PostgreSQL refuses to run as root and there is no user {self.run_as!r} "
                f"to run it as: {INSTALL_HINT} (the package makes the postgres user)"
            ) from None

    def _pick_data_root(self) -> Path:
        account = self._account()
        if account is None or self._own_dir or _reachable(self.dir, account):
            # A temp dir of our own is handed to the run-as user whole (see _own).
            return self.dir
        digest = hashlib.sha256(str(self.dir).encode()).hexdigest()[:16]
        return _SPARE_ROOT / digest

    def _data(self, node: int) -> Path:
        return self.data_root / self.names[node] / "data"

    def log_path(self, node: int) -> Path:
        """Where node ``node`` writes its server log (in the cluster's directory)."""
        return self.dir / f"{self.names[node]}.log"

    def _own(self, path: Path) -> None:
        """Make ``path`` and its parents below the data root the run-as user's (the data
        root too when this cluster made it: a spare or temp dir, never a user's own)."""
        account = self._account()
        if self.data_root != self.dir and not _SPARE_ROOT.exists():
            _SPARE_ROOT.mkdir(parents=True, exist_ok=True)
            _SPARE_ROOT.chmod(0o1777)
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        if account is None:
            return
        mine = self.data_root != self.dir or self._own_dir
        for folder in [path, *path.parents]:
            if folder == self.data_root and not mine:
                break
            os.chown(folder, account.pw_uid, account.pw_gid)
            if folder == self.data_root:
                break

    def _run(self, argv: list[str], what: str, *, env: dict[str, str] | None = None) -> None:
        """Run a PostgreSQL tool as the run-as user; :class:`ClusterError` on failure."""
        account = self._account()
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            env={**os.environ, "LC_ALL": "C", **(env or {})},
            user=None if account is None else account.pw_uid,
            group=None if account is None else account.pw_gid,
            extra_groups=None if account is None else [],
            cwd="/",
            check=False,
            timeout=_START_TIMEOUT,
        )
        if proc.returncode != 0:
            raise ClusterError(
                f"{what} failed (exit {proc.returncode})\n{proc.stdout}{proc.stderr}"
            )

    # --- connections -----------------------------------------------------------------------

    def _conninfo(self, node: int, *, superuser: bool = True, timeout: int = 2) -> str:
        user = _SUPERUSER if superuser else self.user
        dbname = "postgres" if superuser else self.database
        return (
            f"host={_HOST} port={self.ports[node]} user={user} password={self.password} "
            f"dbname={dbname} connect_timeout={timeout} application_name=msgsafe-cluster"
        )

    def _query(self, node: int, sql: str, *, timeout: int = 2) -> list[tuple[Any, ...]]:
        psycopg = _psycopg()
        with psycopg.connect(self._conninfo(node, timeout=timeout), autocommit=True) as conn:
            # The launcher's own writes must not wait for a standby that may be down.
            conn.execute("SET synchronous_commit TO local")
            rows: list[tuple[Any, ...]] = conn.execute(sql).fetchall()
            return rows

    def _execute(self, node: int, *statements: str) -> None:
        psycopg = _psycopg()
        with psycopg.connect(self._conninfo(node), autocommit=True) as conn:
            conn.execute("SET synchronous_commit TO local")
            for sql in statements:
                conn.execute(sql)

    def _role(self, node: int) -> str | None:
        pid = self.pids[node]
        if not pid_alive(pid):
            return None
        if pid_paused(pid):
            return "paused"
        if not port_open(self.ports[node]):
            return None
        try:
            rows = self._query(node, "SELECT pg_is_in_recovery()", timeout=1)
        except Exception:  # starting, shutting down, or too busy: not known now
            return None
        return "standby" if rows and rows[0][0] else "primary"

    def _streaming(self, primary: int, node: int, *, sync: bool = True) -> bool:
        """True when ``node`` streams from ``primary`` (``sync``: as a synchronous, or
        quorum, standby)."""
        try:
            rows = self._query(
                primary,
                "SELECT sync_state FROM pg_stat_replication WHERE application_name = "
                f"'{self.names[node]}' AND state = 'streaming'",
                timeout=1,
            )
        except Exception:  # the primary is restarting: not yet
            return False
        return bool(rows) and (not sync or rows[0][0] in ("sync", "quorum"))

    # --- lifecycle -------------------------------------------------------------------------

    def _sync_names(self) -> str:
        """The primary's ``synchronous_standby_names``: any one of the nodes; empty for
        a single node, which has no standby to wait for (naming itself would make every
        COMMIT wait for ever)."""
        if len(self.names) == 1:
            return "''"
        return "'ANY 1 (" + ", ".join(f'"{n}"' for n in self.names) + ")'"

    def _initdb(self) -> None:
        data = self._data(0)
        self._own(data.parent)
        if self.data_root != self.dir:
            (self.dir / _SPARE_MARKER).write_text(f"{self.data_root}\n")
        account = self._account()
        with tempfile.NamedTemporaryFile("w", dir=data.parent, delete=False) as pw:
            pw.write(self.password + "\n")
        pwfile = Path(pw.name)
        try:
            if account is not None:
                os.chown(pwfile, account.pw_uid, account.pw_gid)
            self._run(
                [
                    str(postgres_bin("initdb")),
                    "-D",
                    str(data),
                    "-U",
                    _SUPERUSER,
                    f"--pwfile={pwfile}",
                    "--auth-host=scram-sha-256",
                    "--auth-local=scram-sha-256",
                    "-E",
                    "UTF8",
                    "--locale=C",
                    "--data-checksums",
                ],
                "initdb",
            )
        finally:
            pwfile.unlink(missing_ok=True)
        settings = {**_SETTINGS, "synchronous_standby_names": self._sync_names()}
        with open(data / "postgresql.conf", "a") as conf:
            conf.write("\n# msgsafe cluster\n")
            conf.writelines(f"{k} = {v}\n" for k, v in settings.items())
        (data / "pg_hba.conf").write_text(
            "# msgsafe cluster: loopback only, SCRAM\n"
            f"host all all {_HOST}/32 scram-sha-256\n"
            f"host replication {_SUPERUSER} {_HOST}/32 scram-sha-256\n"
        )

    def _spawn(self, node: int) -> None:
        log = self.log_path(node)
        self.dir.mkdir(parents=True, exist_ok=True)
        argv = [str(postgres_bin()), "-D", str(self._data(node)), "-p", str(self.ports[node])]
        self.pids[node] = spawn(
            argv, log=log, cwd=Path("/"), detached=self.detached, user=self.run_as
        )
        _log.info("started PostgreSQL %s on %s:%d", self.names[node], _HOST, self.ports[node])

    def _wait_serving(self, node: int, role: str, deadline: float) -> None:
        def ready() -> bool:
            if not pid_alive(self.pids[node]):
                raise ClusterError(
                    f"PostgreSQL {self.names[node]} exited\n" + tail(self.log_path(node))
                )
            return self._role(node) == role

        wait_for(
            ready,
            max(0.0, deadline - time.monotonic()),
            f"PostgreSQL {self.names[node]} to serve as {role}",
            on_timeout=lambda: tail(self.log_path(node)),
        )

    def _wait_streaming(self, node: int, deadline: float, *, sync: bool = True) -> None:
        wait_for(
            lambda: self._streaming(self.primary, node, sync=sync),
            max(0.0, deadline - time.monotonic()),
            f"PostgreSQL {self.names[node]} to stream from {self.names[self.primary]}",
            # Both sides: a standby that cannot connect says little of why the primary
            # is gone.
            on_timeout=lambda: "\n".join(
                [
                    tail(self.log_path(node)),
                    f"primary {self.names[self.primary]} (pid {self.pids[self.primary]}) "
                    + ("runs" if pid_alive(self.pids[self.primary]) else "is not running"),
                    tail(self.log_path(self.primary)),
                ]
            ),
        )

    def _make_standby(self, node: int) -> None:
        """A fresh copy of the primary in ``node``'s data dir, set to stream from it."""
        data = self._data(node)
        shutil.rmtree(data, ignore_errors=True)
        self._own(data.parent)
        slot = self.names[node]
        # A slot left from an earlier life of this standby would keep old WAL forever.
        self._execute(
            self.primary,
            f"SELECT pg_drop_replication_slot('{slot}') FROM pg_replication_slots "
            f"WHERE slot_name = '{slot}' AND NOT active",
        )
        self._run(
            [
                str(postgres_bin("pg_basebackup")),
                "-h",
                _HOST,
                "-p",
                str(self.ports[self.primary]),
                "-U",
                _SUPERUSER,
                "-D",
                str(data),
                "-X",
                "stream",
                "-C",
                "-S",
                slot,
                "--checkpoint=fast",
            ],
            f"pg_basebackup of {self.names[node]}",
            env={"PGPASSWORD": self.password},
        )
        (data / "standby.signal").write_text("")
        self._own_file(data / "standby.signal")
        self._point_at_primary(node)

    def _point_at_primary(self, node: int) -> None:
        """Write standby ``node``'s ``primary_conninfo`` for the primary's port now: a
        cluster started again may have other ports than the one its copy was made from."""
        data = self._data(node)
        conninfo = (
            f"host={_HOST} port={self.ports[self.primary]} user={_SUPERUSER} "
            f"password={self.password} application_name={self.names[node]}"
        )
        # Replaces whatever ALTER SYSTEM left in the copy (a relaxed primary's settings).
        (data / "postgresql.auto.conf").write_text(
            f"primary_conninfo = '{conninfo}'\nprimary_slot_name = '{self.names[node]}'\n"
        )
        self._own_file(data / "postgresql.auto.conf")

    def _own_file(self, path: Path) -> None:
        account = self._account()
        if account is not None:
            os.chown(path, account.pw_uid, account.pw_gid)
            path.chmod(0o600)

    def start(self, timeout: float | None = None) -> None:
        """Start the primary, then every standby (made from it on the first start); return
        once the primary takes writes and every standby streams synchronously."""
        deadline = time.monotonic() + (timeout if timeout is not None else _START_TIMEOUT)
        if any(pid_alive(p) for p in self.pids):
            raise ClusterError(f"the PostgreSQL cluster in {self.dir} is already running")
        postgres_bin()
        self.dir.mkdir(parents=True, exist_ok=True)
        if self._own_dir and self.run_as is not None:
            self._own(self.dir)
        try:
            self._forget_stale_data()
            fresh = not (self._data(self.primary) / "PG_VERSION").exists()
            if fresh:
                self.primary = 0
                self._initdb()
            self._spawn(self.primary)
            self._wait_serving(self.primary, "primary", deadline)
            if fresh:
                self._execute(
                    self.primary,
                    f"CREATE ROLE {self.user} LOGIN PASSWORD '{self.password}'",
                    f"CREATE DATABASE {self.database} OWNER {self.user}",
                    # What msgsafe doctor reads: pg_stat_replication's sync_state.
                    f"GRANT pg_monitor TO {self.user}",
                )
            for node in range(len(self.names)):
                if node == self.primary:
                    continue
                if not (self._data(node) / "PG_VERSION").exists() or self._left_behind(node):
                    self._make_standby(node)
                else:
                    self._point_at_primary(node)
                self._spawn(node)
            for node in range(len(self.names)):
                if node != self.primary:
                    self._wait_streaming(node, deadline, sync=not self.relaxed)
            self._restore_sync()
            for node in range(len(self.names)):
                if node != self.primary:
                    self._wait_streaming(node, deadline)
            if self.pooler is not None:
                self._own(self.pooler.files)
                self.pooler.start(self.ports[self.primary], deadline)
        except BaseException:
            self.stop()
            raise
        if self.detached:
            self.save_state()

    def _forget_stale_data(self) -> None:
        """Remove data under the spare root that no cluster in this dir made: a dir of
        that name held a cluster once and was deleted (a test's temp dir, a user's
        ``rm -r``) while its data stayed behind, keyed by the dir's path. A new cluster
        there must not start on the old one's rows, nor on its ports."""
        if self.data_root == self.dir or not self.data_root.exists():
            return
        if (self.dir / _SPARE_MARKER).exists() or (self.dir / STATE_FILE).exists():
            return
        _log.info("removing %s: data of an earlier cluster in %s", self.data_root, self.dir)
        shutil.rmtree(self.data_root, ignore_errors=True)

    def _left_behind(self, node: int) -> bool:
        """True when ``node``'s data is a former primary's (no standby.signal)."""
        return not (self._data(node) / "standby.signal").exists()

    def _restore_sync(self) -> None:
        """Require a synchronous standby again on a relaxed primary."""
        if self.relaxed:
            self._execute(
                self.primary,
                "ALTER SYSTEM RESET synchronous_standby_names",
                "SELECT pg_reload_conf()",
            )
            self.relaxed = False

    def _stop_node(self, node: int) -> None:
        pid = self.pids[node]
        if pid is not None and pid_alive(pid):
            _signal_all([pid, *_children(pid)], signal.SIGCONT)
            # SIGINT: fast shutdown (SIGTERM would wait for every client to leave).
            signal_pid(pid, signal.SIGINT)
            deadline = time.monotonic() + _STOP_GRACE
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
        self._kill_group(node)

    def _kill_group(self, node: int) -> None:
        """SIGKILL the postmaster and every process it started, as a crash would."""
        pid = self.pids[node]
        if not pid_alive(pid):
            # Gone (its children, if any, went to init with it): a pid that another
            # process has since been given must not have that process's children listed.
            self.pids[node] = None
            return
        assert pid is not None
        # Stopped first, so that it forks nothing between the listing and the kill.
        _signal_all([pid], signal.SIGSTOP)
        family = [pid, *_children(pid)]
        _signal_all(family, signal.SIGKILL)
        wait_for(
            lambda: not any(pid_alive(p) for p in family),
            10.0,
            f"every process of PostgreSQL {self.names[node]} to be gone",
        )
        self.pids[node] = None

    def stop(self) -> None:
        """Stop every node (fast shutdown, primary first so standbys get its last WAL;
        SIGKILL after a grace period); idempotent."""
        if self.pooler is not None:
            self.pooler.stop()
        order = [self.primary, *(n for n in range(len(self.names)) if n != self.primary)]
        for node in order:
            self._stop_node(node)
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            if self.data_root != self.dir:
                shutil.rmtree(self.data_root, ignore_errors=True)
        elif self.detached and self.dir.exists():
            self.save_state()

    def delete_data(self) -> None:
        super().delete_data()
        if self.data_root != self.dir:
            shutil.rmtree(self.data_root, ignore_errors=True)

    def kill(self, node: int) -> None:
        """SIGKILL node ``node``'s postmaster and its processes (its data stays, as after a
        crash)."""
        self._check(node)
        self._kill_group(node)
        if self.detached:
            self.save_state()

    def restart(self, node: int, timeout: float | None = None) -> None:
        """Start node ``node`` again on its port and wait until it serves: the primary
        until it takes writes and every running standby streams from it again (its
        commits wait for a synchronous standby), a standby until it streams (when the
        primary runs). A former primary left behind by a promotion is rebuilt as a
        standby first."""
        self._check(node)
        if pid_alive(self.pids[node]):
            raise ClusterError(f"PostgreSQL {self.names[node]} is running; kill it first")
        deadline = time.monotonic() + (timeout if timeout is not None else _START_TIMEOUT)
        if node == self.primary:
            self._spawn(node)
            self._wait_serving(node, "primary", deadline)
            for standby in range(len(self.names)):
                if standby != node and self._role(standby) == "standby":
                    self._wait_streaming(standby, deadline, sync=not self.relaxed)
        else:
            primary_up = self._role(self.primary) == "primary"
            if self._left_behind(node):
                if not primary_up:
                    raise ClusterError(
                        f"{self.names[node]} must be rebuilt from the primary "
                        f"{self.names[self.primary]}, which is not running"
                    )
                self._make_standby(node)
            self._spawn(node)
            if primary_up:
                self._wait_streaming(node, deadline, sync=not self.relaxed)
                self._restore_sync()
                self._wait_streaming(node, deadline)
            else:
                self._wait_serving(node, "standby", deadline)
        if self.detached:
            self.save_state()

    def promote(self, node: int, timeout: float | None = None) -> None:
        """Make standby ``node`` the primary (the primary must not be running: two
        primaries would be a split brain); with no other standby streaming it commits
        without a synchronous standby until one is back (see the module docstring)."""
        self._check(node)
        if node == self.primary:
            raise ClusterError(f"{self.names[node]} is the primary already")
        if pid_alive(self.pids[self.primary]):
            raise ClusterError(
                f"the primary {self.names[self.primary]} still runs: kill or stop it "
                "first (two primaries would be a split brain)"
            )
        if self._role(node) != "standby":
            raise ClusterError(f"{self.names[node]} is not a running standby")
        deadline = time.monotonic() + (timeout if timeout is not None else _START_TIMEOUT)
        self._query(node, "SELECT pg_promote(true, 60)", timeout=5)
        self.primary = node
        self._wait_serving(node, "primary", deadline)
        if self.pooler is not None:
            self.pooler.repoint(self.ports[node])
        others = [
            n
            for n in range(len(self.names))
            if n != node and self._role(n) == "standby" and self._follows(n, node)
        ]
        if not others:
            self._execute(
                node, "ALTER SYSTEM SET synchronous_standby_names = ''", "SELECT pg_reload_conf()"
            )
            self.relaxed = True
        if self.detached:
            self.save_state()

    def _follows(self, node: int, primary: int) -> bool:
        # NOTE: a standby of the old primary does not follow a promoted one by itself
        # (its primary_conninfo names the old one); only a standby that streams from
        # the new primary counts.
        return self._streaming(primary, node)

    def pause(self, node: int) -> None:
        """SIGSTOP node ``node``'s processes: its sockets stay open, it answers
        nothing."""
        self._check(node)
        pid = self.pids[node]
        if pid is None or not pid_alive(pid):
            raise ClusterError(f"PostgreSQL {self.names[node]} is not running")
        # The postmaster first: stopped, it starts no process that would run on.
        _signal_all([pid], signal.SIGSTOP)
        _signal_all(_children(pid), signal.SIGSTOP)
        wait_for(lambda: pid_paused(pid), 10.0, f"PostgreSQL {self.names[node]} to stop")

    def resume(self, node: int) -> None:
        """SIGCONT a paused node."""
        self._check(node)
        pid = self.pids[node]
        if pid is not None and pid_alive(pid):
            _signal_all(_children(pid), signal.SIGCONT)
            _signal_all([pid], signal.SIGCONT)

    def _check(self, node: int) -> None:
        if not 0 <= node < len(self.names):
            raise ClusterError(f"no node {node}: nodes are 0..{len(self.names) - 1}")

    # --- what it looks like ----------------------------------------------------------------

    def _credentials(self) -> str:
        return f"{quote(self.user, safe='')}:{quote(self.password, safe='')}@"

    @property
    def url(self) -> str:
        """``postgresql://user:pw@127.0.0.1:P0,127.0.0.1:P1/db?target_session_attrs=
        read-write``: libpq tries the hosts in order and keeps the one taking writes."""
        hosts = ",".join(f"{_HOST}:{p}" for p in self.ports)
        return (
            f"postgresql://{self._credentials()}{hosts}/{self.database}"
            "?target_session_attrs=read-write"
        )

    @property
    def pooler_url(self) -> str:
        """``postgresql://user:pw@127.0.0.1:<PgBouncer's port>/db``: the primary through
        PgBouncer in transaction pooling mode; :class:`ClusterError` without a pooler."""
        if self.pooler is None:
            raise ClusterError("this PostgreSQL cluster runs no pooler (pooler=True, --pooler)")
        return f"postgresql://{self._credentials()}{_HOST}:{self.pooler.port}/{self.database}"

    def node_url(self, node: int) -> str:
        """``postgresql://user:pw@127.0.0.1:<port of node>/db``."""
        self._check(node)
        return f"postgresql://{self._credentials()}{_HOST}:{self.ports[node]}/{self.database}"

    def nodes(self) -> list[NodeInfo]:
        """Every node; ``role`` is ``primary``, ``standby``, ``paused`` or None."""
        return [
            NodeInfo(
                name=self.names[n],
                pid=self.pids[n] if pid_alive(self.pids[n]) else None,
                host=_HOST,
                port=self.ports[n],
                running=pid_alive(self.pids[n]),
                role=self._role(n),
            )
            for n in range(len(self.names))
        ]

    def describe(self) -> dict[str, Any]:
        """The common description plus the data directory and the PostgreSQL version;
        with a pooler, ``pooler``: its ``url``, ``mode``, ``port``, ``pid``, ``running``."""
        described = {
            **super().describe(),
            "data": str(self.data_root),
            "version": postgres_bin().parent.parent.name,
        }
        if self.pooler is not None:
            described["pooler"] = {
                "url": self.pooler_url,
                "mode": POOL_MODE,
                "port": self.pooler.port,
                "pid": self.pooler.pid if self.pooler.running else None,
                "running": self.pooler.running,
            }
        return described

    # --- found again from another process --------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Ports, pids, login, who is primary and where the data lives."""
        return {
            "names": self.names,
            "ports": self.ports,
            "pids": self.pids,
            "primary": self.primary,
            "relaxed": self.relaxed,
            "user": self.user,
            "password": self.password,
            "database": self.database,
            "run_as": self.run_as,
            "data_root": str(self.data_root),
            "detached": self.detached,
            "pooler": None
            if self.pooler is None
            else {"port": self.pooler.port, "pid": self.pooler.pid},
        }

    @classmethod
    def from_state(cls, dir: Path, state: dict[str, Any]) -> Self:
        """Re-attach to a cluster that :meth:`save_state` described."""
        try:
            cluster = cls(
                nodes=len(state["ports"]),
                dir=dir,
                detached=bool(state.get("detached", True)),
                user=str(state["user"]),
                password=str(state["password"]),
                database=str(state["database"]),
                run_as=str(state.get("run_as") or "postgres"),
                pooler=bool(state.get("pooler")),
                pooler_port=int(state["pooler"]["port"]) if state.get("pooler") else None,
            )
            cluster.names = [str(n) for n in state["names"]]
            cluster.ports = [int(p) for p in state["ports"]]
            cluster.pids = [None if p is None else int(p) for p in state["pids"]]
            cluster.primary = int(state["primary"])
            cluster.relaxed = bool(state.get("relaxed", False))
            cluster.data_root = Path(state["data_root"])
            if cluster.pooler is not None:
                cluster.pooler.files = cluster.data_root / "pgbouncer"
                pid = state["pooler"].get("pid")
                cluster.pooler.pid = None if pid is None else int(pid)
        except (KeyError, TypeError, ValueError) as exc:
            raise ClusterError(f"cluster.json in {dir} is not a PostgreSQL cluster: {exc}") from exc
        return cluster
