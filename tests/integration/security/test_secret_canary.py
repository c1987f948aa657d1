"""Secret canary sweep: a unique password (a RabbitMQ user's, right and wrong) and a
unique SASL/SCRAM secret (Kafka) are planted in URLs, keyword options, pika credentials
and a librdkafka config; the producer, consumer, forwarder, the ``msgsafe`` command
(``send``, ``consume``, ``demo``, ``verify``, ``doctor``, ``outbox``, ``cluster``, with
and without ``--json``, at DEBUG logging), both compat wrappers and the Spark sink (a
real batch, and one whose tasks fail on the wrong login; and a Spark application of its
own whose driver log, executor output and event log are read whole) run
through a connection failure, a fail-over and an outbox detour. Every byte they produce —
log records with tracebacks, reprs, ``str()``/``repr()``/pickles of every exception,
process output (librdkafka and proton write there), CLI stdout/stderr, the outbox file
and its WAL — is searched for either secret: 0 occurrences.
"""

from __future__ import annotations

import logging
import os
import pickle
import secrets
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import msgsafe
from msgsafe import Status
from msgsafe.cluster._process import free_ports
from msgsafe.cluster.kafka import KafkaCluster
from msgsafe.cluster.rabbitmq import RabbitCluster
from msgsafe.endpoints import parse_url
from tests.integration.security._users import SCRAM_USER
from tests.support.commands import run_python

pytestmark = pytest.mark.integration

#: The planted password; the wrong one contains it, so one search finds both.
CANARY = f"canary{secrets.token_hex(8)}"
USER = f"canary-user-{secrets.token_hex(3)}"


class Sweep:
    """Everything produced, as text or bytes, and where it came from."""

    def __init__(self) -> None:
        self.parts: list[tuple[str, bytes]] = []
        self.formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")

    def add(self, where: str, data: object) -> None:
        raw = data if isinstance(data, bytes) else str(data).encode("utf-8", "replace")
        self.parts.append((where, raw))

    def error(self, where: str, exc: BaseException) -> None:
        self.add(f"{where}: str", str(exc))
        self.add(f"{where}: repr", repr(exc))
        self.add(f"{where}: traceback", "".join(traceback.format_exception(exc)))
        try:
            self.add(f"{where}: pickle", pickle.dumps(exc))
        except Exception as failure:  # an unpicklable error is a finding too
            self.add(f"{where}: pickle failed", repr(failure))

    def attempt(self, where: str, action: Callable[[], object]) -> object:
        try:
            result = action()
        except Exception as exc:  # every error's text is swept
            self.error(where, exc)
            return exc
        self.add(f"{where}: result", repr(result))
        return result

    def files(self, where: str, directory: Path) -> None:
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                self.add(f"{where}: {path.name}", path.read_bytes())

    def found(self, secret: str) -> list[str]:
        needle = secret.encode()
        return [where for where, raw in self.parts if needle in raw]

    @property
    def size(self) -> int:
        return sum(len(raw) for _, raw in self.parts)


class _Collect(logging.Handler):
    def __init__(self, sweep: Sweep) -> None:
        super().__init__(logging.DEBUG)
        self.sweep = sweep

    def emit(self, record: logging.LogRecord) -> None:
        self.sweep.add(f"log {record.name}", self.sweep.formatter.format(record))


@pytest.fixture
def sweep() -> Iterator[Sweep]:
    collected = Sweep()
    handler = _Collect(collected)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield collected
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


_CLI_AT_DEBUG = (
    "import logging, sys; logging.basicConfig(level=logging.DEBUG); "
    "from msgsafe.cli import main; main(sys.argv[1:])"
)


def _cli(sweep: Sweep, *args: str, stdin: str = "", timeout: float = 90.0) -> int:
    """The ``msgsafe`` command in a child process whose logging is at DEBUG."""
    # The label is printed, and this process's output is swept too: no URL in it.
    name = " ".join(a for a in args[:3] if "://" not in a)
    run = run_python(
        "-c", _CLI_AT_DEBUG, *args, label=f"msgsafe {name} (at DEBUG)", stdin=stdin, timeout=timeout
    )
    sweep.add(f"cli {name} stdout", run.stdout)
    sweep.add(f"cli {name} stderr", run.stderr)
    return run.code


