"""A RabbitMQ node launched by ``msgsafe cluster`` whose VM exits before its pid file
(saying nothing anywhere, seen in CI at a cluster's start and at a node's restart) is
launched once more; one still booting is waited for, not launched twice. The VM's
silent exit cannot be caused on demand: the launcher's steps are stand-ins here."""

from __future__ import annotations

from pathlib import Path

import pytest

from msgsafe.cluster.base import ClusterError
from msgsafe.cluster.rabbitmq import RabbitCluster


class ScriptedCluster(RabbitCluster):
    """wait_ready fails ``failures`` times; the node runs or not as told."""

    def __init__(self, tmp: Path, *, failures: int, running: bool) -> None:
        super().__init__(size=1, dir=tmp)
        self.failures = failures
        self.running = running
        self.launches = 0
        self.waits: list[float] = []

    def wait_ready(self, node: int, timeout: float = 60.0) -> None:
        self.waits.append(timeout)
        if self.failures:
            self.failures -= 1
            raise ClusterError("not ready")

    def is_running(self, node: int) -> bool:
        return self.running

    def _launch(self, node: int) -> None:
        self.launches += 1


@pytest.mark.parametrize(("running", "launches"), [(False, 1), (True, 0)])
def test_a_node_that_did_not_start_is_launched_once_more(
    tmp_path: Path, running: bool, launches: int
) -> None:
    cluster = ScriptedCluster(tmp_path, failures=1, running=running)
    cluster._ready_or_relaunched(90.0, 0)
    assert cluster.launches == launches
    # A minute or half of the whole for the first wait; what is left for the second.
    assert cluster.waits[0] == 45.0 and 80.0 < cluster.waits[1] <= 90.0


def test_a_node_that_never_starts_fails_with_the_node_named(tmp_path: Path) -> None:
    cluster = ScriptedCluster(tmp_path, failures=2, running=False)
    with pytest.raises(ClusterError):
        cluster._ready_or_relaunched(90.0, 0)
    assert cluster.launches == 1
