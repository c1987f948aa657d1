"""Celery through ``msgsafe.compat.celery.install(app)``, with a real Celery worker on the
session's real RabbitMQ cluster, counted: every task id ``delay()`` returned is run by
the worker (lost 0); a task run twice is a known id (a redelivery), never an unknown one.

- the broker unreachable (every node black-holed behind a fault proxy, as seen by the
  publisher): 500 ``delay()`` calls each return promptly, stored in the outbox; the
  broker comes back and the unchanged worker runs every one;
- a broker node SIGKILLed mid-run: ``delay()`` goes on, nothing returned is lost;
- flow control (a memory alarm on every node): ``delay()`` does not hang, and the tasks
  run once the alarm clears;
- Celery's own classic queue whose node is killed mid-run and restarted: tasks returned
  by the broker meanwhile are kept (not quarantined as unroutable) and all run;
- tasks stored while the broker was unreachable, forwarded before any worker declared
  their queue: forwarded with Celery's declarations, they wait in the queue and all run
  once a worker starts; the broker then holds what real Celery's publish leaves;
- a worker of the installed app forwards the outbox a publisher left behind.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest

from msgsafe.cluster.rabbitmq import RabbitCluster
from msgsafe.compat import celery as compat_celery
from msgsafe.message import Guarantee
from msgsafe.testing.faultproxy import FaultProxies
from tests.integration.compat.celery_app import make_app, runs
from tests.integration.compat.legacy import REPO, connected_ports, script_env
from tests.support.commands import msgsafe as run_msgsafe
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

#: Tasks published while the broker is unreachable.
UNREACHABLE_COUNT = 500
#: Tasks published across a node's SIGKILL, and how many return before the kill.
KILL_COUNT = 600
KILL_AT = 200
#: Seconds one ``delay()`` may take at most: the first one during an outage waits out a
#: connection timeout (2 s) for the declare, one per host (3) for msgsafe's destination
#: check and one for its connection; slack for a loaded machine.
DELAY_BOUND_S = 15.0
#: Seconds the worker has to run everything once the broker takes messages again.
RUN_DEADLINE_S = 240.0
TASK = "msgsafe_it.record"


def _failover(ports: list[int]) -> str:
    """A kombu failover list (``;``) of AMQP URLs on loopback, virtual host ``/``."""
    return ";".join(f"amqp://guest:guest@127.0.0.1:{port}//" for port in ports)


def _ports(cluster: RabbitCluster) -> list[int]:
    return [cluster.port(i) for i in range(cluster.size)]


def _proxied(proxies: FaultProxies) -> str:
    """The failover list of the proxies' ports."""
    return _failover([int(h.rsplit(":", 1)[1]) for h in proxies.hosts.split(",")])


@dataclass
class Tally:
    """What the publisher was told and what the worker ran."""

    sent: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    def ran(self, record: Path) -> Counter[str]:
        return Counter(runs(str(record)))

    def summary(self, record: Path) -> str:
        ran = self.ran(record)
        lost = set(self.sent) - set(ran)
        unknown = set(ran) - set(self.sent)
        duplicates = sum(n - 1 for n in ran.values() if n > 1)
        slowest = max(self.seconds, default=0.0)
        return (
            f"sent={len(self.sent)} failed={len(self.failed)} ran={len(set(ran))} "
            f"lost={len(lost)} duplicates={duplicates} unknown={len(unknown)} "
            f"slowest_delay={slowest:.2f}s"
        )


def _delay(app: Any, n: int, tally: Tally) -> None:
    started = time.monotonic()
    try:
        result = app.tasks[TASK].delay(n)
    except Exception as exc:  # counted: the caller still owns this task
        tally.failed.append(f"{n}: {exc!r}")
    else:
        tally.sent.append(result.id)
    tally.seconds.append(time.monotonic() - started)


