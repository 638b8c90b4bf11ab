"""The layers import only downwards (see docs/explanation/architecture.rst).

core (sdk/ -> meshbus)       imports nothing of meshbus above it;
plugins, contrib             use the core's public API (never ``meshbus._*``), and
                             each plugin's private modules are its own;
transports                   may use the core's internals (the wire codec builds
                             messages the way the core does), never plugins or the app;
app (app/ -> meshbus.app)    the command, the configuration file and the demo: anything.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = {
    "sdk": "meshbus",
    "plugins": "meshbus.plugins",
    "transports": "meshbus.transports",
    "contrib": "meshbus.contrib",
    "app": "meshbus.app",
}


def module_name(path: Path) -> str:
    folder, *rest = path.relative_to(ROOT).with_suffix("").parts
    parts = [*LAYERS[folder].split("."), *rest]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> Iterator[tuple[int, str]]:
    """Every module ``path`` imports, absolute, with its line."""
    package = module_name(path)
    if path.name != "__init__.py":
        package = package.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield node.lineno, base
            for alias in node.names:  # ``from meshbus import _files`` imports a module too
                yield node.lineno, f"{base}.{alias.name}"


def files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def offences(folder: str, forbidden: Callable[[str, str], bool]) -> list[str]:
    found = []
    for path in files(folder):
        own = module_name(path)
        for line, name in imports(path):
            if forbidden(own, name):
                found.append(f"{path.relative_to(ROOT)}:{line}: imports {name}")
    return found


def _under(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _private_core(name: str) -> bool:
    parts = name.split(".")
    return parts[0] == "meshbus" and len(parts) > 1 and parts[1].startswith("_")


def _other_plugins_private(own: str, name: str) -> bool:
    """``meshbus.plugins.x._y`` imported from outside plugin ``x``."""
    parts = name.split(".")
    if parts[:2] != ["meshbus", "plugins"] or len(parts) < 4 or not parts[3].startswith("_"):
        return False
    return not _under(own, ".".join(parts[:3]))


def test_the_rules_see_the_whole_tree() -> None:
    # Guards the tests below against passing because they look at nothing.
    assert len(files("sdk")) > 25
    assert len(files("app")) > 8
    assert module_name(ROOT / "app" / "_cli.py") == "meshbus.app._cli"
    relative = dict(imports(ROOT / "plugins" / "guaranteed" / "_plugin.py"))
    assert "meshbus.plugins.guaranteed._hookspecs" in relative.values()


def test_the_core_imports_nothing_above_it() -> None:
    def forbidden(own: str, name: str) -> bool:
        if own == "meshbus.__main__":  # `python -m meshbus` starts the command
            return not _under(name, "meshbus.app._cli", "meshbus.app", "sys")
        return _under(
            name, "meshbus.app", "meshbus.plugins", "meshbus.transports", "meshbus.contrib"
        )

    assert offences("sdk", forbidden) == []


@pytest.mark.parametrize("folder", ["plugins", "contrib"])
def test_plugins_use_the_public_api_and_their_own_modules(folder: str) -> None:
    def forbidden(own: str, name: str) -> bool:
        return (
            _under(name, "meshbus.app")
            or _private_core(name)
            or _other_plugins_private(own, name)
            or (
                _under(name, "meshbus.transports")
                and name.split(".")[2:3] != []
                and name.split(".")[2].startswith("_")
            )
        )

    assert offences(folder, forbidden) == []


def test_transports_stay_below_plugins_and_the_app() -> None:
    def forbidden(own: str, name: str) -> bool:
        return _under(name, "meshbus.app", "meshbus.plugins", "meshbus.contrib")

    assert offences("transports", forbidden) == []