@pytest.fixture(scope="module")
def canary_user(rabbit_cluster: RabbitCluster) -> Iterator[str]:
    rabbit_cluster.ctl(0, "add_user", USER, CANARY)
    rabbit_cluster.ctl(0, "set_permissions", "-p", "/", USER, ".*", ".*", ".*")
    try:
        yield USER
    finally:
        rabbit_cluster.ctl(0, "delete_user", USER)


def _send_once(url: str, destination: str) -> object:
    with msgsafe.Producer(url, outbox=False) as producer:
        return producer.send(destination, b"x")


def _python_side(sweep: Sweep, rabbit: RabbitCluster, kafka: KafkaCluster, tmp: Path) -> str:
    dead = free_ports(1)[0]
    good_port, other_port = rabbit.port(0), rabbit.port(1)
    queue = f"canary-{secrets.token_hex(3)}"
    creds, wrong = f"{USER}:{CANARY}", f"{USER}:{CANARY}-wrong"
    # Fail-over: the first host refuses connections, the next serves.
    url = f"amqp://{creds}@127.0.0.1:{dead},127.0.0.1:{good_port}/"
    sweep.add("parse_url", repr(parse_url(url)) + str(parse_url(url)))
    with msgsafe.Producer(url, outbox=tmp / "outbox.db", declare="quorum") as producer:
        sweep.add("producer repr", repr(producer))
        for i in range(20):
            receipt = producer.send(queue, f"m{i}".encode())
            assert receipt.status is Status.CONFIRMED
            sweep.add("receipt", repr(receipt))
    # Outbox detour: no broker reachable, the messages are stored.
    detour = msgsafe.Producer(f"amqp://{creds}@127.0.0.1:{dead}/", outbox=tmp / "detour.db")
    for i in range(10):
        assert detour.send(queue, f"d{i}".encode()).status is Status.STORED
    sweep.files("outbox while open", tmp)  # the WAL still holds the rows
    sweep.add("detour repr", repr(detour))
    detour.close(timeout=1)
    for scheme, path in (("amqp", "/"), ("amqp10", "")):
        bad = f"{scheme}://{wrong}@127.0.0.1:{other_port}{path}"
        sweep.attempt(
            f"{scheme} wrong password",
            lambda bad=bad: _send_once(bad, queue),
        )
    amqp10 = f"amqp10://{creds}@127.0.0.1:{good_port}"
    with msgsafe.Producer(amqp10, outbox=False) as producer:
        sweep.add("amqp10 send", repr(producer.send(f"/amq/queue/{queue}", b"a10")))
    for name, options in (
        ("unknown option", {"password": CANARY}),
        ("bad value", {"confirm_timeout": CANARY}),
    ):
        sweep.attempt(name, lambda o=options: msgsafe.Producer(url, outbox=False, **o))
    with msgsafe.Consumer(url) as consumer:
        consumer.subscribe(queue)
        sweep.add("consumer repr", repr(consumer))
        for delivery in consumer.poll(max_messages=5, timeout=2.0):
            sweep.add("delivery repr", repr(delivery))
            delivery.nack(requeue=True)
    _compat(sweep, f"amqp://{creds}@127.0.0.1:{good_port}/%2F", kafka, queue)
    return queue


