"""What the transport asks the broker beside its publishing channel: declarations a
message carries (:mod:`~msgsafe.adapters.rabbitmq.declarations`), and why a message came
back (``basic.return``).

Each runs on a short channel of the transport's own connection, opened for it and closed
after, on the I/O thread: RabbitMQ closes a channel on any failed declaration, and the
publishing channel (with every message in flight on it) must not go with it.

Why a message came back. RabbitMQ returns a ``mandatory`` message with NO_ROUTE both
when no queue is bound for it and when its queue exists but cannot take it now: a
classic queue whose home node is down or unreachable. The first is permanent (the
caller must declare or bind a queue), the second transient (the node comes back, and
the queue with it). AMQP's ``basic.return`` says nothing more, so the queue is asked:
a passive ``queue.declare``, which RabbitMQ 3.10 answers

- ``declare-ok`` for a queue that exists and runs;
- 404 ``NOT_FOUND - no queue 'NAME' in vhost '/'`` for a missing one;
- 404 ``NOT_FOUND - home node 'rabbit@host' of durable queue 'NAME' in vhost '/' is down
  or inaccessible`` for a classic queue whose node is down (and so does a declare or a
  bind of that queue).

:class:`QueueStates` keeps each answer for :data:`ANSWER_KEEP_S`: a burst of returns costs
one question per queue, and the healthy path (nothing returned) none.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pika import exceptions as pe
from pika.channel import Channel

from msgsafe.adapters.rabbitmq._connection import log
from msgsafe.adapters.rabbitmq._errors import NOT_FOUND, PRECONDITION_FAILED, describe
from msgsafe.adapters.rabbitmq.declarations import Declaration

__all__ = [
    "ANSWER_KEEP_S",
    "LOST",
    "OK",
    "QueueState",
    "QueueStates",
    "node_down",
    "run_declarations",
]

#: Seconds an answer about a queue is kept.
ANSWER_KEEP_S = 1.0
#: The reply code of a side channel whose work all succeeded.
OK = 200
#: The "reply code" of a side channel lost with its connection (no answer).
LOST = -1

#: RabbitMQ's words for a queue that exists on a node that is down (3.8 - 3.13).
_NODE_DOWN = re.compile(r"home node '([^']*)' of durable queue .* is down or inaccessible")

QueueState = Literal["exists", "missing", "down", "unknown"]

#: What a side channel ended with: the reply code (OK, LOST or the broker's) and text.
Outcome = Callable[[int, str], None]


def node_down(reply_code: int, reply_text: str) -> str | None:
    """The node named by RabbitMQ's "home node ... is down or inaccessible", or None."""
    if reply_code != NOT_FOUND:
        return None
    match = _NODE_DOWN.search(reply_text)
    return match.group(1) if match else None


def _side_channel(
    connection: Any,
    steps: Sequence[Callable[[Channel, Callable[[Any], None]], None]],
    done: Outcome,
) -> None:
    """Open a channel on ``connection``, run ``steps`` one after the other (each issues
    one method with the given callback), close it, and tell ``done`` once."""
    finished = False

    def finish(code: int, text: str) -> None:
        nonlocal finished
        if not finished:
            finished = True
            done(code, text)

    def closed(_channel: Channel, reason: BaseException) -> None:
        if isinstance(reason, pe.ChannelClosedByBroker):
            finish(reason.reply_code, reason.reply_text)
        else:
            finish(LOST, describe(reason))

    def opened(channel: Channel) -> None:
        channel.add_on_close_callback(closed)
        remaining = list(steps)

        def step(_frame: Any = None) -> None:
            if finished:
                return
            if not remaining:
                finish(OK, "")
                if channel.is_open:
                    try:
                        channel.close()
                    except Exception as exc:  # the connection is closing
                        log.debug("closing a side channel: %s", describe(exc))
                return
            try:
                remaining.pop(0)(channel, step)
            except Exception as exc:  # the channel or connection is closing
                finish(LOST, describe(exc))

        step()

    try:
        connection.channel(on_open_callback=opened)
    except Exception as exc:  # the connection is closing
        finish(LOST, describe(exc))


