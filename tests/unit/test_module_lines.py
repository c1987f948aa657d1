"""No underscore name crosses a module line: a name another module of the package imports
is public within the package (the underscore goes on the module instead, as httpx does).
Importing a private module itself (``from msgsafe.adapters import _peer``) is fine."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "msgsafe"


def test_no_private_name_is_imported_across_modules() -> None:
    crossings = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith(
                "msgsafe"
            ):
                continue
            module_file = PACKAGE.parent / Path(*str(node.module).split("."))
            for alias in node.names:
                name = alias.name
                if not name.startswith("_") or name.startswith("__"):
                    continue
                if (module_file / f"{name}.py").exists() or (module_file / name).is_dir():
                    continue  # a private module, imported as a module
                crossings.append(f"{path.relative_to(PACKAGE.parent)}: {node.module}.{name}")
    assert not crossings, "rename these (drop the underscore on the name):\n" + "\n".join(crossings)
