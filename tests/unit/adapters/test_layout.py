"""Every adapter package has the same files, and the registry knows each of them."""

from __future__ import annotations

from pathlib import Path

import pytest

import msgsafe.adapters
from msgsafe.endpoints import PROTOCOLS

ROOT = Path(msgsafe.adapters.__file__).parent
SAME_FILES = {
    "__init__.py",
    "config.py",
    "transport.py",
    "receiver.py",
    "_connection.py",
    "_wire.py",
    "_errors.py",
    "check.py",
}
#: The modules an adapter has beyond the common ones: one each, and Kafka's client, the
#: librdkafka producer the drop-in and the Spark sink put on their own paths too, and
#: its fast path, the producer's single sends straight into it (msgsafe.ports.FastSender).
OWN_MODULES = {
    "rabbitmq": {"_confirms.py", "_side.py", "declarations.py"},
    "kafka": {"positions.py", "client.py", "fast.py"},
    "amqp10": {"_failover.py"},
    "memory": {"broker.py"},
}


def test_every_protocol_of_the_registry_has_an_adapter_package() -> None:
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    assert packages == set(PROTOCOLS)


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_an_adapter_has_the_common_files_and_its_own_listed_here(protocol: str) -> None:
    files = {p.name for p in (ROOT / protocol).glob("*.py")}
    assert files >= SAME_FILES, f"{protocol} lacks {sorted(SAME_FILES - files)}"
    assert files - SAME_FILES == OWN_MODULES[protocol]


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_an_adapter_offers_both_entry_points_and_its_name_check(protocol: str) -> None:
    module = msgsafe.adapters.adapter_module(protocol)
    assert callable(module.open_transport) and callable(module.open_receiver)
    assert module.check_destination is module.config.check_destination
    assert module.check_destination("orders") is None  # a name every protocol takes
