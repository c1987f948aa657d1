"""A producer through msgsafe.compat.confluent_kafka, to be killed: the Kafka crash test's
child.

    python crash_producer_kafka.py BOOTSTRAP TOPIC OUTBOX COUNT

Produces COUNT values ``crash-N`` and prints ``returned crash-N`` from each delivery
callback that reports success (``err is None``: confirmed or stored). Written as legacy
code is.
"""

import sys

from msgsafe.compat.confluent_kafka import Producer


def main() -> None:
    bootstrap, topic, outbox, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    producer = Producer({"bootstrap.servers": bootstrap, "msgsafe.outbox": outbox})

    def report(err, msg):
        if err is None:
            print(f"returned {msg.value().decode()}", flush=True)

    for i in range(count):
        producer.produce(topic, f"crash-{i}", key=str(i % 4), on_delivery=report)
        producer.poll(0)
    producer.flush()


if __name__ == "__main__":
    main()
