"""Retry policies and endpoint rotation, with injected time: nothing sleeps."""

from __future__ import annotations

import pytest

from msgsafe.endpoints import Endpoint, EndpointList, MergePolicy
from msgsafe.errors import ConfigurationError, Refused
from msgsafe.retry import RetryPolicy


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_policy_caps_grow_and_stop_at_maximum() -> None:
    p = RetryPolicy(initial=0.1, maximum=1.0, multiplier=2.0)
    assert [p.cap(n) for n in range(1, 6)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0])
    assert p.cap(10_000) == 1.0
    assert p.wait(3, rng=lambda: 0.5) == pytest.approx(0.2)


def test_policy_without_jitter_waits_its_caps_and_knows_when_it_is_exhausted() -> None:
    p = RetryPolicy(initial=0.1, maximum=1.0, multiplier=2.0, max_attempts=4, jitter=False)
    assert [p.wait(n, rng=lambda: 0.0) for n in range(1, 6)] == pytest.approx(
        [0.1, 0.2, 0.4, 0.8, 1.0]
    )
    assert [p.exhausted(n, elapsed=0.0) for n in (1, 3, 4, 5)] == [False, False, True, True]
    timed = RetryPolicy(deadline=2.0)
    assert not timed.exhausted(100, elapsed=1.9) and timed.exhausted(1, elapsed=2.0)
    slept: list[float] = []
    with pytest.raises(Refused):
        p.retrying(sleep=slept.append)(lambda: (_ for _ in ()).throw(Refused("never")))
    assert slept == pytest.approx([0.1, 0.2, 0.4])


def test_policy_rejects_nonsense() -> None:
    with pytest.raises(ConfigurationError):
        RetryPolicy(initial=2.0, maximum=1.0)
    with pytest.raises(ConfigurationError):
        RetryPolicy(max_attempts=0)


def test_retrying_uses_injected_sleep_and_reraises() -> None:
    slept: list[float] = []
    calls = 0

    def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise Refused("not yet")
        return "ok"

    retrying = RetryPolicy(initial=0.01, maximum=0.05, max_attempts=5).retrying(sleep=slept.append)
    assert retrying(flaky) == "ok"
    assert calls == 3 and len(slept) == 2

    always = RetryPolicy(max_attempts=2).retrying(sleep=slept.append)
    with pytest.raises(Refused):
        always(lambda: (_ for _ in ()).throw(Refused("never")))


def test_rotation_skips_open_breakers() -> None:
    clock = FakeClock()
    a, b, c = Endpoint("a", 1), Endpoint("b", 1), Endpoint("c", 1)
    eps = EndpointList(
        [a, b, c], policy=RetryPolicy(initial=1.0, maximum=8.0), clock=clock, rng=lambda: 1.0
    )
    assert eps.next() == (a, 0.0)
    eps.failed(a)
    assert eps.next() == (b, 0.0)
    eps.failed(b)
    assert eps.next() == (c, 0.0)
    eps.failed(c)
    ep, wait = eps.next()
    assert ep == a and wait == pytest.approx(1.0)
    clock.now += 1.0
    assert eps.next()[1] == 0.0  # every breaker has closed again
    eps.failed(a)  # a's second failure: its breaker stays open twice as long
    eps.succeeded(b)
    eps.succeeded(c)
    clock.now += 1.5
    assert {eps.next()[0] for _ in range(4)} == {b, c}
    clock.now += 0.5
    assert a in {eps.next()[0] for _ in range(3)}


def test_advertised_candidates_merge_policies_and_tls_downgrade() -> None:
    tls_a, tls_b = Endpoint("a", 5671, True), Endpoint("b", 5671, True)
    plain = Endpoint("evil", 5672, False)
    eps = EndpointList([tls_a], merge=MergePolicy.REPLACE)
    assert eps.advertise([tls_b, plain]) == (tls_b,)
    assert eps.endpoints == (tls_b,)
    assert eps.refused == [plain]

    eps = EndpointList([tls_a], merge=MergePolicy.ADD)
    eps.advertise([tls_b])
    assert eps.endpoints == (tls_a, tls_b)

    eps = EndpointList([tls_a], merge=MergePolicy.IGNORE)
    assert eps.advertise([tls_b]) == ()
    assert eps.endpoints == (tls_a,)

    eps = EndpointList([Endpoint("a", 1)], allow=lambda e: e.host.endswith(".ok"))
    assert eps.advertise([Endpoint("x.ok", 1), Endpoint("x.bad", 1)]) == (Endpoint("x.ok", 1),)
