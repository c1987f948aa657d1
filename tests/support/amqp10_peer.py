"""A small AMQP 1.0 broker for tests, built on proton's ``Container``.

It listens on a loopback port, stores messages per address, forwards them to attached
receivers within their credit, and settles every incoming transfer with an outcome.
Several peers may share one SQLite store file: that is a "cluster" whose members hold
the same queues, so a client that fails over from one peer to another finds its
messages there (what a Qpid / ActiveMQ HA group gives its clients).

Behaviour is chosen per address so one peer serves every test:

- ``reject/...``  incoming messages are rejected with condition ``amqp:precondition-failed``
- ``release/...`` incoming messages are released
- ``modify/...``  incoming messages are modified (``delivery-failed``)
- ``silent/...``  incoming messages are never settled (a confirm timeout)
- ``sink/...``    incoming messages are accepted at once and dropped (benchmarks: the
  peer's own cost kept out of a client's figures)
- ``missing/...`` a sender link is refused with ``amqp:not-found`` (no such address, on a
  connection that stays healthy)
- anything else  stored durably (committed to the store) and then accepted

Every peer advertises its ``--advertise`` list in the open frame's ``failover-server-list``
property, as Qpid brokers do: a list of maps with ``network-host``, ``hostname``, ``port``
and ``scheme``.

With ``--refuse`` the peer behaves as a Qpid Broker-J HA replica (or a member of a group
without quorum): it answers every open with an open immediately followed by a close
carrying ``amqp:connection:forced`` ("Virtual host ... is not active"), exactly what a
real Broker-J 9.2 replica sends, so clients move on.

With ``--stale`` the peer behaves as a Broker-J master just resumed after a pause (it
still calls itself master, can commit nothing, and steps down): every sender link is
refused with ``amqp:not-found``, and the connection is then closed
(``amqp:connection:forced``) a moment later. A real group shows this only after a
SIGSTOP of about a minute (``tests/integration/cluster/test_qpid_cluster.py`` does it
once); here the client's handling of it is tested in a second.

With ``--mute-attach`` the peer opens connections and keeps them alive (proton answers
heartbeats) but never answers a link's attach, as Broker-J once did to a link whose name
was still attached on a dying connection; no broker can be made to do it on demand.

With ``--redirect HOST:PORT`` every connection is answered with an open and a close
carrying ``amqp:connection:redirect`` to HOST:PORT (``--redirect self``: to the peer's
own port, a redirect loop); with ``--link-redirect HOST:PORT`` connections are served
but every sender link is detached with ``amqp:link:redirect``.

Which tests still need it, and why (everything else runs on the real brokers: the
session's ActiveMQ Artemis pair, the Broker-J group, RabbitMQ's AMQP 1.0 plugin):

- ``tests/integration/amqp10/test_peer_basics.py``: every outcome on demand on one
  healthy connection (``rejected``, ``released``, ``modified``, never settled) — no
  broker here settles a transfer as ``modified`` or leaves it unsettled when asked; and a
  TLS listener with the suite's throw-away CA (the session's Artemis pair has no TLS
  acceptor).
- ``tests/integration/amqp10/test_peer_failover.py``:
  the redirect tests (followed, refused by the allow-list, a loop bounded) — no broker
  the suite runs sends redirects: a Broker-J 9.2 BDB HA replica closes with
  ``amqp:connection:forced`` (its virtual host's ``getRedirectHost`` is hard-wired to
  null; only a static "Redirector" virtual host node redirects), Artemis never does;
  a TLS peer advertising plain-TCP candidates (the downgrade refused) and arbitrary
  advertised lists for the allow-list / IGNORE cases — no broker can be made to advertise
  a list other than its own cluster's; the stale Broker-J master (``--stale``), which a
  real group shows only after a SIGSTOP of about a minute (done once in
  ``test_qpid_cluster.py``); a link refused with ``amqp:not-found`` on a connection that
  stays healthy; an attach never answered on a live connection (``--mute-attach``); and
  the URL-list / advertised-candidate fail-over counts at 5 to 10k
  messages in seconds, whose real-broker counterparts run in
  ``tests/integration/cluster/test_artemis_cluster.py`` and ``test_qpid_cluster.py``.
- ``benchmarks/bench_amqp10.py --broker peer``: a broker whose own cost can be removed
  (``sink/``), to measure the clients alone.

Run it as its own process so a kill is real::

    python tests/support/amqp10_peer.py --store /tmp/s.db --advertise amqp://127.0.0.1:5673

It prints ``READY <port>`` once listening and ``CONNECTED <n>`` for each client
connection. :class:`PeerProcess` wraps that for test fixtures.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from msgsafe.cluster._process import pid_alive

__all__ = ["PeerProcess", "main"]

_POLL_S = 0.02


def _schema(db: sqlite3.Connection) -> None:
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute(
        "CREATE TABLE IF NOT EXISTS messages ("
        " seq INTEGER PRIMARY KEY AUTOINCREMENT,"
        " address TEXT NOT NULL,"
        " data BLOB NOT NULL,"
        " owner INTEGER,"
        " deliveries INTEGER NOT NULL DEFAULT 0)"
    )
    db.execute("CREATE INDEX IF NOT EXISTS by_address ON messages(address, owner, seq)")
    db.commit()


def _run_peer(args: argparse.Namespace) -> None:
    # proton is imported here so importing this module (for PeerProcess) needs no proton.
    from proton import Condition, Connection, Delivery, Message, SSLDomain, symbol
    from proton.handlers import EndpointStateHandler, MessagingHandler
    from proton.reactor import Container

    db = sqlite3.connect(args.store, timeout=30.0, isolation_level=None)
    _schema(db)
    pid = os.getpid()

    def candidates() -> list[dict[Any, Any]]:
        items: list[dict[Any, Any]] = []
        for text in args.advertise:
            scheme, _, rest = text.partition("://")
            host, _, port = rest.rpartition(":")
            items.append(
                {
                    symbol("network-host"): host,
                    symbol("hostname"): host,
                    symbol("port"): int(port),
                    symbol("scheme"): scheme,
                }
            )
        return items

    class Peer(MessagingHandler):
        def __init__(self) -> None:
            super().__init__(prefetch=0, auto_accept=False, auto_settle=False)
            self.pending: list[tuple[Any, str, bytes]] = []
            self.receivers: dict[Any, str] = {}
            self.outgoing: dict[str, int] = {}
            self.tag = 0
            self.flush_scheduled = False
            self.connections = 0
            self.redirects = 0
            self.last_sweep = 0.0
            if args.mute_attach:
                # proton's endpoint handler answers every attach (link.open()) once
                # on_link_opening returns: silenced here, the peer answers none.
                for handler in self.handlers:  # type: ignore[union-attr]
                    if isinstance(handler, EndpointStateHandler):
                        handler.on_link_remote_open = lambda event: None  # type: ignore[method-assign]

        def on_start(self, event: Any) -> None:
            acceptor = event.container.acceptor(args.host, args.port)
            if args.tls_cert:
                domain = SSLDomain(SSLDomain.MODE_SERVER)
                domain.set_credentials(args.tls_cert, args.tls_key, None)
                acceptor.set_ssl_domain(domain)
            port = acceptor._selectable._delegate.getsockname()[1]
            args.port = port  # what --redirect self names
            print(f"READY {port}", flush=True)
            event.container.schedule(_POLL_S, self)

        def on_connection_init(self, event: Any) -> None:
            if args.advertise:
                event.connection.properties = {symbol("failover-server-list"): candidates()}

        def on_connection_opened(self, event: Any) -> None:
            if args.redirect:
                return
            if args.refuse:
                self._refuse(event.connection)
                return
            self.connections += 1
            print(f"CONNECTED {self.connections}", flush=True)

        def on_connection_opening(self, event: Any) -> None:
            event.connection.open()
            if args.refuse:
                self._refuse(event.connection)
            elif args.redirect:
                # On the next turn, as for links: a close queued in this one is not sent.
                event.container.schedule(0, _Close(event.connection, redirect_info(args.redirect)))
                self.redirects += 1
                print(f"REDIRECTED {self.redirects}", flush=True)

        @staticmethod
        def _refuse(conn: Any) -> None:
            # NOTE: Qpid Broker-J refuses messaging connections while the group has no
            # quorum; the close follows the open, as brokers report open failures.
            conn.condition = Condition(
                "amqp:connection:forced", "Virtual host '127.0.0.1' is not active"
            )
            conn.close()

        def on_link_opening(self, event: Any) -> None:
            link = event.link
            if args.refuse or args.redirect or args.mute_attach:
                return  # never attach anything on a refused connection (or when muted)
            if args.link_redirect and not link.is_sender:
                link.open()
                event.container.schedule(0, _Close(link, redirect_info(args.link_redirect)))
                return
            if not link.is_sender and (
                args.stale or str(link.remote_target.address).startswith("missing/")
            ):
                # Refusing an attach: answer it with no target, then (on the next turn:
                # proton drops a detach queued in the same turn) detach with the error.
                link.open()
                event.container.schedule(0, _Close(link))
                if args.stale:
                    event.container.schedule(0.3, _Close(link.connection))
                return
            if link.is_sender:
                address = link.remote_source.address
                link.source.address = address
                self.receivers[link] = address
            else:
                link.target.address = link.remote_target.address
                link.flow(args.credit)

        def on_link_closing(self, event: Any) -> None:
            self._forget(event.link)

        def on_disconnected(self, event: Any) -> None:
            self._drop_connection(event.connection)

        def on_connection_closing(self, event: Any) -> None:
            # A clean client close never reaches on_disconnected (we close locally too).
            self._drop_connection(event.connection)

        def on_transport_closed(self, event: Any) -> None:
            if event.connection is not None:
                self._drop_connection(event.connection)

        def _drop_connection(self, conn: Any) -> None:
            for link in list(self.receivers):
                if link.connection == conn:
                    self._forget(link)

        def _forget(self, link: Any) -> None:
            self.receivers.pop(link, None)
            # Deliveries a closed link left unsettled go back to the queue for others.
            prefix = self._link_prefix(link)
            gone = [tag for tag in self.outgoing if tag.startswith(prefix)]
            seqs = [self.outgoing.pop(tag) for tag in gone]
            if seqs:
                db.executemany("UPDATE messages SET owner=NULL WHERE seq=?", [(s,) for s in seqs])

        @staticmethod
        def _link_prefix(link: Any) -> str:
            return f"{link.connection.remote_container}/{link.name}:"

        def on_message(self, event: Any) -> None:
            dlv = event.delivery
            address = event.link.target.address or event.message.address or ""
            if address.startswith("reject/"):
                dlv.local.condition = Condition(
                    "amqp:precondition-failed", "this address rejects everything"
                )
                dlv.update(Delivery.REJECTED)
                dlv.settle()
            elif address.startswith("release/"):
                dlv.update(Delivery.RELEASED)
                dlv.settle()
            elif address.startswith("modify/"):
                dlv.local.failed = True
                dlv.update(Delivery.MODIFIED)
                dlv.settle()
            elif address.startswith("silent/"):
                pass
            elif address.startswith("sink/"):
                dlv.update(Delivery.ACCEPTED)
                dlv.settle()
            else:
                self.pending.append((dlv, address, event.message.encode()))
                if not self.flush_scheduled:
                    self.flush_scheduled = True
                    event.container.schedule(0.002, _Flush(self))
            event.link.flow(1)

        def flush(self) -> None:
            # Group commit: the store holds every message before any of them is accepted.
            self.flush_scheduled = False
            batch, self.pending = self.pending, []
            if not batch:
                return
            db.execute("BEGIN IMMEDIATE")
            db.executemany(
                "INSERT INTO messages(address, data) VALUES (?, ?)",
                [(address, data) for _, address, data in batch],
            )
            db.execute("COMMIT")
            for dlv, _, _ in batch:
                dlv.update(Delivery.ACCEPTED)
                dlv.settle()
            self.deliver()

        def on_timer_task(self, event: Any) -> None:
            now = time.monotonic()
            if now - self.last_sweep > 0.5:
                self.last_sweep = now
                self.sweep()
            self.deliver()
            event.container.schedule(_POLL_S, self)

        def sweep(self) -> None:
            owners = [row[0] for row in db.execute("SELECT DISTINCT owner FROM messages")]
            for owner in owners:
                if owner is not None and owner != pid and not pid_alive(owner):
                    db.execute("UPDATE messages SET owner=NULL WHERE owner=?", (owner,))

        def deliver(self) -> None:
            for link, address in list(self.receivers.items()):
                credit = link.credit
                if credit <= 0 or link.state != link.LOCAL_ACTIVE | link.REMOTE_ACTIVE:
                    continue
                db.execute("BEGIN IMMEDIATE")
                rows = db.execute(
                    "UPDATE messages SET owner=?, deliveries=deliveries+1 WHERE seq IN ("
                    " SELECT seq FROM messages WHERE address=? AND owner IS NULL"
                    " ORDER BY seq LIMIT ?) RETURNING seq, data, deliveries",
                    (pid, address, credit),
                ).fetchall()
                db.execute("COMMIT")
                for seq, data, deliveries in sorted(rows):
                    msg = Message()
                    msg.decode(data)
                    msg.delivery_count = deliveries - 1
                    self.tag += 1
                    tag = self._link_prefix(link) + str(self.tag)
                    self.outgoing[tag] = seq
                    link.send(msg, tag=tag)

        def on_delivery(self, event: Any) -> None:
            dlv = event.delivery
            if dlv.link.is_sender and dlv.updated:
                seq = self.outgoing.pop(dlv.tag, None)
                if seq is not None:
                    if dlv.remote_state in (Delivery.ACCEPTED, Delivery.REJECTED):
                        db.execute("DELETE FROM messages WHERE seq=?", (seq,))
                    else:
                        db.execute("UPDATE messages SET owner=NULL WHERE seq=?", (seq,))
                dlv.settle()

    def redirect_info(where: str) -> dict[Any, Any]:
        host, _, port = where.rpartition(":")
        if where == "self":
            host, port = args.host, str(args.port)
        return {symbol("network-host"): host, symbol("port"): int(port), symbol("hostname"): host}

    class _Close:
        """Closes a refused link (not-found, or redirected when ``redirect`` is given) or
        a stale master's connection (forced)."""

        def __init__(self, endpoint: Any, redirect: dict[Any, Any] | None = None) -> None:
            self.endpoint = endpoint
            self.redirect = redirect

        def on_timer_task(self, event: Any) -> None:
            is_connection = isinstance(self.endpoint, Connection)
            if self.redirect is not None:
                kind = "connection" if is_connection else "link"
                condition = Condition(f"amqp:{kind}:redirect", "served elsewhere", self.redirect)
            elif is_connection:
                condition = Condition("amqp:connection:forced", "no longer the master")
            else:
                condition = Condition("amqp:not-found", "no such address")
            self.endpoint.condition = condition
            self.endpoint.close()

    class _Flush:
        def __init__(self, peer: Peer) -> None:
            self.peer = peer

        def on_timer_task(self, event: Any) -> None:
            self.peer.flush()

    # Rows this pid owned in an earlier life (pid reuse) are free again.
    db.execute("UPDATE messages SET owner=NULL WHERE owner=?", (pid,))
    Container(Peer()).run()