def _step(declaration: Declaration) -> Callable[[Channel, Callable[[Any], None]], None]:
    d = declaration
    args = dict(d.arguments) or None

    def run(channel: Channel, callback: Callable[[Any], None]) -> None:
        if d.kind == "exchange":
            channel.exchange_declare(
                d.name,
                exchange_type=d.type,
                durable=d.durable,
                auto_delete=d.auto_delete,
                arguments=args,
                callback=callback,
            )
        elif d.kind == "queue":
            channel.queue_declare(
                d.name,
                durable=d.durable,
                exclusive=d.exclusive,
                auto_delete=d.auto_delete,
                arguments=args,
                callback=callback,
            )
        elif d.kind == "bind":
            channel.queue_bind(
                d.name, d.source, routing_key=d.routing_key, arguments=args, callback=callback
            )
        else:
            channel.exchange_bind(
                d.name, d.source, routing_key=d.routing_key, arguments=args, callback=callback
            )

    return run


def run_declarations(connection: Any, declarations: Sequence[Declaration], done: Outcome) -> None:
    """Declare ``declarations`` in order on a side channel of ``connection``; ``done``
    gets OK, LOST or the broker's reply to the first one that failed."""
    _side_channel(connection, [_step(d) for d in declarations], done)


@dataclass(slots=True)
class _Asked:
    """One queue's latest answer, and who waits for the next."""

    state: QueueState = "unknown"
    #: Until when ``state`` holds (time.monotonic()); 0: never answered.
    until: float = 0.0
    #: A question is on its way.
    asking: bool = False
    #: The text of the broker's answer (names the node that is down).
    text: str = ""
    waiting: list[Callable[[QueueState, str], None]] = field(default_factory=list)


class QueueStates:
    """Whether queues exist and run, asked on side channels, each answer kept briefly.

    Only the I/O thread calls it. :meth:`reset` (the connection went) answers every
    waiting caller "unknown".
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._asked: dict[str, _Asked] = {}

    def ask(self, connection: Any, queue: str, answer: Callable[[QueueState, str], None]) -> None:
        """``answer(state, text)`` for ``queue``: at once from a fresh answer, else once
        the broker answered a passive declare (one question per queue at a time)."""
        asked = self._asked.get(queue)
        if asked is None:
            if len(self._asked) >= 1000:
                self._asked.clear()
            asked = self._asked[queue] = _Asked()
        if asked.until > self._clock():
            answer(asked.state, asked.text)
            return
        asked.waiting.append(answer)
        if asked.asking:
            return
        asked.asking = True

        def passive(channel: Channel, callback: Callable[[Any], None]) -> None:
            channel.queue_declare(queue, passive=True, callback=callback)

        def done(code: int, text: str) -> None:
            state: QueueState
            if code == OK:
                state = "exists"
            elif node_down(code, text):
                state = "down"
            elif code == NOT_FOUND:
                state = "missing"
            else:
                state = "unknown"  # lost, or a refusal (an exclusive queue: 405)
            self._answered(queue, state, text)

        _side_channel(connection, [passive], done)

    def forget(self, queue: str) -> None:
        """Drop what is known of ``queue`` (it was just declared)."""
        asked = self._asked.get(queue)
        if asked is not None and not asked.asking:
            del self._asked[queue]

    def reset(self) -> None:
        """The connection went: every waiting caller hears "unknown"."""
        asked, self._asked = self._asked, {}
        for entry in asked.values():
            waiting, entry.waiting = entry.waiting, []
            for answer in waiting:
                answer("unknown", "the connection was lost before the broker answered")

    def _answered(self, queue: str, state: QueueState, text: str) -> None:
        asked = self._asked.get(queue)
        if asked is None:
            return  # reset meanwhile: its callers heard "unknown"
        asked.asking = False
        asked.state, asked.text = state, text
        asked.until = self._clock() + (ANSWER_KEEP_S if state != "unknown" else 0.0)
        waiting, asked.waiting = asked.waiting, []
        for answer in waiting:
            answer(state, text)


def declare_failed_softly(reply_code: int) -> bool:
    """Whether a failed declaration still lets its message be published: the entity
    exists with other arguments (PRECONDITION_FAILED), as kombu would find too."""
    return reply_code == PRECONDITION_FAILED
