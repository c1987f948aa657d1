"""PgBouncer in transaction pooling mode in front of a :class:`PostgresCluster`'s primary
(``msgsafe cluster up postgres --pooler``), from Debian's ``pgbouncer`` package.

What a platform team puts between a fleet and its database: every client transaction
gets whichever server connection is free, so nothing that lives in a server session
(prepared statements, session advisory locks, ``LISTEN``, ``SET``) follows a client from
one transaction to the next. The outbox, the inbox and the doctor are tested through it
(docs/postgres-outbox.md, "Behind PgBouncer").

One process on 127.0.0.1, run as the cluster's run-as user when started by root
(PgBouncer refuses to run as root). Its files (``pgbouncer.ini``, ``userlist.txt``, both
0600) live in ``<data root>/pgbouncer``; its log is ``<dir>/pgbouncer.log``. It serves
one database, the cluster's, on the current primary's port: :meth:`Pooler.repoint`
rewrites the file and reloads (SIGHUP) after a promotion.

Authentication: SCRAM to clients and to the server, with the passwords in
``userlist.txt`` (PgBouncer needs them in clear, or as SCRAM secrets, to log in to the
server on a client's behalf).
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import signal
import time
from pathlib import Path

from msgsafe.cluster._process import (
    pid_alive,
    port_open,
    signal_pid,
    spawn,
    stop_pid,
    tail,
    wait_for,
)
from msgsafe.cluster.base import ClusterError

__all__ = ["POOL_MODE", "PGBOUNCER_HINT", "Pooler", "pgbouncer_bin"]

PGBOUNCER_HINT = "apt-get install -y pgbouncer (or scripts/bootstrap.sh all)"
#: The mode this launcher runs: the one that drops session state between transactions.
POOL_MODE = "transaction"

_HOST = "127.0.0.1"
_STOP_GRACE = 10.0

log = logging.getLogger("msgsafe.cluster.postgres")


def pgbouncer_bin() -> Path:
    """The ``pgbouncer`` program (``$PATH`` or ``/usr/sbin``); :class:`ClusterError` with
    the install command when absent."""
    found = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin")
    if found is None:
        raise ClusterError(f"pgbouncer is not installed: {PGBOUNCER_HINT}")
    return Path(found)


def _quote(value: str) -> str:
    return '"' + value.replace('"', '""') + '"'


class Pooler:
    """One PgBouncer process on ``port`` in front of ``127.0.0.1:<server port>``.

    ``files``: the folder for its configuration (readable by ``run_as``); ``log_path``:
    where its output goes; ``logins``: user -> password it may log in with.
    """

    def __init__(
        self,
        *,
        port: int,
        files: Path,
        log_path: Path,
        database: str,
        logins: dict[str, str],
        run_as: str | None,
        detached: bool,
        pid: int | None = None,
    ) -> None:
        self.port = port
        self.files = files
        self.log_path = log_path
        self.database = database
        self._logins = logins
        self.run_as = run_as
        self.detached = detached
        self.pid = pid

    @property
    def ini(self) -> Path:
        """Its configuration file."""
        return self.files / "pgbouncer.ini"

    def _write(self, server_port: int) -> None:
        self.files.mkdir(parents=True, exist_ok=True, mode=0o700)
        users = self.files / "userlist.txt"
        users.write_text(
            "".join(f"{_quote(u)} {_quote(p)}\n" for u, p in sorted(self._logins.items()))
        )
        tmp = self.ini.with_suffix(".tmp")
        tmp.write_text(
            "[databases]\n"
            f"{self.database} = host={_HOST} port={server_port} dbname={self.database}\n"
            "\n[pgbouncer]\n"
            f"listen_addr = {_HOST}\n"
            f"listen_port = {self.port}\n"
            # No Unix socket: two clusters on one machine would fight over /tmp's.
            "unix_socket_dir =\n"
            f"pool_mode = {POOL_MODE}\n"
            "auth_type = scram-sha-256\n"
            f"auth_file = {users}\n"
            "max_client_conn = 500\n"
            "default_pool_size = 20\n"
            # NOTE: PgBouncer waits server_login_retry (15 s by default) after a failed
            # server login: a restarted or promoted primary would be shunned that long.
            "server_login_retry = 1\n"
            "server_connect_timeout = 5\n"
            # psycopg and libpq send no extra_float_digits, JDBC does: accept it.
            "ignore_startup_parameters = extra_float_digits\n"
            "log_connections = 0\n"
            "log_disconnections = 0\n"
        )
        account = None if self.run_as is None else pwd.getpwnam(self.run_as)
        for path in (self.files, users, tmp):
            if account is not None:
                os.chown(path, account.pw_uid, account.pw_gid)
            if path != self.files:
                path.chmod(0o600)
        tmp.replace(self.ini)

    def start(self, server_port: int, deadline: float) -> None:
        """Start PgBouncer in front of ``server_port`` and wait until it listens."""
        if pid_alive(self.pid):
            return
        program = pgbouncer_bin()
        self._write(server_port)
        self.pid = spawn(
            [str(program), str(self.ini)],
            log=self.log_path,
            cwd=Path("/"),
            detached=self.detached,
            user=self.run_as,
        )

        def listening() -> bool:
            if not pid_alive(self.pid):
                raise ClusterError("pgbouncer exited\n" + tail(self.log_path))
            return port_open(self.port)

        wait_for(
            listening,
            max(0.0, deadline - time.monotonic()),
            f"pgbouncer to listen on {_HOST}:{self.port}",
            on_timeout=lambda: tail(self.log_path),
        )
        log.info("started pgbouncer (%s pooling) on %s:%d", POOL_MODE, _HOST, self.port)

    def repoint(self, server_port: int) -> None:
        """Serve the database from ``server_port`` from now on (a promoted primary):
        rewrite the file and reload; PgBouncer closes the old server connections."""
        self._write(server_port)
        signal_pid(self.pid, signal.SIGHUP)

    def stop(self) -> None:
        """Stop it (SIGTERM: immediate shutdown; SIGKILL after a grace); idempotent."""
        stop_pid(self.pid, "pgbouncer", _STOP_GRACE)
        self.pid = None

    @property
    def running(self) -> bool:
        """Whether the process is alive."""
        return pid_alive(self.pid)
