"""A publisher through msgsafe.compat.pika, to be killed: the crash-safety test's child.

    python crash_publisher.py PORT,PORT,... QUEUE OUTBOX COUNT

Publishes COUNT messages ``crash-N`` (body and ``message_id``) in confirm mode and
prints ``returned crash-N`` after each ``basic_publish`` returned. Written as legacy
code is.
"""

import sys

from msgsafe.compat import pika


def main() -> None:
    ports, queue, outbox, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    params = [pika.ConnectionParameters("127.0.0.1", int(port)) for port in ports.split(",")]
    connection = pika.BlockingConnection(params, outbox=outbox)
    channel = connection.channel()
    channel.confirm_delivery()
    for i in range(count):
        properties = pika.BasicProperties(message_id=f"crash-{i}", delivery_mode=2)
        channel.basic_publish("", queue, f"crash-{i}".encode(), properties)
        print(f"returned crash-{i}", flush=True)
    connection.close()


if __name__ == "__main__":
    main()
