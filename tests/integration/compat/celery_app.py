"""A Celery app for the integration tests: one queue, one task that records its id.

The worker runs it unchanged: ``celery -A tests.integration.compat.celery_app worker``
with the environment below; the test process builds the same app with :func:`make_app`
and publishes through ``msgsafe.compat.celery.install(app)``.

- ``CELERY_TEST_BROKER``: the broker URL (a ``;`` separated failover list);
- ``CELERY_TEST_QUEUE``: the queue (declared by the worker at start);
- ``CELERY_TEST_QUEUE_TYPE``: its type, ``quorum`` (default) or ``classic``;
- ``CELERY_TEST_RECORD``: a file the task appends its id to, one line per run;
- ``CELERY_TEST_MSGSAFE_OUTBOX``: when set, the worker's app is installed with
  ``msgsafe.compat.celery.install(app, outbox=...)`` (it forwards that outbox).
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery  # type: ignore[import-untyped]
from kombu import Exchange, Queue

__all__ = ["app", "make_app", "runs"]


def make_app(broker: str, queue: str, record_file: str, queue_type: str = "quorum") -> Celery:
    """The app: ``queue`` a durable queue of ``queue_type`` (``classic``: Celery's
    default, no ``x-queue-type``), the task ``record`` appending its id to
    ``record_file`` (acks late, so a message whose worker lost its connection mid-task
    runs again: a known duplicate)."""
    celery = Celery("msgsafe-it", broker=broker, set_as_current=False)
    arguments = {} if queue_type == "classic" else {"x-queue-type": queue_type}
    celery.conf.update(
        task_queues=[
            Queue(
                queue,
                Exchange(queue, type="direct"),
                routing_key=queue,
                queue_arguments=arguments or None,
            )
        ],
        task_default_queue=queue,
        task_acks_late=True,
        task_ignore_result=True,
        worker_prefetch_multiplier=50,
        broker_connection_retry_on_startup=True,
        broker_heartbeat=5,
        worker_hijack_root_logger=False,
    )

    @celery.task(name="msgsafe_it.record", shared=False)
    def record(n: int) -> int:
        line = f"{record.request.id} {n}\n".encode()
        fd = os.open(record_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        return n

    return celery


def runs(record: str) -> list[str]:
    """Task ids in the order the worker ran them (a duplicate is listed twice)."""
    try:
        with open(record) as handle:
            return [line.split()[0] for line in handle if line.strip()]
    except FileNotFoundError:
        return []


def _from_env() -> Any:
    broker = os.environ.get("CELERY_TEST_BROKER")
    if broker is None:
        return None
    made = make_app(
        broker,
        os.environ["CELERY_TEST_QUEUE"],
        os.environ["CELERY_TEST_RECORD"],
        os.environ.get("CELERY_TEST_QUEUE_TYPE", "quorum"),
    )
    outbox = os.environ.get("CELERY_TEST_MSGSAFE_OUTBOX")
    if outbox:
        from msgsafe.compat import celery as compat_celery

        compat_celery.install(made, outbox=outbox)
    return made


#: The worker's app (``-A tests.integration.compat.celery_app``); None without the env.
app = _from_env()