@contextmanager
def _worker(
    broker: str, queue: str, record: Path, log: Path, **extra: str
) -> Iterator[subprocess.Popen[bytes]]:
    """An unchanged Celery worker (solo pool) on ``queue``, ready when yielded; ``extra``:
    more of celery_app's environment (CELERY_TEST_QUEUE_TYPE=...)."""
    env = script_env(log.parent)
    env.update(CELERY_TEST_BROKER=broker, CELERY_TEST_QUEUE=queue, CELERY_TEST_RECORD=str(record))
    env.update(extra)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "tests.integration.compat.celery_app",
                "worker",
                "--pool=solo",
                "-Q",
                queue,
                "--without-gossip",
                "--without-mingle",
                "--loglevel=INFO",
            ],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        wait_until(
            lambda: proc.poll() is not None or b" ready." in log.read_bytes(),
            90,
            "the Celery worker ready",
            diagnose=lambda: log.read_text()[-3000:],
        )
        assert proc.poll() is None, log.read_text()[-3000:]
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _wait_all_ran(tally: Tally, record: Path, log: Path) -> None:
    wait_until(
        lambda: set(tally.sent) <= set(runs(str(record))),
        RUN_DEADLINE_S,
        "the worker ran every task delay() returned",
        interval=0.2,
        diagnose=lambda: f"{tally.summary(record)}\n{log.read_text()[-2000:]}",
    )


def _assert_counted(tally: Tally, record: Path) -> None:
    ran = tally.ran(record)
    print(tally.summary(record))
    assert not tally.failed, tally.failed[:5]
    assert set(tally.sent) - set(ran) == set(), "lost tasks"
    assert set(ran) - set(tally.sent) == set(), "tasks nobody sent"


def test_500_delays_while_the_broker_is_unreachable_return_promptly_and_all_run(
    rabbit_cluster: RabbitCluster, tmp_path: Path
) -> None:
    queue = f"celery-unreachable-{uuid.uuid4().hex[:8]}"
    record, log = tmp_path / "runs.txt", tmp_path / "worker.log"
    ports = _ports(rabbit_cluster)
    proxies = FaultProxies(("127.0.0.1", port) for port in ports)
    app = make_app(_proxied(proxies), queue, str(record))
    publisher = compat_celery.install(app, outbox=tmp_path / "outbox.sqlite3")
    tally = Tally()
    try:
        with _worker(_failover(ports), queue, record, log):
            proxies.blackhole()
            for n in range(UNREACHABLE_COUNT):
                _delay(app, n, tally)
            assert not tally.failed, tally.failed[:5]
            assert publisher.producer.pending() == UNREACHABLE_COUNT
            assert set(runs(str(record))) == set()
            slow = [s for s in tally.seconds if s > 1.0]
            assert max(tally.seconds) < DELAY_BOUND_S, tally.summary(record)
            # Only the first call pays the connection attempts; the rest go to the outbox.
            assert len(slow) <= 1, f"{len(slow)} delay() calls took over 1 s: {slow}"
            proxies.heal()
            _wait_all_ran(tally, record, log)
            _assert_counted(tally, record)
    finally:
        publisher.uninstall()
        proxies.close()


def test_a_task_forwarded_from_the_outbox_is_the_message_kombu_would_send(
    rabbit_cluster: RabbitCluster, tmp_path: Path
) -> None:
    """The outbox forwards in runs (the RabbitMQ adapter's batch path): the task's own
    properties are published whole, not as a text header (a worker reads them)."""
    queue = f"celery-forwarded-{uuid.uuid4().hex[:8]}"
    port = rabbit_cluster.port(0)
    app = make_app(_failover([port]), queue, str(tmp_path / "runs.txt"))
    publisher = compat_celery.install(app, outbox=tmp_path / "outbox.sqlite3")
    params = pika.ConnectionParameters("127.0.0.1", port)
    conn = pika.BlockingConnection(params)
    try:
        conn.channel().queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
        captured: list[Any] = []
        plain = make_app(_failover([port]), queue, str(tmp_path / "runs.txt"))  # no install
        sent = plain.tasks[TASK].apply_async((7,), priority=3, producer=_Capture(captured))
        (message,) = captured
        envelope = compat_celery.envelope_of(message)
        assert envelope.message_id == sent.id
        producer = publisher.producer
        assert producer.outbox is not None
        producer.outbox.put([envelope])
        assert producer.drain(60) == 0
        method, props, body = conn.channel().basic_get(queue, auto_ack=True)
        assert method is not None, "nothing forwarded"
        assert body == message.body
        assert props.message_id == sent.id and props.correlation_id == sent.id
        assert props.content_type == "application/json" and props.priority == 3
        assert props.headers["id"] == sent.id and props.headers["task"] == TASK
        assert "msgsafe-amqp-properties" not in props.headers
    finally:
        publisher.uninstall()
        conn.close()


