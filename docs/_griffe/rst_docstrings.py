"""A griffe extension for the API reference: msgsafe's docstrings are written in
reStructuredText (Sphinx roles, ``::`` literal blocks, lists right under a paragraph),
and mkdocstrings renders Markdown. Before the docstrings are parsed, each one is
rewritten so that it renders as it reads:

- ``:class:`~msgsafe.x.Y``` (and ``:func:``, ``:meth:``, ``:mod:``, ``:attr:``,
  ``:data:``, ``:exc:``, ``:obj:``) becomes a cross-reference to the object, resolved in
  the docstring's scope as Sphinx would; a target the reference does not render (a
  private module, another library) stays code, without a link; a reference into the
  package that names nothing is a warning, so ``mkdocs build --strict`` fails on it;
- `` `text <url>`_ `` becomes a Markdown link;
- a paragraph ending in ``::`` ends in ``:``, a lone ``::`` goes, and the indented block
  after it stays a code block;
- a list that starts right under a paragraph gets the blank line Markdown needs.

Only the text changes; the docstrings in the package stay as they are.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(class|func|meth|mod|attr|data|exc|obj):`([^`]+)`")
_LINK = re.compile(r"`([^`<]+?)\s*<([^>`]+)>`_")
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s+\S")


def _target(obj: griffe.Object, text: str) -> tuple[str, str]:
    """``(identifier, title)`` of a role's text in ``obj``'s scope."""
    text = re.sub(r"\s+", "", text)
    explicit = re.fullmatch(r"(.+?)<(.+)>", text)
    if explicit is not None:
        title, target = explicit.group(1), explicit.group(2)
    else:
        title, target = "", text
    short = target.startswith("~")
    target = target.lstrip("~!")
    path = _resolve(obj, target)
    if not title:
        title = target.rsplit(".", 1)[-1] if short else target.lstrip(".")
    return path, title


def _lookup(root: griffe.Object, path: str) -> griffe.Object | griffe.Alias | None:
    """The object at ``path`` (``msgsafe.x.Y.z``) in ``root``'s package, inherited
    members included; None when there is none."""
    parts = path.split(".")
    if parts[0] != root.name:
        return None
    current: griffe.Object | griffe.Alias = root
    for part in parts[1:]:
        try:
            members = current.all_members if current.is_class else current.members
        except (griffe.AliasResolutionError, griffe.CyclicAliasError):
            return None
        if part not in members:
            return None
        current = members[part]
    return current


def _resolve(obj: griffe.Object, target: str) -> str:
    """The full path of ``target`` as Sphinx would find it from ``obj``: relative to the
    current module and its parents (``.name``), through the names in scope (``Name``,
    ``Name.attr``), or as written (``msgsafe.x.Y``)."""
    root = obj.package
    module = obj if obj.is_module else obj.module
    if target.startswith("."):
        scope: griffe.Object | None = module
        while scope is not None:
            candidate = f"{scope.path}{target}"
            if _lookup(root, candidate) is not None:
                return candidate
            scope = scope.parent
        return f"{module.path}{target}"
    if target.split(".", 1)[0] == root.name:
        return target
    head, _, rest = target.partition(".")
    try:
        resolved = obj.resolve(head)
    except (griffe.NameResolutionError, AttributeError, KeyError):
        # An inherited member of the class the docstring belongs to (``:meth:`stop```).
        owner = obj if obj.is_class else obj.parent
        while owner is not None and not owner.is_class:
            owner = owner.parent
        if owner is None or _lookup(root, f"{owner.path}.{head}") is None:
            return target
        resolved = f"{owner.path}.{head}"
    return f"{resolved}.{rest}" if rest else resolved


def _autoref(obj: griffe.Object, match: re.Match[str]) -> str:
    identifier, title = _target(obj, match.group(2))
    root = obj.package
    if identifier.split(".", 1)[0] == root.name and _lookup(root, identifier) is None:
        # A reference into the package that names nothing: a typo, or an object renamed
        # or removed since. `mkdocs build --strict` fails on this warning.
        griffe.logger.warning(
            "%s: %s names nothing in the package (%s)",
            obj.path,
            match.group(0),
            identifier,
        )
    return (
        f'<autoref identifier="{html.escape(identifier)}" optional>'
        f"<code>{html.escape(title)}</code></autoref>"
    )


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _blocks_and_lists(text: str) -> str:
    out: list[str] = []
    in_list = False
    literal: int | None = None  # the indent of the paragraph that opened a literal block
    for line in text.split("\n"):
        stripped = line.strip()
        if literal is not None:
            if not stripped or _indent(line) > literal:
                out.append(line)
                continue
            literal = None
        if stripped == "::":
            literal = _indent(line)
            continue
        if stripped.endswith("::") and not stripped.startswith(".."):
            literal = _indent(line)
            line = line.rstrip()[:-1]
        elif _LIST_ITEM.match(line):
            if not in_list and out and out[-1].strip():
                out.append("")
            in_list = True
        elif stripped and _indent(line) == 0 and out and not out[-1].strip():
            in_list = False
        out.append(line)
    return "\n".join(out)


def rewrite(obj: griffe.Object, text: str) -> str:
    """``text`` (a docstring of ``obj``) in Markdown."""
    text = _ROLE.sub(lambda m: _autoref(obj, m), text)
    text = _LINK.sub(lambda m: f"[{m.group(1)}]({m.group(2)})", text)
    return _blocks_and_lists(text)


class RestructuredTextDocstrings(griffe.Extension):
    """Rewrites every docstring of the loaded package (see the module docstring)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        self._walk(pkg, set())

    def _walk(self, obj: griffe.Object, seen: set[str]) -> None:
        if obj.path in seen:
            return
        seen.add(obj.path)
        if obj.docstring is not None:
            obj.docstring.value = rewrite(obj, obj.docstring.value)
        for member in obj.members.values():
            if not member.is_alias:
                self._walk(member, seen)  # type: ignore[arg-type]
