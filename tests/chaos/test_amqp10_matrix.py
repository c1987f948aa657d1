"""The fault matrix for AMQP 1.0: a producer sending through fault proxies to the
session's ActiveMQ Artemis live/backup pair (replication, durable anycast queues created
on first use) while one fault is injected, held and healed; then drain, consume, and
check the ledger (lost = 0, duplicates only of known ids).

The client's URL names both nodes' proxies; the live's open frame also advertises the
backup's own address (``failover-server-list``), which the client adds as a candidate.
That candidate bypasses the proxies, which is harmless: while the live runs the backup
does not listen (connection refused), so every fault of the proxies still bites.
Process faults hit the live (node 0); healing restarts it, which is a fail-back under
traffic when the backup took over.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import msgsafe
from msgsafe.cluster.artemis import ArtemisCluster
from msgsafe.testing.faultproxy import FaultProxies
from tests.chaos._matrix import (
    AMQP10_OPTIONS,
    RETRY,
    Fault,
    consume_with,
    disk_full_fault,
    proxy_faults,
    run_cell,
    stored_during_fault,
)
from tests.fixtures.amqp10 import heal_pair

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

SEND_TIMEOUT = 5.0


@pytest.fixture
def artemis_proxies(artemis_pair: ArtemisCluster) -> Iterator[FaultProxies]:
    """A fault proxy per node of the session's pair; closed (and the pair made whole by
    ``artemis_pair``) after the test."""
    proxies = FaultProxies(
        [("127.0.0.1", port) for port in artemis_pair.ports], connect_timeout=2.0
    )
    try:
        yield proxies
    finally:
        proxies.close()


def _cell(
    pair: ArtemisCluster,
    proxies: FaultProxies,
    fault: Fault,
    outbox: Path,
    require: str = "durable",
    **kw: object,
) -> None:
    address = f"chaos10.{uuid.uuid4().hex[:8]}"
    url = f"amqp10://{pair.user}:{pair.password}@{proxies.hosts}"
    with msgsafe.Producer(
        url,
        outbox=outbox,
        send_timeout=SEND_TIMEOUT,
        retry=RETRY,
        require=require,
        **AMQP10_OPTIONS,
    ) as producer:
        run_cell(
            "amqp10",
            fault,
            producer,
            address,
            consume_with(pair.url, address),
            send_timeout=SEND_TIMEOUT,
            **kw,  # type: ignore[arg-type]
        )


@pytest.mark.parametrize("name", ["black-hole", "reset", "latency 2 s", "bandwidth 10 KB/s"])
def test_proxy_fault(
    name: str,
    chaos_rep: int,
    artemis_pair: ArtemisCluster,
    artemis_proxies: FaultProxies,
    tmp_path: Path,
) -> None:
    fault = proxy_faults(list(artemis_proxies))[name]
    _cell(artemis_pair, artemis_proxies, fault, tmp_path / "outbox.db")


def test_kill9(
    chaos_rep: int, artemis_pair: ArtemisCluster, artemis_proxies: FaultProxies, tmp_path: Path
) -> None:
    # The backup takes over within about a second; the heal restarts the primary, which
    # takes over again (fail-back) while the traffic still flows.
    fault = Fault("kill -9", lambda: artemis_pair.kill(0), lambda: heal_pair(artemis_pair), 5.0)
    _cell(artemis_pair, artemis_proxies, fault, tmp_path / "outbox.db")


def test_sigstop(
    chaos_rep: int, artemis_pair: ArtemisCluster, artemis_proxies: FaultProxies, tmp_path: Path
) -> None:
    # NOTE: 12 s stays below the pair's 30 s failure check: the backup is not promoted
    # (a pair has no third voter; paused longer, both would end up active). The client's
    # heartbeat notices the silent live and stores until it answers again.
    fault = Fault("SIGSTOP", lambda: artemis_pair.pause(0), lambda: heal_pair(artemis_pair), 12.0)
    _cell(artemis_pair, artemis_proxies, fault, tmp_path / "outbox.db")


def _kill_both(pair: ArtemisCluster) -> None:
    # The backup first: killed the other way round, it would take over for a moment and
    # hold what only it accepted when the primary comes back with its own journal.
    pair.kill(1)
    pair.kill(0)


def test_all_brokers_down(
    chaos_rep: int, artemis_pair: ArtemisCluster, artemis_proxies: FaultProxies, tmp_path: Path
) -> None:
    fault = Fault(
        "all brokers down",
        lambda: _kill_both(artemis_pair),
        lambda: heal_pair(artemis_pair),
        6.0,
        expect=stored_during_fault,
    )
    _cell(artemis_pair, artemis_proxies, fault, tmp_path / "outbox.db")


def test_outbox_disk_full(
    chaos_rep: int,
    artemis_pair: ArtemisCluster,
    artemis_proxies: FaultProxies,
    small_disk: Path,
) -> None:
    # Every host refusing, sends are stored at once (fail fast), so the disk fills with
    # the same small bodies as in the other protocols' cells.
    fault = disk_full_fault(list(artemis_proxies), small_disk, leave=150_000)
    # The outbox is on a small tmpfs (a real full disk): memory, which the default
    # require= refuses; accepted here on purpose.
    _cell(artemis_pair, artemis_proxies, fault, small_disk / "outbox.db", "any", body_size=512)
