"""The distribution: a built wheel holds every module and imports in a fresh venv."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
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


@pytest.mark.slow
def test_wheel_installs_into_fresh_venv_and_imports_every_module(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dist), str(ROOT)],
        check=True,
    )
    (wheel,) = dist.glob("meshbus-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = expected_modules() - names
    assert not missing, f"modules missing from the wheel: {sorted(missing)}"
    assert "meshbus/py.typed" in names

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "--quiet", str(wheel)], check=True)
    modules = sorted(
        n[:-3].replace("/", ".").removesuffix(".__init__")
        for n in names
        # __main__ runs the CLI; testing is a pytest plugin and needs pytest, which
        # the runtime install rightly does not pull in; contrib needs its extras.
        if n.endswith(".py")
        and n not in ("meshbus/__main__.py", "meshbus/testing.py")
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