class _Capture:
    """A kombu producer's surface for ``apply_async(producer=...)``: the task message
    the wrapper builds, recorded instead of sent (its later publishes are events)."""

    def __init__(self, into: list[Any]) -> None:
        self._into = into
        self.connection = _NoErrors()

    def publish(self, body: Any, **kwargs: Any) -> None:
        from msgsafe.compat._celery_message import kombu_message

        exchange, key = kwargs.pop("exchange", None), kwargs.pop("routing_key", None)
        headers = kwargs.pop("headers", None)
        self._into.append(
            kombu_message(body, exchange=exchange, routing_key=key, headers=headers, options=kwargs)
        )


class _NoErrors:
    @contextmanager
    def _reraise_as_library_errors(self) -> Iterator[None]:
        yield


def test_a_node_killed_mid_run_loses_no_task(rabbit: RabbitCluster, tmp_path: Path) -> None:
    queue = f"celery-kill-{uuid.uuid4().hex[:8]}"
    record, log = tmp_path / "runs.txt", tmp_path / "worker.log"
    ports = _ports(rabbit)
    # NOTE: the worker stays on the last node, which is not killed: what is counted is
    # the publisher's side (a Celery worker whose first failover host is dead keeps
    # cycling through it, Celery's behaviour, untouched by msgsafe).
    worker_node = rabbit.size - 1
    app = make_app(_failover(ports), queue, str(record))
    publisher = compat_celery.install(app, outbox=tmp_path / "outbox.sqlite3", confirm_timeout=5)
    tally = Tally()
    killed: list[int] = []
    try:
        with _worker(_failover([ports[worker_node]]), queue, record, log):

            def publish() -> None:
                for n in range(KILL_COUNT):
                    _delay(app, n, tally)

            thread = threading.Thread(target=publish, name="celery-publisher")
            thread.start()
            wait_until(lambda: len(tally.sent) >= KILL_AT, 120, f"{KILL_AT} tasks published")
            connected = connected_ports(os.getpid(), ports[:worker_node])
            node = ports.index(connected[0]) if connected else 0
            rabbit.kill(node)
            killed.append(node)
            thread.join(300)
            assert not thread.is_alive(), "delay() hung after the node was killed"
            _wait_all_ran(tally, record, log)
            print(
                f"killed node {node} after {KILL_AT} tasks; "
                f"{publisher.fast_sends} confirmed on the caller's thread"
            )
            _assert_counted(tally, record)
            # Before the kill the tasks went the fast path; the rest through msgsafe's.
            assert 0 < publisher.fast_sends < len(tally.sent)
    finally:
        publisher.uninstall()


