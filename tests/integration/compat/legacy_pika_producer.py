"""An ordinary pika publisher, written the way its users write it.

    python legacy_pika_producer.py HOST:PORT,HOST:PORT,... QUEUE COUNT

Declares a durable quorum queue, turns on publisher confirms and publishes COUNT events
``{"id": N}``; a lost connection is handled by reconnecting (to the next host) and
carrying on. Prints ``sent N`` / ``failed N``: the script's own view of what was sent.
The compat tests run it unchanged and with only the import line changed.
"""

import json
import sys
import time

import pika


def connect(hosts, queue):
    credentials = pika.PlainCredentials("guest", "guest")
    params = [
        pika.ConnectionParameters(
            host=host, port=int(port), credentials=credentials, connection_attempts=2
        )
        for host, port in (item.split(":") for item in hosts.split(","))
    ]
    connection = pika.BlockingConnection(params)
    channel = connection.channel()
    channel.queue_declare(queue=queue, durable=True, arguments={"x-queue-type": "quorum"})
    channel.confirm_delivery()
    return connection, channel


def main() -> None:
    hosts, queue, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    connection, channel = connect(hosts, queue)
    for i in range(count):
        event = {"id": i, "type": "order_created", "at": time.time()}
        try:
            channel.basic_publish(
                exchange="",
                routing_key=queue,
                body=json.dumps(event),
                properties=pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent),
            )
            print(f"sent {i}", flush=True)
        except (pika.exceptions.UnroutableError, pika.exceptions.NackError) as exc:
            print(f"failed {i} {exc!r}", flush=True)
        except pika.exceptions.AMQPError as exc:
            print(f"failed {i} {exc!r}", flush=True)
            connection, channel = connect(hosts, queue)
        time.sleep(0.002)  # events arrive over time
    connection.close()
    print("done", flush=True)


if __name__ == "__main__":
    main()
