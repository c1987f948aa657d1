"""The error tree: classification, context, pickling."""

from __future__ import annotations

import pickle

import pytest

from msgsafe import errors

ALL = [getattr(errors, name) for name in errors.__all__]


@pytest.mark.parametrize("cls", [c for c in ALL if c is not errors.MissingExtra])
def test_every_error_pickles_with_context(cls: type[errors.MsgsafeError]) -> None:
    err = cls("boom", endpoint="h1:5672", message_id="id-1")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls
    assert (back.message, back.endpoint, back.message_id) == ("boom", "h1:5672", "id-1")
    assert "h1:5672" in str(back) and "id-1" in str(back)


def test_missing_extra_names_the_install_command() -> None:
    err = errors.MissingExtra("kafka", "confluent-kafka")
    assert "pip install 'msgsafe[kafka]'" in str(err)
    back = pickle.loads(pickle.dumps(err))
    assert back.extra == "kafka" and isinstance(back, ImportError)


def test_rejected_keeps_condition_through_pickle() -> None:
    back = pickle.loads(pickle.dumps(errors.Rejected("no", condition="amqp:not-allowed")))
    assert back.condition == "amqp:not-allowed"


def test_with_id_copies_the_error_for_one_message() -> None:
    try:
        raise errors.Rejected("no", condition="amqp:not-allowed", endpoint="h1:5672")
    except errors.Rejected as exc:
        shared = exc
    own = shared.with_id("id-7")
    assert type(own) is errors.Rejected and own is not shared
    assert (own.message, own.endpoint, own.message_id) == ("no", "h1:5672", "id-7")
    assert own.condition == "amqp:not-allowed"
    assert own.__traceback__ is None and shared.message_id is None
    assert errors.ConfirmTimeout("late").with_id("id-8").maybe_delivered


def test_classification() -> None:
    assert issubclass(errors.ConfigurationError, ValueError)
    assert issubclass(errors.InvalidMessage, errors.PermanentError)
    assert issubclass(errors.InvalidMessage, TypeError)
    assert issubclass(errors.SendTimeout, TimeoutError)
    assert not errors.ConnectError.maybe_delivered
    assert not errors.Refused.maybe_delivered
    assert errors.ConnectionLost.maybe_delivered
    assert errors.ConfirmTimeout.maybe_delivered
    for cls in (errors.ConnectError, errors.ConnectionLost, errors.ConfirmTimeout, errors.Refused):
        assert issubclass(cls, errors.TransientError)
    for cls in (
        errors.AuthenticationError,
        errors.MessageTooLarge,
        errors.Unroutable,
        errors.Rejected,
    ):
        assert issubclass(cls, errors.PermanentError)
    for cls in (errors.OutboxFull, errors.OutboxCorrupt, errors.OutboxLocked, errors.OutboxGone):
        assert issubclass(cls, errors.OutboxError)
    assert issubclass(errors.UnsafeOutbox, errors.ConfigurationError)


def test_store_outcome_unknown_says_it_may_be_stored_and_names_each_message() -> None:
    err = errors.StoreOutcomeUnknown(
        "COMMIT did not return within write_timeout=8s",
        destinations={"id-1": "orders", "id-2": "audit"},
        endpoint="postgresql://app@db1:5432/app?table=msgsafe_outbox",
    )
    assert isinstance(err, errors.OutboxError) and isinstance(err, errors.TransientError)
    assert err.maybe_delivered
    own = pickle.loads(pickle.dumps(err.with_id("id-2")))
    assert (own.message_id, own.destination) == ("id-2", "audit")
    text = str(own)
    assert "may have been stored; retry with message_id=id-2" in text and "\n" not in text
    assert "destination=audit" in text and "endpoint=postgresql://app@db1" in text
    assert issubclass(errors.MessageIdReused, errors.InvalidMessage)
    assert issubclass(errors.OutboxLoginRefused, errors.AuthenticationError)
    assert issubclass(errors.OutboxLoginReadOnly, errors.PermanentError)
    for cls in (errors.OutboxLoginRefused, errors.OutboxLoginReadOnly):
        assert issubclass(cls, errors.OutboxError)
