"""NetLab: hosts in their own network namespaces, cut off and healed for real.

Needs root and Debian ``iproute2``; fails (never skips) with how to get them.
Why an echo peer and no broker: the lab's namespaces and cuts are what is under test.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import netns
from tests.support.netns import CLIENT, NetLab, NetLabError, cleanup_stale
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

PEER = str(Path(__file__).with_name("echo_peer.py"))
PORT = 7000  # every namespace has its own port space: a fixed port cannot clash


class EchoWatch:
    """Counts the ``echo <n>`` lines an echo_peer client prints."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.count = 0
        self.eof = False
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(b"echo "):
                self.count += 1
            elif line.startswith(b"eof"):
                self.eof = True


@pytest.fixture
def lab2() -> Iterator[NetLab]:
    with NetLab(2) as lab:
        yield lab


def start_server(lab: NetLab, i: int) -> subprocess.Popen[bytes]:
    server = lab.run(i, [sys.executable, PEER, "server", str(PORT)], stdout=subprocess.PIPE)
    assert server.stdout is not None
    assert server.stdout.readline() == b"listening\n"
    return server


def probe(lab: NetLab, src: int, dst: int) -> bool:
    proc = lab.run(src, [sys.executable, PEER, "probe", lab.addr(dst), str(PORT)])
    return proc.wait(10) == 0


def test_cut_stops_traffic_and_heal_resumes_the_same_connection(lab2: NetLab) -> None:
    start_server(lab2, 0)
    client = lab2.run(
        1, [sys.executable, PEER, "client", lab2.addr(0), str(PORT)], stdout=subprocess.PIPE
    )
    watch = EchoWatch(client)
    wait_until(lambda: watch.count >= 20, 10, "20 echoes before the cut")

    lab2.cut(0)
    at_cut = watch.count
    # Observing silence needs a window: 1.5 s at ~50 round trips/s would be ~75 echoes.
    window_end = time.monotonic() + 1.5
    while time.monotonic() < window_end:
        assert watch.count <= at_cut + 1, "traffic still flows across a cut link"
        time.sleep(0.05)
    stalled = watch.count
    # The client can still reach the cut-off host; hosts cannot reach each other.
    with lab2.connect(0, PORT, timeout=2) as sock:
        sock.sendall(b"hi")
        assert sock.recv(2) == b"hi"
    assert not probe(lab2, 1, 0)

    lab2.heal(0)
    recovery = wait_until(lambda: watch.count >= stalled + 20, 15, "echoes after heal")
    assert not watch.eof, "the connection should survive a healed partition"
    print(
        f"echoes before cut {at_cut}, during cut {stalled - at_cut}, "
        f"resumed 20 more {recovery:.2f}s after heal (TCP retransmission backoff)"
    )


def test_cut_link_cuts_only_that_pair() -> None:
    with NetLab(3) as lab:
        for i in range(3):
            start_server(lab, i)
        assert probe(lab, 0, 1) and probe(lab, 1, 2) and probe(lab, 0, 2)
        lab.cut_link(0, 1)
        assert lab.is_cut(1, 0)
        assert not probe(lab, 0, 1)
        assert not probe(lab, 1, 0)
        assert probe(lab, 0, 2) and probe(lab, 2, 1)
        assert probe(lab, CLIENT, 0) and probe(lab, CLIENT, 1)

        lab.cut_link(CLIENT, 2)  # the client can be cut off too
        assert not probe(lab, CLIENT, 2)
        assert probe(lab, 0, 2)

        lab.heal_all()
        assert probe(lab, 0, 1) and probe(lab, 1, 0) and probe(lab, CLIENT, 2)


def test_proxy_reaches_hosts_from_this_namespace(lab2: NetLab) -> None:
    start_server(lab2, 0)
    import socket

    with lab2.proxy(0, PORT) as door:
        assert door.address[0] == "127.0.0.1"
        with socket.create_connection(door.address, timeout=5) as sock:
            sock.sendall(b"through")
            assert sock.recv(7) == b"through"
            lab2.cut(0)  # host-to-host only: the client's path stays up
            sock.sendall(b"still")
            assert sock.recv(5) == b"still"
            door.blackhole()  # and the proxy's own faults stack on top
            sock.settimeout(0.3)
            sock.sendall(b"gone")
            with pytest.raises(TimeoutError):
                sock.recv(4)
    # Nothing from the lab leaks into this namespace.
    routes = subprocess.run(["ip", "route"], capture_output=True, text=True).stdout
    assert "10.213." not in routes


def test_close_removes_namespaces_and_processes() -> None:
    lab = NetLab(2)
    with lab:
        server = start_server(lab, 0)
        names = [lab.hub, *(lab.netns(i) for i in lab.nodes)]
        # A daemon that leaves its session (as epmd does) is still found and killed.
        lab.run(1, ["setsid", "-f", "sleep", "300"])
        wait_until(lambda: len(netns._netns_pids(lab.netns(1))) >= 1, 5, "sleep in ns 1")
    assert server.poll() is not None
    existing = netns._list_netns()
    assert not [n for n in names if n in existing]
    assert not (Path("/run/msgsafe-netlab") / lab.token).exists()


def test_cleanup_stale_removes_labs_of_crashed_runs() -> None:
    code = (
        "import sys, time\n"
        "from tests.support.netns import NetLab\n"
        "lab = NetLab(2); lab.start(); print(lab.token, flush=True); time.sleep(300)\n"
    )
    crashed = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, cwd=Path(__file__).parents[3]
    )
    try:
        assert crashed.stdout is not None
        token = crashed.stdout.readline().decode().strip()
        assert token
        mine = [n for n in netns._list_netns() if n.startswith(f"msgsafe-{token}-")]
        assert len(mine) == 4  # hub, two hosts, client

        assert not [n for n in cleanup_stale() if n in mine]  # owner alive: kept
    finally:
        crashed.send_signal(signal.SIGKILL)
        crashed.wait(10)
    removed = cleanup_stale()
    assert sorted(removed) == sorted(mine)
    assert not [n for n in netns._list_netns() if n.startswith(f"msgsafe-{token}-")]


def test_clear_errors_without_root_or_iproute2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(NetLabError, match="root"):
        NetLab(2).start()
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda tool: None)
    with pytest.raises(NetLabError, match="iproute2"):
        NetLab(2).start()


def test_requires_a_running_lab() -> None:
    lab = NetLab(1)
    with pytest.raises(NetLabError):
        lab.cut_link(0, CLIENT)
    with pytest.raises(ValueError):
        lab.addr(1)
    with pytest.raises(ValueError):
        NetLab(0)