def test_a_memory_alarm_does_not_hang_delay(rabbit: RabbitCluster, tmp_path: Path) -> None:
    queue = f"celery-alarm-{uuid.uuid4().hex[:8]}"
    record, log = tmp_path / "runs.txt", tmp_path / "worker.log"
    ports = _ports(rabbit)
    app = make_app(_failover(ports), queue, str(record))
    confirm_timeout = 3.0
    publisher = compat_celery.install(
        app, outbox=tmp_path / "outbox.sqlite3", confirm_timeout=confirm_timeout
    )
    tally = Tally()
    try:
        with _worker(_failover(ports), queue, record, log):
            _delay(app, 0, tally)  # connected and confirmed before the alarm
            try:
                for i in range(rabbit.size):
                    rabbit.ctl(i, "set_vm_memory_high_watermark", "absolute", "1")
                wait_until(
                    lambda: all(
                        "memory" in rabbit.ctl(i, "eval", "rabbit_alarm:get_alarms().")
                        for i in range(rabbit.size)
                    ),
                    30,
                    "the memory alarm on every node",
                )
                for n in range(1, 21):
                    _delay(app, n, tally)
                assert not tally.failed, tally.failed[:5]
                assert max(tally.seconds) < confirm_timeout + 3, tally.summary(record)
                assert publisher.producer.pending() >= 1
            finally:
                for i in range(rabbit.size):
                    rabbit.ctl(i, "set_vm_memory_high_watermark", "0.4")
            _wait_all_ran(tally, record, log)
            _assert_counted(tally, record)
    finally:
        publisher.uninstall()


#: Tasks published across the kill and restart of their classic queue's node, and when.
NODE_DOWN_COUNT = 200
NODE_KILL_AT = 60
NODE_RESTART_AT = 140


def _quarantined(publisher: compat_celery.CeleryPublisher) -> int:
    outbox = publisher.producer.outbox
    assert outbox is not None
    return outbox.stats().quarantined


def _declare_as_celery(app: Any, port: int) -> None:
    """Declare the app's task queue (its exchange, the queue, the binding) as Celery does,
    on the node at ``port``: a classic queue lives there."""
    with app.connection_for_write(f"amqp://guest:guest@127.0.0.1:{port}//") as conn:
        for queue in app.amqp.queues.values():
            queue(conn.default_channel).declare()


def test_tasks_sent_while_their_classic_queues_node_is_down_are_kept_and_all_run(
    rabbit: RabbitCluster, tmp_path: Path
) -> None:
    """The classic queue's home node is SIGKILLed after NODE_KILL_AT tasks and restarted
    after NODE_RESTART_AT: RabbitMQ returns the tasks meanwhile (NO_ROUTE) as for a
    missing queue; they are stored and forwarded once the node is back, none
    quarantined, every one run.

    NOTE: a Celery worker whose classic queue's node goes down stops consuming (the
    broker cancels its consumer and the worker's re-declare gets 404 "home node ... is
    down"), Celery's own behaviour: the worker that ran the first tasks is stopped before
    the kill, and a fresh one runs the rest once the node is back.
    """
    queue = f"celery-classic-{uuid.uuid4().hex[:8]}"
    record, log = tmp_path / "runs.txt", tmp_path / "worker.log"
    ports = _ports(rabbit)
    home, worker_node = 1, rabbit.size - 1
    app = make_app(_failover(ports), queue, str(record), "classic")
    _declare_as_celery(app, ports[home])
    publisher = compat_celery.install(app, outbox=tmp_path / "outbox.sqlite3", confirm_timeout=5)
    tally = Tally()
    classic = {"CELERY_TEST_QUEUE_TYPE": "classic"}
    try:
        with _worker(_failover([ports[worker_node]]), queue, record, log, **classic):
            for n in range(NODE_KILL_AT):
                _delay(app, n, tally)
            _wait_all_ran(tally, record, log)
        rabbit.kill(home)
        for n in range(NODE_KILL_AT, NODE_RESTART_AT):
            _delay(app, n, tally)
        rabbit.restart(home)
        for n in range(NODE_RESTART_AT, NODE_DOWN_COUNT):
            _delay(app, n, tally)
        assert not tally.failed, tally.failed[:5]
        with _worker(
            _failover([ports[worker_node]]), queue, record, tmp_path / "w2.log", **classic
        ):
            _wait_all_ran(tally, record, log)
        quarantined = _quarantined(publisher)
        print(f"{tally.summary(record)} quarantined={quarantined}")
        _assert_counted(tally, record)
        assert len(set(tally.ran(record))) == NODE_DOWN_COUNT
        assert quarantined == 0
    finally:
        publisher.uninstall()


