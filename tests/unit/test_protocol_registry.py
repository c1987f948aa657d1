"""What is protocol-specific is found through the registry, never by comparing names.

:data:`msgsafe.endpoints.SCHEMES` names the protocols, :func:`msgsafe.endpoints.traits`
says what the code above the adapters needs to know of each as data, and each protocol's
code lives in one folder, found by the protocol's name: ``msgsafe/adapters/NAME/``,
its destination check included (and the cluster kinds' launchers, ``msgsafe.cluster.KINDS``,
with what differs between kinds on the launcher class). So no module outside the registry
branches on a protocol's or a cluster kind's name: no ``protocol == "kafka"``, ``kind !=
"rabbitmq"``, ``url.protocol in ("amqp10", ...)``. A protocol's own module may name
itself (the RabbitMQ adapter refusing a ``kafka://`` URL).

Read with :mod:`ast`: a comparison (``==``, ``!=``, ``in``, ``not in``) of something
named ``kind`` or ``...protocol...`` (a variable or an attribute) with a protocol's or a
cluster kind's name. None remains: ``REMAINING`` (an exception, with why) is empty and
stays so; an entry that no longer occurs fails too.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

import msgsafe.adapters
from msgsafe.cluster import KINDS
from msgsafe.endpoints import _TRAITS, PROTOCOLS, SCHEMES, ProtocolTraits, traits
from msgsafe.errors import ConfigurationError

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "msgsafe"
#: The registry itself: the scheme table and the traits of each protocol.
REGISTRY = "msgsafe/endpoints.py"
NAMES = frozenset(PROTOCOLS) | frozenset(KINDS)

#: (module, name compared) -> why it is still there. Remove an entry with its branch.
REMAINING: dict[tuple[str, str], str] = {}


def _names_protocol(node: ast.expr) -> bool:
    """A variable or attribute that holds a protocol or a cluster kind, by its name."""
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
    return isinstance(name, str) and (name == "kind" or "protocol" in name)


def _literals(node: ast.expr) -> set[str]:
    """The protocol or kind names a compared literal holds (a string, or a tuple, list
    or set of strings)."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return {
        item.value
        for item in items
        if isinstance(item, ast.Constant) and isinstance(item.value, str) and item.value in NAMES
    }


def _own(path: str, name: str) -> bool:
    """Whether ``path`` is one of ``name``'s own modules (it may name itself)."""
    return path.startswith(f"msgsafe/adapters/{name}/") or path == f"msgsafe/cluster/{name}.py"


def _branches(path: str, source: str) -> dict[tuple[str, str], list[int]]:
    """(module, name) -> the lines where ``path`` compares a protocol or kind with name."""
    found: dict[tuple[str, str], list[int]] = {}
    for node in ast.walk(ast.parse(source, filename=path)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        if not any(_names_protocol(operand) for operand in operands):
            continue
        for operand in operands:
            for name in _literals(operand):
                if not _own(path, name):
                    found.setdefault((path, name), []).append(node.lineno)
    return found


@functools.cache
def _sources() -> dict[str, str]:
    return {
        path.relative_to(ROOT).as_posix(): path.read_text(encoding="utf-8")
        for path in PACKAGE.rglob("*.py")
        if "__pycache__" not in path.parts and path.relative_to(ROOT).as_posix() != REGISTRY
    }


@functools.cache
def _package_branches() -> dict[tuple[str, str], list[int]]:
    found: dict[tuple[str, str], list[int]] = {}
    for path, source in sorted(_sources().items()):
        found.update(_branches(path, source))
    return found


def test_no_module_branches_on_a_protocols_name() -> None:
    found = _package_branches()
    new = {key: lines for key, lines in found.items() if key not in REMAINING}
    gone = sorted(key for key in REMAINING if key not in found)
    assert not new, (
        "branches on a protocol's or cluster kind's name outside msgsafe/endpoints.py: ask "
        "traits(protocol), the protocol's adapter or check, or the cluster launcher instead:\n"
        + "\n".join(f"{path}:{lines} compares with {name!r}" for (path, name), lines in new.items())
    )
    assert not gone, f"no longer there, drop from REMAINING: {gone}"


@pytest.mark.parametrize(
    "code",
    [
        'if url.protocol == "kafka":\n    pass\n',
        'x = 1 if protocol != "amqp10" else 2\n',
        'ok = self.kind in ("rabbitmq", "qpid")\n',
        'ok = "memory" == parse_url(u).protocol\n',
    ],
)
def test_a_new_branch_is_caught(code: str) -> None:
    path = "msgsafe/producer.py"
    assert _branches(path, _sources()[path]) == {}
    assert _branches(path, _sources()[path] + "\n" + code), code


def test_a_protocols_own_module_may_name_itself_and_others_are_not_branches() -> None:
    assert _branches("msgsafe/adapters/kafka/config.py", 'ok = url.protocol == "kafka"\n') == {}
    assert _branches("msgsafe/adapters/kafka/config.py", 'ok = url.protocol == "amqp10"\n')
    # A broker product or a client library's own URL scheme is not a protocol of ours.
    assert _branches("msgsafe/x.py", 'ok = product.lower() == "rabbitmq"\n') == {}
    assert _branches("msgsafe/x.py", 'ok = url.scheme in ("amqp", "amqps")\n') == {}


def test_every_protocol_has_its_traits_and_its_adapter_with_its_check() -> None:
    assert set(_TRAITS) == set(PROTOCOLS)
    assert {spec.protocol for spec in SCHEMES.values()} == set(PROTOCOLS)
    for protocol in PROTOCOLS:
        assert isinstance(traits(protocol), ProtocolTraits)
        package = Path(msgsafe.adapters.__file__).parent / protocol
        assert (package / "__init__.py").is_file() and (package / "check.py").is_file()
    with pytest.raises(ConfigurationError, match="unknown protocol"):
        traits("smtp")


def test_a_log_protocols_adapter_starts_a_group_at_the_beginning() -> None:
    for protocol in sorted(PROTOCOLS):
        if traits(protocol).log:
            module = msgsafe.adapters.adapter_module(protocol)
            assert callable(module.start_group_at_beginning), protocol