def _compat(sweep: Sweep, url: str, kafka: KafkaCluster, queue: str) -> None:
    import pika as real_pika

    from msgsafe.compat import confluent_kafka as ck
    from msgsafe.compat import pika
    from msgsafe.spark import foreach_batch_sink

    params = real_pika.URLParameters(url)
    sweep.add("pika params", repr(params))
    with pika.BlockingConnection([params]) as connection:
        sweep.add("pika connection", repr(connection))
        connection.channel().basic_publish("", queue, b"compat")
    bad = real_pika.ConnectionParameters(
        port=params.port, credentials=real_pika.PlainCredentials(USER, f"{CANARY}-wrong")
    )

    def publish_with_wrong_password() -> None:
        with pika.BlockingConnection(bad, outbox=False) as connection:
            connection.channel().basic_publish("", queue, b"compat")

    sweep.attempt("pika wrong password", publish_with_wrong_password)
    scram = SCRAM_USER.password
    reports: list[Any] = []
    for password in (scram, f"{scram}-wrong"):
        config = {
            "bootstrap.servers": ",".join(f"127.0.0.1:{p}" for p in kafka.sasl_ports),
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": SCRAM_USER.name,
            "sasl.password": password,
        }
        producer = sweep.attempt("kafka compat", lambda c=config: ck.Producer(c, outbox=False))
        if isinstance(producer, ck.Producer):
            sweep.add("kafka compat repr", repr(producer))
            sweep.attempt(
                "kafka compat produce",
                lambda p=producer: p.produce(
                    queue, b"k", on_delivery=lambda e, m: reports.append((e, m))
                ),
            )
            sweep.attempt("kafka compat flush", lambda p=producer: p.flush(10))
            sweep.attempt("kafka compat close", producer.close)
    sweep.add("kafka compat reports", repr(reports) + " ".join(str(e) for e, _ in reports))
    kafka_url = kafka.sasl_url(SCRAM_USER.name, SCRAM_USER.password)
    wrong_login = kafka.sasl_url(SCRAM_USER.name, f"{scram}-wrong")
    sweep.attempt("kafka wrong", lambda: _send_once(wrong_login, queue))
    sink = foreach_batch_sink(kafka_url, queue)
    sweep.add("spark sink", repr(sink) + str(sink))


