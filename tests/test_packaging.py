"""The distribution: a built wheel holds every module and imports in a fresh venv, and
its ``docs`` extra is all the documentation build needs."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SOURCE_DIRS = {
    "sdk": "meshbus",
    "plugins": "meshbus/plugins",
    "transports": "meshbus/transports",
    "contrib": "meshbus/contrib",
}


def expected_modules() -> set[str]:
    """Every .py file of the four source folders (subpackages too), as its wheel path."""
    found = set()
    for folder, target in SOURCE_DIRS.items():
        for path in (ROOT / folder).rglob("*.py"):
            found.add(f"{target}/{path.relative_to(ROOT / folder).as_posix()}")
    return found


# Packages that need a pip extra: a runtime install must refuse them with a hint.
EXTRA_PACKAGES = ("meshbus/contrib/spark/",)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project built as a wheel, once for this module."""
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dist), str(ROOT)],
        check=True,
    )
    (built,) = dist.glob("meshbus-*.whl")
    return built


def fresh_venv(where: Path) -> Path:
    """A new virtual environment with pip; its python."""
    venv.create(where, with_pip=True)
    return where / "bin" / "python"


@pytest.mark.slow
def test_wheel_installs_into_fresh_venv_and_imports_every_module(
    tmp_path: Path, wheel: Path
) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = expected_modules() - names
    assert not missing, f"modules missing from the wheel: {sorted(missing)}"
    assert "meshbus/py.typed" in names

    env_dir = tmp_path / "venv"
    python = fresh_venv(env_dir)
    subprocess.run([python, "-m", "pip", "install", "--quiet", str(wheel)], check=True)
    modules = sorted(
        n[:-3].replace("/", ".").removesuffix(".__init__")
        for n in names
        # __main__ runs the CLI; the two pytest plugins (the core's fixtures and the
        # transports' mesh fixture) need pytest, which the runtime install rightly does
        # not pull in (meshbus.testing and meshbus.transports.testing, the helpers, must
        # import without it); contrib needs its extras.
        if n.endswith(".py")
        and n
        not in (
            "meshbus/__main__.py",
            "meshbus/_pytest_plugin.py",
            "meshbus/transports/_pytest_mesh.py",
        )
        and not n.startswith(EXTRA_PACKAGES)
    )
    script = (
        "import importlib, sys\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        "try:\n"
        "    import meshbus.contrib.spark\n"
        "except ImportError as exc:\n"
        "    assert \"pip install 'meshbus[spark]'\" in str(exc), exc\n"
        "else:\n"
        "    raise AssertionError('meshbus.contrib.spark imported without its extra')\n"
        "import meshbus\n"
        "assert 'site-packages' in meshbus.__file__, meshbus.__file__\n"
        "print('imported', len(sys.modules))\n"
    )
    # Run outside the checkout so the source tree cannot shadow the installed package.
    subprocess.run([python, "-c", script], check=True, cwd=tmp_path)
    out = subprocess.run(
        [env_dir / "bin" / "meshbus", "plugins"],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    ).stdout
    assert "meshbus.plugins.direct" in out
    # cryptography is the certs extra: without it, `meshbus certs` names the extra.
    certs = subprocess.run(
        [env_dir / "bin" / "meshbus", "certs", "all", "--dir", tmp_path / "certs"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert certs.returncode == 2, certs.stderr
    assert "pip install 'meshbus[certs]'" in certs.stderr, certs.stderr


@pytest.mark.slow  # about a minute: installing sphinx and pyarrow into the venv, building
@pytest.mark.timeout(300)
def test_docs_build_in_a_fresh_venv_with_only_the_docs_extra(tmp_path: Path, wheel: Path) -> None:
    # What a documentation host does: install the package with its docs extra, then
    # sphinx-build -W. Nothing from the dev extra (pytest above all) may be needed.
    python = fresh_venv(tmp_path / "venv")
    subprocess.run([python, "-m", "pip", "install", "--quiet", f"{wheel}[docs]"], check=True)
    probe = [python, "-c", "import importlib.util as u; print(u.find_spec('pytest') is None)"]
    assert subprocess.run(probe, capture_output=True, text=True, check=True).stdout == "True\n"
    result = subprocess.run(
        [python, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", DOCS, tmp_path / "out"],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # the installed package, not the checkout's folders
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, f"sphinx-build failed:\n{result.stdout}\n{result.stderr}"
    assert (tmp_path / "out" / "reference" / "testing.html").is_file()
