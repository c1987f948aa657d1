"""The fast constructors build the same frozen objects as the dataclasses' own."""

from __future__ import annotations

import dataclasses

import pytest

from msgsafe.errors import InvalidMessage
from msgsafe.message import Envelope, Receipt, Status, new_receipt


def test_new_receipt_is_an_ordinary_frozen_receipt() -> None:
    receipt = new_receipt("id-1", Status.STORED, "orders")
    assert receipt == Receipt("id-1", Status.STORED, "orders")
    assert hash(receipt) == hash(Receipt("id-1", Status.STORED, "orders"))
    assert repr(receipt) == repr(Receipt("id-1", Status.STORED, "orders"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        receipt.status = Status.CONFIRMED  # type: ignore[misc]


@pytest.mark.parametrize("key", [None, b"k", "k", bytearray(b"k"), memoryview(b"k")])
def test_built_envelopes_equal_the_dataclass_built_ones(key: object) -> None:
    built = Envelope.build("orders", b"body", key=key)  # type: ignore[arg-type]
    assert type(built) is Envelope
    same = Envelope("orders", b"body", built.message_id, b"k" if key is not None else None)
    assert dataclasses.replace(same, created_at=built.created_at) == built
    assert built.headers == {} and built.size == 4 + (1 if key is not None else 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.body = b"other"  # type: ignore[misc]


def test_a_bad_key_is_refused_on_the_fast_path_too() -> None:
    with pytest.raises(InvalidMessage, match="key must be str or bytes"):
        Envelope.build("orders", b"body", key=3)  # type: ignore[arg-type]


def test_a_subclass_is_built_through_its_own_init() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Tagged(Envelope):
        def __post_init__(self) -> None:
            object.__setattr__(self, "key", b"tagged")

    built = Tagged.build("orders", b"body")
    assert type(built) is Tagged and built.key == b"tagged"
