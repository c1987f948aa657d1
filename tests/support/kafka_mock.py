"""librdkafka's mock Kafka cluster, for the error paths no real broker can be made to
take on demand: per-request errors (NOT_ENOUGH_REPLICAS), brokers going down, partition
leaders moving.

It runs inside this process (driven through ctypes: the Python client exposes no
mock-cluster API) and listens on loopback TCP, so any client connects to it like to a
real cluster. It is not a substitute for one: the replicated Kafka is
:class:`msgsafe.cluster.kafka.KafkaCluster`, the zero-Java one
:class:`msgsafe.cluster.tansu.TansuCluster`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
from pathlib import Path
from types import TracebackType
from typing import Self

__all__ = ["PRODUCE_API_KEY", "MockClusterError", "MockKafkaCluster"]


class MockClusterError(RuntimeError):
    """The mock cluster could not be made or driven; the message says how to fix it."""


#: Kafka protocol api key of Produce requests.
PRODUCE_API_KEY = 0


def _librdkafka() -> ctypes.CDLL:
    """The librdkafka that confluent-kafka bundles (the mock API is not in its Python API)."""
    try:
        import confluent_kafka
    except ImportError as exc:
        raise MockClusterError("pip install 'msgsafe[kafka]' (confluent-kafka)") from exc
    base = Path(confluent_kafka.__file__).parent
    candidates = sorted(glob.glob(str(base.parent / "confluent_kafka.libs" / "librdkafka*.so*")))
    name = candidates[0] if candidates else ctypes.util.find_library("rdkafka")
    if not name:
        raise MockClusterError("librdkafka shared library not found next to confluent_kafka")
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
            raise MockClusterError(f"rd_kafka_new failed: {errstr.value.decode()}")
        self._rk: int | None = handle
        cluster = self._lib.rd_kafka_mock_cluster_new(handle, brokers)
        if not cluster:
            self._lib.rd_kafka_destroy(handle)
            raise MockClusterError("rd_kafka_mock_cluster_new failed")
        self._cluster: int | None = cluster
        self.bootstrap: str = self._lib.rd_kafka_mock_cluster_bootstraps(cluster).decode()

    @property
    def url(self) -> str:
        """``kafka://`` URL of the mock brokers."""
        return f"kafka://{self.bootstrap}"

    def _handle(self) -> int:
        if self._cluster is None:
            raise MockClusterError("mock cluster is closed")
        return self._cluster

    def create_topic(self, name: str, *, partitions: int = 3, replication: int = 3) -> None:
        """Create a topic on the mock cluster."""
        err = self._lib.rd_kafka_mock_topic_create(
            self._handle(), name.encode(), partitions, replication
        )
        if err:
            raise MockClusterError(f"mock topic_create failed with error {err}")

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
