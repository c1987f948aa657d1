"""PostgreSQL errors as one line naming the first cause, from libpq's texts as psycopg
passes them on (the real servers' are in tests/integration/outbox/test_postgres_outcome.py)."""

from __future__ import annotations

import pytest

from msgsafe.errors import OutboxLoginRefused
from msgsafe.outbox._pg_errors import first_cause, is_auth_failure, is_read_only, store_error


def _attempts(*causes: tuple[int, str]) -> Exception:
    """psycopg's text for a connection that failed on every host: the last attempt, then
    each attempt on a line of its own."""
    lines = [f'connection to server at "127.0.0.1", port {p} failed: {c}' for p, c in causes]
    text = f"connection failed: {lines[-1]}"
    if len(causes) > 1:
        text += "\nMultiple connection attempts failed. All failures were:"
        for (port, _), line in zip(causes, lines, strict=True):
            text += f"\n- host: '127.0.0.1', port: '{port}', hostaddr: '127.0.0.1': "
            text += f"connection failed: {line}"
    return Exception(
        text.replace(
            "Connection refused",
            "Connection refused\n\tIs the server running on that host and accepting TCP/IP"
            " connections?",
        )
    )


@pytest.mark.parametrize(
    ("exc", "cause"),
    [
        (_attempts((5433, "Connection refused")), "connection to 127.0.0.1:5433 refused"),
        (
            _attempts((5433, "Connection refused"), (5434, "Connection refused")),
            "connection to 127.0.0.1:5433 refused; connection to 127.0.0.1:5434 refused",
        ),
        (
            _attempts(
                (5433, "Connection refused"),
                (5434, 'FATAL:  password authentication failed for user "app"'),
            ),
            'password authentication failed for user "app" (at 127.0.0.1:5434);'
            " connection to 127.0.0.1:5433 refused",
        ),
        (
            _attempts((5433, "session is read-only"), (5434, "session is read-only")),
            "session is read-only (at 127.0.0.1:5433, 127.0.0.1:5434)",
        ),
    ],
)
def test_the_first_cause_in_one_line(exc: Exception, cause: str) -> None:
    assert first_cause(exc) == cause


def test_a_refused_login_is_typed_and_a_read_only_one_recognised() -> None:
    refused = _attempts((5433, 'FATAL:  password authentication failed for user "app"'))
    assert is_auth_failure(refused)
    error = store_error(refused, "postgresql://app@127.0.0.1:5433/db?table=t")
    assert isinstance(error, OutboxLoginRefused) and "\n" not in str(error)
    read_only = _attempts((5433, "session is read-only"), (5434, "session is read-only"))
    assert is_read_only(read_only) and not is_auth_failure(read_only)
    assert not is_read_only(_attempts((5433, "session is read-only"), (5434, "Connection refused")))