@dataclass
class PeerProcess:
    """A test peer in its own process: start, read its port, count connections, kill.

    ``kill()`` is SIGKILL: the process ends without closing anything, as a crashed
    broker does. Always ``stop()`` (also on failure); it is idempotent.
    """

    store: Path
    advertise: Sequence[str] = ()
    tls_cert: Path | None = None
    tls_key: Path | None = None
    port: int = 0
    credit: int = 1000
    refuse: bool = False
    stale: bool = False
    mute_attach: bool = False
    redirect: str | None = None
    link_redirect: str | None = None
    redirects: int = 0
    proc: subprocess.Popen[str] | None = field(default=None, repr=False)
    connections: int = 0
    _reader: threading.Thread | None = field(default=None, repr=False)
    _ready: threading.Event = field(default_factory=threading.Event, repr=False)

    def start(self, timeout: float = 20.0) -> PeerProcess:
        """Start the process and wait until it listens; raises RuntimeError otherwise."""
        cmd = [
            sys.executable,
            # Run as a script, by path: the peer needs proton, not this test package.
            str(Path(__file__).resolve()),
            "--store",
            str(self.store),
            "--port",
            str(self.port),
            "--credit",
            str(self.credit),
        ]
        for item in self.advertise:
            cmd += ["--advertise", item]
        if self.refuse:
            cmd.append("--refuse")
        if self.stale:
            cmd.append("--stale")
        if self.mute_attach:
            cmd.append("--mute-attach")
        if self.redirect:
            cmd += ["--redirect", self.redirect]
        if self.link_redirect:
            cmd += ["--link-redirect", self.link_redirect]
        if self.tls_cert is not None and self.tls_key is not None:
            cmd += ["--tls-cert", str(self.tls_cert), "--tls-key", str(self.tls_key)]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._ready.wait(timeout):
            self.stop()
            raise RuntimeError(f"AMQP 1.0 test peer did not start within {timeout}s")
        return self

    def _read(self) -> None:
        proc = self.proc
        if proc is None or proc.stdout is None:
            return
        for line in proc.stdout:
            if line.startswith("READY "):
                self.port = int(line.split()[1])
                self._ready.set()
            elif line.startswith("CONNECTED "):
                self.connections = int(line.split()[1])
            elif line.startswith("REDIRECTED "):
                self.redirects = int(line.split()[1])
            else:
                sys.stderr.write(f"[amqp10 peer {self.port}] {line}")

    @property
    def alive(self) -> bool:
        """True while the process runs."""
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the process and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        """End the process (SIGTERM, then SIGKILL) and reap it. Idempotent."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.proc.stdout is not None:
            with contextlib.suppress(OSError):
                self.proc.stdout.close()


def stored_count(store: Path, address: str | None = None) -> int:
    """Messages waiting in ``store`` (for ``address`` when given)."""
    db = sqlite3.connect(store, timeout=30.0)
    try:
        if address is None:
            row = db.execute("SELECT count(*) FROM messages").fetchone()
        else:
            row = db.execute("SELECT count(*) FROM messages WHERE address=?", (address,)).fetchone()
        return int(row[0])
    finally:
        db.close()


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry point of the test peer."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--store", required=True, help="SQLite file shared by a peer group")
    parser.add_argument("--advertise", action="append", default=[], help="scheme://host:port")
    parser.add_argument("--tls-cert")
    parser.add_argument("--tls-key")
    parser.add_argument("--credit", type=int, default=1000, help="credit given to senders")
    parser.add_argument("--refuse", action="store_true", help="refuse every connection")
    parser.add_argument("--stale", action="store_true", help="act as a stale master")
    parser.add_argument("--mute-attach", action="store_true", help="never answer an attach")
    parser.add_argument("--redirect", help="HOST:PORT (or self) every connection goes to")
    parser.add_argument("--link-redirect", help="HOST:PORT every sender link goes to")
    args = parser.parse_args(argv)
    _run_peer(args)


if __name__ == "__main__":
    main()
