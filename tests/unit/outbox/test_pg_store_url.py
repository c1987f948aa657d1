"""The PostgreSQL outbox URL: what libpq gets, what msgsafe reads, what is shown."""

from __future__ import annotations

import pytest

from msgsafe.cli.outbox_forward import store_spec
from msgsafe.errors import ConfigurationError
from msgsafe.outbox._pg_url import is_store_url, parse_store_url, redact_conninfo


def test_hosts_table_and_defaults() -> None:
    parsed = parse_store_url("postgresql://app:s3cret@h1:5432,h2:5433/orders?table=ob&lease=5")
    assert parsed.table == "ob" and parsed.lease_s == 5.0
    assert parsed.hosts == ("h1:5432", "h2:5433") and parsed.database == "orders"
    assert parsed.conninfo.startswith("postgresql://app:s3cret@h1:5432,h2:5433/orders?")
    assert "target_session_attrs=read-write" in parsed.conninfo
    assert "table=" not in parsed.conninfo and "lease=" not in parsed.conninfo
    assert parsed.redacted == "postgresql://app@h1:5432,h2:5433/orders?table=ob"
    assert "s3cret" not in repr(parsed)


def test_the_url_keeps_its_own_session_attrs_and_the_default_table() -> None:
    parsed = parse_store_url("postgres://h/db?target_session_attrs=any")
    assert parsed.table == "msgsafe_outbox"
    assert "target_session_attrs=any" in parsed.conninfo
    assert "read-write" not in parsed.conninfo


def test_write_timeout_is_msgsafe_s_not_libpq_s() -> None:
    parsed = parse_store_url("postgresql://h/db?table=ob&write_timeout=90")
    assert parsed.write_timeout_s == 90.0 and parsed.lease_s is None
    assert "write_timeout" not in parsed.conninfo
    assert parse_store_url("postgresql://h/db").write_timeout_s is None


@pytest.mark.parametrize(
    "bad",
    [
        "mysql://u:pw@h/db",
        "postgresql://u:pw@h/db?lease=0",
        "postgresql://u:pw@h/db?write_timeout=-1",
        "postgresql://u:pw@h/db?write_timeout=soon",
        "postgresql://u:pw@h/db?write_timeout=nan",
    ],
)
def test_errors_never_quote_the_password(bad: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_store_url(bad)
    assert "pw" not in str(info.value).replace("postgresql", "")


def test_redaction_and_recognition() -> None:
    assert redact_conninfo("host=h password=s3cret user=u") == "host=h password=*** user=u"
    assert redact_conninfo("postgresql://u:s3cret@h/db") == "postgresql://u@h/db"
    assert is_store_url("postgresql://h/db") and not is_store_url("/tmp/x.sqlite3")
    assert store_spec("postgresql:/u@h1,h2/db") == "postgresql://u@h1,h2/db"
    assert store_spec("/tmp/x.sqlite3") == "/tmp/x.sqlite3"


def test_an_inbox_url_is_refused_as_an_inbox_not_an_outbox() -> None:
    from msgsafe.inbox.postgres import PostgresInbox

    for refused in (
        lambda: parse_store_url("mysql://u:pw@h/db", store="inbox"),
        lambda: PostgresInbox.from_url("mysql://u:pw@h/db"),
    ):
        with pytest.raises(ConfigurationError) as info:
            refused()
        assert (
            str(info.value)
            == "a PostgreSQL inbox URL starts with postgresql://, not 'mysql://u@h/db'"
        )
    with pytest.raises(ConfigurationError, match="a PostgreSQL outbox URL starts with"):
        parse_store_url("mysql://u:pw@h/db")
