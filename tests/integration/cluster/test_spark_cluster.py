"""``msgsafe cluster up spark``: a standalone master and two workers from the installed
PySpark (msgsafe.cluster.spark), driven through the command as a user would.

- ``up --json`` describes two running workers and the master (``spark://`` URL);
- a worker killed and restarted registers with the master again;
- while an application runs, its executors are nodes: one SIGKILLed through the command
  is replaced by its worker, the application's task is run again and the job succeeds;
- ``down`` leaves no process behind.

One cluster for the module; the tests run in file order.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from msgsafe.cluster import load
from msgsafe.cluster._process import pid_alive
from msgsafe.cluster.spark import SparkCluster
from tests.support.commands import Run, run_python

pytestmark = pytest.mark.integration

_HINT = "needs pyspark and Java 17 (pip install pyspark; apt-get install openjdk-17-jre-headless)"

#: A driver whose one-task-per-worker job waits for a file, so executors stay up.
_DRIVER = """
import sys, time, pathlib
from pyspark.sql import SparkSession
master, gate = sys.argv[1], pathlib.Path(sys.argv[2])
spark = (SparkSession.builder.master(master).appName("msgsafe-cluster-test")
         .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
         .config("spark.executor.memory", "512m").config("spark.task.maxFailures", "4")
         .getOrCreate())
def wait(index, rows):
    deadline = time.monotonic() + 600
    while not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    yield sum(1 for _ in rows)
counts = spark.sparkContext.parallelize(range(100), 2).mapPartitionsWithIndex(wait).collect()
print("rows", sum(counts))
spark.stop()
"""


def cli(*args: str, timeout: float = 600.0) -> Run:
    return run_python(
        "-m",
        "msgsafe.cluster.cli",
        *args,
        label=f"msgsafe cluster {' '.join(args)}",
        timeout=timeout,
    )


@dataclass
class Up:
    dir: Path
    described: dict[str, Any]

    def status(self) -> dict[str, Any]:
        run = cli("status", "--dir", str(self.dir), "--json")
        assert run.code == 0, run.stderr
        result: dict[str, Any] = run.json()
        return result

    def nodes(self) -> dict[str, dict[str, Any]]:
        return {n["name"]: n for n in self.status()["nodes"]}

    def alive_workers(self) -> int:
        with urllib.request.urlopen(self.described["ui"] + "/json/", timeout=5) as answer:
            state = json.loads(answer.read())
        return sum(1 for w in state["workers"] if w["state"] == "ALIVE")


@pytest.fixture(scope="module")
def spark_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    dir = tmp_path_factory.mktemp("spark-up")
    run = cli("up", "spark", "--nodes", "2", "--dir", str(dir), "--json")
    if run.code != 0:
        pytest.fail(f"msgsafe cluster up spark failed ({_HINT}):\n{run.stderr[-3000:]}")
    up = Up(dir, run.json())
    try:
        yield up
    finally:
        cluster = load(dir)
        assert isinstance(cluster, SparkCluster)
        pids = [cluster.master_pid, *cluster.worker_pids]
        if any(pid_alive(p) for p in pids):
            cli("down", "--dir", str(dir))
        for pid in pids:  # a failed down must not leave JVMs on a shared machine
            if pid is not None and pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


def _wait(condition: Any, what: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_up_describes_two_workers_and_a_master(spark_up: Up) -> None:
    described = spark_up.described
    assert described["kind"] == "spark"
    assert described["url"].startswith("spark://127.0.0.1:")
    names = [n["name"] for n in described["nodes"]]
    assert names == ["worker-0", "worker-1", "master"]
    assert all(n["running"] and n["pid"] for n in described["nodes"])
    master = described["nodes"][2]
    assert described["url"] == f"spark://127.0.0.1:{master['port']}"
    assert spark_up.alive_workers() == 2
    assert spark_up.status() == described


def test_a_killed_worker_restarts_and_registers_again(spark_up: Up) -> None:
    assert cli("kill", "worker-1", "--dir", str(spark_up.dir)).code == 0
    assert not spark_up.nodes()["worker-1"]["running"]
    _wait(lambda: spark_up.alive_workers() == 1, "the master to drop worker 1")
    run = cli("restart", "1", "--dir", str(spark_up.dir))
    assert run.code == 0, run.stderr
    assert spark_up.nodes()["worker-1"]["running"]
    assert spark_up.alive_workers() == 2


def test_a_killed_executor_is_replaced_and_its_task_run_again(spark_up: Up, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    with open(tmp_path / "driver.log", "wb") as log:
        driver = subprocess.Popen(
            [sys.executable, "-c", _DRIVER, spark_up.described["url"], str(gate)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, PYSPARK_PYTHON=sys.executable),
            start_new_session=True,
        )
    try:

        def executors() -> dict[str, dict[str, Any]]:
            return {k: v for k, v in spark_up.nodes().items() if v["role"] == "executor"}

        _wait(lambda: {"executor-0", "executor-1"} <= set(executors()), "two executors")
        first = executors()["executor-0"]["pid"]
        run = cli("kill", "executor-0", "--dir", str(spark_up.dir))
        assert run.code == 0, run.stderr
        assert not pid_alive(first)
        _wait(
            lambda: executors().get("executor-0", {}).get("pid") not in (None, first),
            "worker 0 to start a new executor",
        )
        gate.touch()
        assert driver.wait(600) == 0, (tmp_path / "driver.log").read_text()[-3000:]
        assert "rows 100" in (tmp_path / "driver.log").read_text()
    finally:
        gate.touch()
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(30)


def test_down_leaves_no_process(spark_up: Up) -> None:
    before = [n["pid"] for n in spark_up.status()["nodes"] if n["pid"]]
    run = cli("down", "--dir", str(spark_up.dir))
    assert run.code == 0, run.stderr
    assert not any(pid_alive(pid) for pid in before)
