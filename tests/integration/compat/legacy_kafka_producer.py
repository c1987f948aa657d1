"""An ordinary confluent-kafka producer, written the way its users write it.

    python legacy_kafka_producer.py BOOTSTRAP TOPIC COUNT

Produces COUNT events ``{"id": N}`` with a delivery callback, polls as it goes, flushes
at the end. Prints ``delivered N`` / ``failed N`` from the callback: the script's own
view of what was sent. The compat tests run it unchanged and with only the import line
changed.
"""

import json
import sys
import time

from confluent_kafka import Producer


def main() -> None:
    bootstrap, topic, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "1",
            "linger.ms": 5,
            "message.timeout.ms": 5000,
        }
    )

    def on_delivery(err, msg):
        event_id = json.loads(msg.value())["id"]
        if err is not None:
            print(f"failed {event_id} {err}", flush=True)
        else:
            print(f"delivered {event_id}", flush=True)

    for i in range(count):
        event = {"id": i, "type": "page_view", "at": time.time()}
        producer.produce(topic, json.dumps(event).encode(), key=str(i % 8), on_delivery=on_delivery)
        producer.poll(0)
        time.sleep(0.002)  # events arrive over time

    remaining = producer.flush(30)
    print(f"done remaining={remaining}", flush=True)


if __name__ == "__main__":
    main()
