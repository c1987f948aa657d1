"""The producer's side of the destination checks: each destination is checked once
before its first message, kept for ``refresh_s``, and refused when it gives less than
the application requires.

Requirements (``Producer(require=...)``):

- ``"durable"`` (the default): refuses a destination known to lose confirmed messages
  on a clean restart (:attr:`Guarantee.NONE`); a durable one that is not replicated,
  and one the broker could not describe (:attr:`Guarantee.UNKNOWN`), pass with one
  WARNING each, naming the setting and the fix.
- ``"replicated"``: refuses everything below :attr:`Guarantee.REPLICATED`, unknown too.
- ``"any"``: checks and reports the guarantee on the receipt, refuses nothing.

Cost: one check (a short connection of the protocol's own client) per destination per
``refresh_s``, and after each fail-over or redirect of the producer's connection; a
refresh runs on a background thread while the last answer serves. The hot path reads
one dict.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from msgsafe.checks import DestinationReport, Inspector
from msgsafe.errors import ConfigurationError, MsgsafeError, TransientError, UnsafeDestination
from msgsafe.message import Guarantee

__all__ = ["REQUIREMENTS", "DestinationGate"]

log = logging.getLogger("msgsafe.checks")

#: ``require=`` values and the weakest guarantee each lets through.
REQUIREMENTS: dict[str, Guarantee] = {
    "any": Guarantee.NONE,
    "durable": Guarantee.UNKNOWN,
    "replicated": Guarantee.REPLICATED,
}

#: How long a check that could not reach the broker is remembered: sends meanwhile go
#: to the outbox without asking again (one attempt per period, not one per message).
_UNREACHABLE_S = 1.0


class DestinationGate:
    """Admits a destination for sending once its check meets ``require``.

    Thread-safe. :attr:`admitted` maps each admitted destination to the monotonic time
    its answer is due for a refresh, :attr:`guarantees` to its guarantee: both are read
    without a lock on the send path.
    """

    def __init__(
        self,
        inspect: Inspector,
        *,
        require: str = "durable",
        refresh_s: float = 300.0,
        endpoint: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if require not in REQUIREMENTS:
            raise ConfigurationError(
                f"require must be one of {', '.join(REQUIREMENTS)} (got {require!r})"
            )
        if refresh_s <= 0:
            raise ConfigurationError("check_every must be > 0 seconds")
        self.require = require
        self._weakest = REQUIREMENTS[require]
        self._inspect = inspect
        self._refresh_s = refresh_s
        self._endpoint = endpoint
        self._clock = clock
        self.admitted: dict[str, float] = {}
        self.guarantees: dict[str, Guarantee] = {}
        self._lock = threading.Lock()
        #: One check at a time per destination; others wait for its answer.
        self._checking: dict[str, threading.Lock] = {}
        self._unreachable: dict[str, tuple[float, TransientError]] = {}
        self._refreshing: set[str] = set()
        self._warned: set[tuple[str, Guarantee]] = set()

    def admit(self, destination: str, *, fresh: bool = False) -> Guarantee:
        """The guarantee of ``destination``, checked now if it never was (blocking, once).

        Raises :class:`UnsafeDestination` when it is below the requirement (nothing may be
        sent there), or the :class:`TransientError` of a check that could not reach the
        broker (send nothing now: store, or retry later). That failure is remembered for
        a second and raised again without asking, unless ``fresh``: the outbox's probe,
        paced by its own backoff, checks whenever it probes.
        """
        due = self.admitted.get(destination)
        if due is not None:
            if due < self._clock():
                self._refresh_later(destination)
            return self.guarantees[destination]
        if not fresh:
            # Before the destination's lock: a fresh check running there (the outbox's
            # probe, every half second in an outage) must not hold up the sends that
            # its last failure already answers.
            failed = self._unreachable.get(destination)
            if failed is not None and failed[0] > self._clock():
                raise failed[1].with_id(None)
        with self._lock:
            lock = self._checking.setdefault(destination, threading.Lock())
        with lock:
            if destination in self.admitted:
                return self.guarantees[destination]
            failed = None if fresh else self._unreachable.get(destination)
            if failed is not None and failed[0] > self._clock():
                raise failed[1].with_id(None)
            report = self._check(destination)
            return self._decide(report)

    def failover(self, previous: str, endpoint: str, reason: str) -> None:
        """Another node serves now (a connection observer's event): its queues may not
        be the ones checked, so every destination is checked again, in the background,
        while the last answers serve."""
        self._all_due()

    def redirect(self, previous: str, endpoint: str, reason: str) -> None:
        """Like :meth:`failover`."""
        self._all_due()

    def reachable(self, endpoint: str) -> None:
        """A broker answers again: a destination whose check could not reach one is
        checked at its next message, not when the remembered failure expires."""
        self._unreachable.clear()

    def _all_due(self) -> None:
        with self._lock:
            for destination in self.admitted:
                self.admitted[destination] = 0.0

    def forget(self, destination: str | None = None) -> None:
        """Check ``destination`` (every one when None) again before its next message."""
        with self._lock:
            for name in [destination] if destination is not None else list(self.admitted):
                self.admitted.pop(name, None)

    # --- internals --------------------------------------------------------------------

    def _check(self, destination: str) -> DestinationReport:
        try:
            return self._inspect(destination)
        except TransientError as exc:
            # A copy without a traceback is kept: the one raised collects the frames of
            # the send that asked (its message, its future) and would keep them alive
            # for as long as this answer is cached.
            kept = exc.with_id(None)
            self._unreachable[destination] = (self._clock() + _UNREACHABLE_S, kept)
            # The copy in the record too: a handler may keep records (pytest's does).
            log.info("destination %s not checked: %s", destination, kept)
            raise
        except MsgsafeError:
            raise
        except Exception as exc:  # a check's bug must not pass for "safe"
            error = TransientError(
                f"the check of {destination!r} failed: {type(exc).__name__}: {exc}",
                endpoint=self._endpoint,
            )
            kept = error.with_id(None)
            self._unreachable[destination] = (self._clock() + _UNREACHABLE_S, kept)
            log.warning("%s", kept)
            raise error from exc

    def _decide(self, report: DestinationReport) -> Guarantee:
        destination, guarantee = report.destination, report.guarantee
        self._unreachable.pop(destination, None)
        if guarantee.rank < self._weakest.rank:
            self.admitted.pop(destination, None)
            raise UnsafeDestination(
                f"{destination!r} gives guarantee {guarantee.value!r}, below "
                f"require={self.require!r}: {report.reasons or 'no reason given'}"
                + (f"; fix: {report.fix}" if report.fix else "")
                + "; nothing was sent",
                destination=destination,
                guarantee=guarantee.value,
                required=self.require,
                fix=report.fix or None,
                endpoint=self._endpoint,
            )
        if guarantee is not Guarantee.REPLICATED and (destination, guarantee) not in self._warned:
            self._warned.add((destination, guarantee))
            log.warning(
                "destination %s gives guarantee %r (not replicated): %s%s",
                destination,
                guarantee.value,
                report.reasons or "no reason given",
                f"; fix: {report.fix}" if report.fix else "",
            )
        keep = self._refresh_s if report.keep_s is None else min(report.keep_s, self._refresh_s)
        self.guarantees[destination] = guarantee
        self.admitted[destination] = self._clock() + keep
        return guarantee

    def _refresh_later(self, destination: str) -> None:
        with self._lock:
            if destination in self._refreshing:
                return
            self._refreshing.add(destination)
        thread = threading.Thread(
            target=self._refresh, args=(destination,), name="msgsafe-check", daemon=True
        )
        thread.start()

    def _refresh(self, destination: str) -> None:
        try:
            report = self._check(destination)
            self._decide(report)
        except UnsafeDestination as exc:
            log.error("destination %s no longer admitted: %s", destination, exc)
        except MsgsafeError as exc:
            # Unreachable now: the last answer serves until a check succeeds.
            with self._lock:
                due = self.admitted.get(destination)
                if due is not None:
                    self.admitted[destination] = self._clock() + _UNREACHABLE_S
            log.debug("refresh of %s failed: %s", destination, exc)
        finally:
            with self._lock:
                self._refreshing.discard(destination)