def test_no_secret_anywhere(
    sweep: Sweep,
    rabbit_cluster: RabbitCluster,
    canary_user: str,
    kafka_secure: KafkaCluster,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    queue = _python_side(sweep, rabbit_cluster, kafka_secure, tmp_path)
    url = f"amqp://{USER}:{CANARY}@127.0.0.1:{rabbit_cluster.port(0)}/"
    wrong = url.replace(CANARY, f"{CANARY}-wrong")
    detour = str(tmp_path / "detour.db")
    for json in ([], ["--json"]):
        _cli(sweep, "send", url, queue, "--outbox", str(tmp_path / "cli.db"), *json, stdin="a\nb\n")
        _cli(sweep, "send", wrong, queue, "--no-outbox", *json, stdin="a\n")
        _cli(sweep, "consume", url, queue, "--count", "2", "--timeout", "10", *json)
        _cli(sweep, "verify", url, f"{queue}-v", "--count", "30", "-o", "declare=quorum", *json)
        _cli(sweep, "verify", wrong, f"{queue}-v", "--count", "5", *json)
        _cli(sweep, "doctor", url, queue, *json)
        _cli(sweep, "doctor", wrong, queue, *json)
        _cli(sweep, "outbox", "status", detour, *json)
        _cli(sweep, "outbox", "list", detour, *json)
        _cli(sweep, "outbox", "drain", detour, "--url", wrong, "--timeout", "5", *json)
        _cli(sweep, "cluster", "status", "--dir", str(tmp_path / "no-cluster"), *json)
    # The forwarder: the detour's rows, delivered with the right login.
    assert _cli(sweep, "outbox", "drain", detour, "--url", url, "-o", "declare=quorum") == 0
    assert _cli(sweep, "demo", "--url", url, "--count", "60", "--json", timeout=120) == 0
    assert _cli(sweep, "demo", "--url", url, "--count", "60", timeout=120) == 0
    sweep.files("outbox files", tmp_path)
    out, err = capfd.readouterr()
    sweep.add("process stdout", out)
    sweep.add("process stderr", err)

    probe = Sweep()
    probe.add("the search itself", pickle.dumps(url))
    assert probe.found(CANARY), "the search must find a planted secret"
    found = sweep.found(CANARY) + sweep.found(SCRAM_USER.password)
    print(f"canary sweep: {len(sweep.parts)} outputs, {sweep.size} bytes, {len(found)} occurrences")
    assert found == [], found
    assert sweep.size > 100_000, "the sweep saw too little to prove anything"
    # The planted secrets really reached the brokers: the logins they are part of failed
    # (wrong) and worked (right) as they should.
    failed = {where.split(":")[0] for where, _ in sweep.parts if where.endswith(": str")}
    assert {"amqp wrong password", "amqp10 wrong password", "kafka wrong"} <= failed, failed
    assert "pika wrong password" in failed and "bad value" in failed, failed


def test_no_secret_in_the_spark_sink(
    sweep: Sweep, spark: Any, rabbit_cluster: RabbitCluster, canary_user: str
) -> None:
    """The Spark sink with the planted password, right and wrong: its reports, reprs
    and the task failure Spark raises on the driver (which quotes the executor's error)
    hold no secret."""
    from msgsafe.spark import foreach_batch_sink

    url = f"amqp://{USER}:{CANARY}@127.0.0.1:{rabbit_cluster.port(0)}/"
    queue = f"canary-spark-{secrets.token_hex(3)}"
    frame = spark.createDataFrame([(f"v{i}".encode(),) for i in range(40)], "value binary")
    sink = foreach_batch_sink(url, queue, declare="quorum")
    report = sink(frame, 1)
    assert report.confirmed == 40, report
    sweep.add("spark report", f"{report!r} {sink!r} {sink.reports!r}")
    wrong = foreach_batch_sink(url.replace(CANARY, f"{CANARY}-wrong"), queue)
    failed = sweep.attempt("spark wrong password", lambda: wrong(frame, 2))
    assert isinstance(failed, Exception), failed
    assert "AuthenticationError" in str(failed)
    found = sweep.found(CANARY)
    print(f"spark canary sweep: {sweep.size} bytes, {len(found)} occurrences")
    assert found == [], found


#: A whole Spark application in a child process, so that every byte its JVM writes (the
#: driver's log4j output at INFO, the Python workers' stderr) and its event log can be
#: swept; the session-wide SparkSession of the suite writes to a stderr no test can read.
_SPARK_APP = """
import logging, sys, traceback
logging.basicConfig(level=logging.DEBUG)
from pyspark.sql import SparkSession
url, wrong, queue, events = sys.argv[1:5]
spark = (
    SparkSession.builder.master("local[1,2]")
    .appName("msgsafe-canary")
    .config("spark.ui.enabled", "false")
    .config("spark.driver.bindAddress", "127.0.0.1")
    .config("spark.driver.host", "127.0.0.1")
    .config("spark.eventLog.enabled", "true")
    .config("spark.eventLog.dir", events)
    .getOrCreate()
)
spark.sparkContext.setLogLevel("INFO")
from msgsafe.spark import foreach_batch_sink
frame = spark.createDataFrame([(f"v{i}".encode(),) for i in range(20)], "value binary")
report = foreach_batch_sink(url, queue, declare="quorum")(frame, 1)
print("REPORT", report, report.confirmed)
try:
    foreach_batch_sink(wrong, queue)(frame, 2)
except Exception as exc:
    print("FAILED", type(exc).__name__, exc)
    traceback.print_exc()
spark.stop()
"""


def test_no_secret_in_spark_driver_logs(
    sweep: Sweep, rabbit_cluster: RabbitCluster, canary_user: str, tmp_path: Path
) -> None:
    """A Spark application of its own, logging at INFO (driver) and DEBUG (Python), runs
    the sink with the right and a wrong password: its whole stdout/stderr (log4j, the
    executors' Python workers, the driver's traceback) and its event log hold no secret."""
    url = f"amqp://{USER}:{CANARY}@127.0.0.1:{rabbit_cluster.port(0)}/"
    wrong = url.replace(CANARY, f"{CANARY}-wrong")
    events = tmp_path / "events"
    events.mkdir()
    queue = f"canary-spark-app-{secrets.token_hex(3)}"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    proc = subprocess.run(
        [sys.executable, "-c", _SPARK_APP, url, wrong, queue, str(events)],
        capture_output=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    sweep.add("spark app stdout", proc.stdout)
    sweep.add("spark app stderr", proc.stderr)
    sweep.files("spark event log", events)
    out = proc.stdout.decode("utf-8", "replace")
    assert proc.returncode == 0, proc.stderr.decode("utf-8", "replace")[-3000:]
    # The secrets were used for real: the right login confirmed, the wrong one refused.
    reports = [line.split() for line in out.splitlines() if line.startswith("REPORT ")]
    assert reports and reports[0][-1] == "20", out
    assert "FAILED" in out and "AuthenticationError" in out, out
    assert b"INFO" in proc.stderr, "the driver's log4j output was not captured"
    assert any(p.is_file() for p in events.rglob("*")), "Spark wrote no event log"
    found = sweep.found(CANARY)
    print(f"spark application sweep: {sweep.size} bytes, {len(found)} occurrences")
    assert found == [], found