def _queue_state(port: int, queue: str) -> tuple[str, int]:
    """What the broker holds for ``queue``: its type (as msgsafe doctor reads it) and its
    message count; ("missing", 0) when it does not exist."""
    from msgsafe.adapters.rabbitmq.check import inspect_destination
    from msgsafe.endpoints import parse_url

    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    try:
        count = conn.channel().queue_declare(queue, passive=True).method.message_count
    except pika.exceptions.ChannelClosedByBroker:
        return "missing", 0
    finally:
        if conn.is_open:
            conn.close()
    report = inspect_destination(parse_url(f"amqp://guest:guest@127.0.0.1:{port}/"), queue)
    (finding,) = report.findings
    return f"{finding.setting}={finding.value}", count


def _exchange_exists(port: int, name: str) -> bool:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    try:
        conn.channel().exchange_declare(name, passive=True)
    except pika.exceptions.ChannelClosedByBroker:
        return False
    finally:
        if conn.is_open:
            conn.close()
    return True


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_the_broker_holds_what_celery_leaves_fast_and_forwarded(
    rabbit_cluster: RabbitCluster, tmp_path: Path, queue_type: str
) -> None:
    """Differential, no worker running: one task published by real Celery to a new queue,
    one through the wrapper (the fast path), one stored while the broker was
    unreachable and forwarded from the outbox: each queue then exists, of the same type,
    with its exchange, holding the one task."""
    port = rabbit_cluster.port(0)
    names = {way: f"celery-diff-{way}-{uuid.uuid4().hex[:8]}" for way in ("celery", "direct")}
    record = str(tmp_path / "runs.txt")
    plain = make_app(_failover([port]), names["celery"], record, queue_type)
    plain.tasks[TASK].delay(1)
    direct_app = make_app(_failover([port]), names["direct"], record, queue_type)
    direct = compat_celery.install(direct_app, outbox=tmp_path / "direct.sqlite3")
    proxies = FaultProxies([("127.0.0.1", port)])
    names["forwarded"] = f"celery-diff-forwarded-{uuid.uuid4().hex[:8]}"
    forwarded_app = make_app(_proxied(proxies), names["forwarded"], record, queue_type)
    forwarded = compat_celery.install(forwarded_app, outbox=tmp_path / "forwarded.sqlite3")
    try:
        direct_app.tasks[TASK].delay(1)
        proxies.blackhole()
        receipt_id = forwarded_app.tasks[TASK].delay(1).id
        assert forwarded.producer.pending() == 1, receipt_id
        assert _queue_state(port, names["forwarded"]) == ("missing", 0)
        proxies.heal()
        assert forwarded.producer.drain(60) == 0
        assert _quarantined(forwarded) == 0
        states = {way: _queue_state(port, name) for way, name in names.items()}
        print(states)
        assert states["celery"][1] == 1
        assert states["direct"] == states["celery"]
        assert states["forwarded"] == states["celery"]
        assert all(_exchange_exists(port, name) for name in names.values())
    finally:
        direct.uninstall()
        forwarded.uninstall()
        proxies.close()


