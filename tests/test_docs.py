"""The documentation builds without a single warning and documents the whole public API."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import meshbus
from meshbus import hookspecs

DOCS = Path(__file__).resolve().parent.parent / "docs"

# Each documented object is a <dt> carrying its full dotted name as its id.
_OBJECT_ID = re.compile(r'<dt class="sig sig-object py" id="([\w.]+)"')


@pytest.fixture(scope="module")
def html(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the HTML docs once for this module, exactly as the docs are meant to be built."""
    out = tmp_path_factory.mktemp("html")
    result = subprocess.run(
        # -W: warnings are errors; --keep-going: report all of them, not just the first.
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", DOCS, out],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, f"sphinx-build failed:\n{result.stdout}\n{result.stderr}"
    assert "WARNING" not in result.stderr, result.stderr
    return out


def _documented(html: Path, page: str) -> set[str]:
    return set(_OBJECT_ID.findall((html / "reference" / f"{page}.html").read_text("utf-8")))


def test_docs_build_without_warnings(html: Path) -> None:
    for page in ("index", "how-to/write-a-plugin", "explanation/delivery", "reference/api"):
        assert (html / f"{page}.html").is_file(), page


def test_every_public_name_is_documented(html: Path) -> None:
    documented: set[str] = set()
    for page in (html / "reference").glob("*.html"):
        documented |= _documented(html, page.stem)
    # A name counts wherever it is documented: meshbus.Node in the API page,
    # meshbus.errors.StateError for the errors, meshbus.hookspecs.hookimpl for the markers.
    short = {name.rsplit(".", 1)[-1] for name in documented}
    missing = sorted(set(meshbus.__all__) - short)
    assert not missing, f"public names missing from docs/reference: {missing}"


def test_every_transports_name_is_documented(html: Path) -> None:
    # The reference index promises meshbus.transports.__all__ too, on its own page.
    from meshbus import transports

    names = {f"meshbus.transports.{name}" for name in transports.__all__}
    missing = sorted(names - _documented(html, "transports"))
    assert not missing, f"names missing from docs/reference/transports.rst: {missing}"


def test_every_hookspec_and_error_has_its_reference_entry(html: Path) -> None:
    hooks = {n for n in vars(hookspecs) if n.startswith("meshbus_")}
    assert {f"meshbus.hookspecs.{n}" for n in hooks} <= _documented(html, "hookspecs")
    errors = {n for n in meshbus.errors.__all__}
    assert {f"meshbus.errors.{n}" for n in errors} <= _documented(html, "errors")


def test_reference_shows_the_hookspec_docstrings(html: Path) -> None:
    page = (html / "reference" / "hookspecs.html").read_text("utf-8")
    # The docstring is the reference: a parameter's description must reach the page.
    assert "the collector; call" in page
    assert "Entered in registration order" in page


def test_written_out_constant_values_match_the_code() -> None:
    # `.. data::` entries carry their value by hand; a changed constant must change them.
    from meshbus import transports
    from meshbus.contrib import spark

    pages = {"api": meshbus, "spark": spark, "transports": transports}
    written = re.compile(r"^\.\. data:: (\w+)\n   :value: (.+)$", re.MULTILINE)
    checked = 0
    for page, module in pages.items():
        for name, value in written.findall((DOCS / "reference" / f"{page}.rst").read_text()):
            if hasattr(module, name):
                assert ast.literal_eval(value) == getattr(module, name), f"{page}.rst: {name}"
                checked += 1
    assert checked >= 6


def test_no_attribute_docstring_is_left_after_another() -> None:
    # Autodoc takes the string right after a field as that field's docs; a second string
    # after it documents nothing. BridgeSettings.fail_back_interval's had slipped below
    # the next field, so the reference showed it without a word.
    root = DOCS.parent
    misplaced = []
    for folder in ("sdk", "transports", "plugins", "app", "contrib"):
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text("utf-8"))):
                if not isinstance(node, ast.ClassDef):
                    continue
                for before, after in zip(node.body, node.body[1:], strict=False):
                    if _is_string(before) and _is_string(after):
                        misplaced.append(f"{path.relative_to(root)}:{after.lineno}")
    assert misplaced == []


def _is_string(statement: ast.stmt) -> bool:
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
    )


# A code block marked ``:class: runnable`` is a whole script, run as it is written.
_RUNNABLE = re.compile(
    r"^\.\. code-block:: python\n   :class: runnable\n\n((?:   .*\n|\n)+)", re.MULTILINE
)


def _runnable_examples() -> list[tuple[str, str]]:
    found = []
    for page in sorted(DOCS.rglob("*.rst")):
        for number, body in enumerate(_RUNNABLE.findall(page.read_text("utf-8")), 1):
            found.append((f"{page.relative_to(DOCS).with_suffix('')}-{number}", body))
    return found


def test_the_runnable_examples_are_found() -> None:
    # Guards the test below against passing because the pattern matches nothing.
    assert len(_runnable_examples()) >= 1


@pytest.mark.parametrize(
    "source", [body for _, body in _runnable_examples()], ids=[n for n, _ in _runnable_examples()]
)
def test_runnable_examples_run(source: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(source)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, result.stderr
