"""Broker-J seed story: the master of a BDB HA group cut off from the two other nodes by a
network-namespace partition, under steady counted traffic (lost 0, duplicates only of
known ids, no ``send()`` past ``send_timeout``).

Three Broker-J 9.2 nodes, one per network namespace (:class:`tests.support.qpid_lab.
NetQpid`); the client names every node's proxy and reaches even the isolated node. The
cut master cannot commit without a quorum; the two others elect a new master among
themselves; after the heal the old master rejoins as a replica.

NOTE: the group runs with Berkeley DB JE's replica and feeder timeouts at 5 s (default
30 s), so that the majority notices the lost master and elects within the cut; the same
timeouts are what a group's operator tunes for faster fail-over.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest

import msgsafe
from msgsafe.cluster.qpid import MASTER, REPLICA
from tests.chaos._matrix import AMQP10_OPTIONS, RETRY, Fault, consume_with, run_cell

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.slow]

SEND_TIMEOUT = 5.0
_TIMEOUTS = {"je.rep.replicaTimeout": "5 s", "je.rep.feederTimeout": "5 s"}


def test_master_cut_off_by_a_partition_loses_nothing(tmp_path: Path) -> None:
    """The master cut off for 25 s while 4 threads send: sends to the isolated master end
    STORED (or confirmed by the new master), the majority elects a new master during the
    cut, and after the heal the group is whole with the old master a replica."""
    from tests.support.netns import NetLab, netns_or_fail
    from tests.support.qpid_lab import NetQpid

    netns_or_fail("the partition story")
    seen: dict[str, object] = {}
    with NetLab(3) as lab:
        group = NetQpid(lab, tmp_path / "qpid", context=_TIMEOUTS)
        try:
            try:
                group.start()
            except Exception as exc:
                pytest.fail(
                    f"cannot start Broker-J in network namespaces: {exc} (the jars come "
                    "from Maven Central: python -m msgsafe.cluster.cli fetch qpid)"
                )
            master = group.wait_master()
            others = [n for n in range(group.count) if n != master]

            stop = threading.Event()

            def watch_election() -> None:
                # When the majority side has a master of its own, seconds after the cut.
                while not stop.wait(0.2):
                    if any(group.role(n) == MASTER for n in others):
                        seen["elected_s"] = time.monotonic() - float(seen["cut"])  # type: ignore[arg-type]
                        return

            def inject() -> None:
                lab.cut(master)
                seen["cut"] = time.monotonic()
                threading.Thread(target=watch_election, daemon=True).start()

            def heal() -> None:
                # The majority side's view before the heal: a new master among them.
                try:
                    seen["during"] = {n: group.role(n) for n in others}
                    seen["isolated"] = group.role(master)
                finally:
                    stop.set()
                    lab.heal(master)

            def whole() -> bool:
                roles = group.roles()
                return group.master() is not None and all(r in (MASTER, REPLICA) for r in roles)

            fault = Fault(
                "seed: Broker-J master cut off (partition) 25 s",
                inject,
                heal,
                25.0,
                recovered=whole,
            )
            address = f"partition.{uuid.uuid4().hex[:8]}"
            with msgsafe.Producer(
                group.url,
                outbox=tmp_path / "outbox.db",
                send_timeout=SEND_TIMEOUT,
                retry=RETRY,
                **AMQP10_OPTIONS,  # type: ignore[arg-type]
            ) as producer:
                run_cell(
                    "amqp10",
                    fault,
                    producer,
                    address,
                    consume_with(group.url, address),
                    send_timeout=SEND_TIMEOUT,
                    recover_timeout=180.0,
                )
            print(
                f"[qpid partition] master {master} cut off; new master after "
                f"{seen.get('elected_s', float('nan')):.1f}s; during the cut: majority "
                f"{seen['during']}, isolated node says {seen['isolated']}; after the heal "
                f"{group.roles()}"
            )
            during = seen["during"]
            assert isinstance(during, dict)
            assert MASTER in during.values(), f"no master elected during the partition: {seen}"
        finally:
            group.stop()