def test_tasks_forwarded_before_any_worker_declared_their_queue_all_run(
    rabbit_cluster: RabbitCluster, tmp_path: Path
) -> None:
    """UNREACHABLE_COUNT tasks stored while the broker is unreachable; the broker comes
    back and the outbox is forwarded while no worker has declared the queue; a worker
    started afterwards runs every one (none quarantined as unroutable)."""
    queue = f"celery-later-worker-{uuid.uuid4().hex[:8]}"
    record, log = tmp_path / "runs.txt", tmp_path / "worker.log"
    ports = _ports(rabbit_cluster)
    proxies = FaultProxies(("127.0.0.1", port) for port in ports)
    app = make_app(_proxied(proxies), queue, str(record))
    publisher = compat_celery.install(app, outbox=tmp_path / "outbox.sqlite3")
    tally = Tally()
    try:
        proxies.blackhole()
        for n in range(UNREACHABLE_COUNT):
            _delay(app, n, tally)
        assert not tally.failed, tally.failed[:5]
        assert publisher.producer.pending() == UNREACHABLE_COUNT
        proxies.heal()
        assert publisher.producer.drain(120) == 0
        quarantined = _quarantined(publisher)
        assert quarantined == 0, f"{quarantined} tasks quarantined"
        with _worker(_failover(ports), queue, record, log):
            _wait_all_ran(tally, record, log)
        print(f"{tally.summary(record)} quarantined={quarantined}")
        _assert_counted(tally, record)
    finally:
        publisher.uninstall()
        proxies.close()


def test_a_worker_of_the_installed_app_forwards_the_outbox_a_publisher_left(
    rabbit_cluster: RabbitCluster, tmp_path: Path
) -> None:
    """A publisher stores tasks while the broker is unreachable and exits; a worker whose
    app is installed with the same outbox forwards them when it is ready, and runs them."""
    queue = f"celery-worker-forwards-{uuid.uuid4().hex[:8]}"
    record, log = tmp_path / "runs.txt", tmp_path / "worker.log"
    outbox = tmp_path / "outbox.sqlite3"
    ports = _ports(rabbit_cluster)
    proxies = FaultProxies(("127.0.0.1", port) for port in ports)
    app = make_app(_proxied(proxies), queue, str(record))
    publisher = compat_celery.install(app, outbox=outbox)
    tally = Tally()
    try:
        proxies.blackhole()
        for n in range(50):
            _delay(app, n, tally)
        assert publisher.producer.pending() == 50
    finally:
        publisher.uninstall()  # the process's producer closes; the tasks stay stored
        proxies.close()
    with _worker(_failover(ports), queue, record, log, CELERY_TEST_MSGSAFE_OUTBOX=str(outbox)):
        _wait_all_ran(tally, record, log)
    _assert_counted(tally, record)


@pytest.mark.parametrize(
    ("queue_type", "guarantee", "doctor_code"),
    # doctor's exit code: 6 a setting that loses messages; below 5 no warning (4: the
    # session cluster runs without the management API, so some cluster settings are
    # unknown, whatever the queue).
    [("classic", Guarantee.DURABLE, 6), ("quorum", Guarantee.REPLICATED, 4)],
)
def test_install_rates_the_task_queues_as_doctor_does(
    rabbit_cluster: RabbitCluster,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    queue_type: str,
    guarantee: Guarantee,
    doctor_code: int,
) -> None:
    """``install()`` checks the app's task queues as ``msgsafe doctor`` does: a classic
    queue (one node's disk) is named in a WARNING and doctor rates it critical; a quorum
    queue passes both."""
    port = rabbit_cluster.port(0)
    name = f"celery-check-{queue_type}-{uuid.uuid4().hex[:8]}"
    record = str(tmp_path / "runs.txt")
    make_app(_failover([port]), name, record, queue_type).tasks[TASK].delay(1)  # declares it
    app = make_app(_failover([port]), name, record, queue_type)
    handle = compat_celery.install(app, outbox=tmp_path / "o.sqlite3", check_queues=False)
    try:
        with caplog.at_level(logging.WARNING, logger="msgsafe"):
            results = handle.check_queues()
    finally:
        handle.uninstall()
    assert results == {name: guarantee}, results
    warned = [r.getMessage() for r in caplog.records if name in r.getMessage()]
    assert bool(warned) == (guarantee is not Guarantee.REPLICATED), warned
    doctor = run_msgsafe("doctor", f"amqp://guest:guest@127.0.0.1:{port}/%2F", name)
    assert doctor.code == doctor_code if doctor_code == 6 else doctor.code <= doctor_code, (
        doctor.stdout,
        doctor.stderr,
    )
