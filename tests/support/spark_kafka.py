"""Spark's own Kafka sink (``spark-sql-kafka-0-10``) for a local PySpark session: the
jars, resolved once from Maven Central into msgsafe's broker cache through the pom
``msgsafe/cluster/poms/spark-kafka-4.2.0.xml``, for ``spark.jars`` (not
``spark.jars.packages``: Ivy's resolver is not set up to reach the registry).

The bootstrap fetches them (``python3 -m tests.support.spark_kafka``); the Spark fixture
and ``benchmarks/bench_spark.py`` reuse the cache.
"""

from __future__ import annotations

from msgsafe.cluster import maven

__all__ = ["SPARK_KAFKA_VERSION", "spark_kafka_jars"]

#: NOTE: PySpark here is 4.3.0, but Maven Central serves no spark-sql-kafka-0-10_2.13
#: 4.3.0 (nor 4.2.1 or 4.2.2); 4.2.0 is the nearest release, and loads in Spark 4.3.0.
SPARK_KAFKA_VERSION = "4.2.0"
_CONNECTOR = f"spark-sql-kafka-0-10_2.13-{SPARK_KAFKA_VERSION}.jar"
INSTALL_HINT = (
    "needs Maven once (apt-get install -y maven) and Maven Central: "
    "python3 -m tests.support.spark_kafka"
)


def spark_kafka_jars() -> list[str]:
    """Paths of the connector and its runtime dependencies (fetched on first use);
    :class:`msgsafe.cluster.base.ClusterError` when Maven or the registry fails."""
    lib = maven.fetch_lib(
        f"spark-kafka-{SPARK_KAFKA_VERSION}",
        [_CONNECTOR],
        what="Spark Kafka sink",
        kind="kafka",
        m2="org/apache/spark",
    )
    return sorted(str(jar) for jar in lib.glob("*.jar"))


if __name__ == "__main__":
    print("\n".join(spark_kafka_jars()))
