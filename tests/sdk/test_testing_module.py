"""meshbus.testing imports without pytest; the fixtures come from the pytest plugin.

Run in child interpreters: the plugin's fixtures are already loaded in this one, and
whether a module needs pytest shows only where pytest cannot be imported.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Imports of pytest fail in the child as they would where pytest is not installed.
_WITHOUT_PYTEST = """
import sys
sys.modules["pytest"] = None
import meshbus.testing
from meshbus import ManualClock
assert meshbus.testing.ManualClock is ManualClock
assert "pytest" not in [m for m, v in sys.modules.items() if v is not None]
print("imported")
"""


def test_meshbus_testing_imports_without_pytest() -> None:
    child = subprocess.run(
        [sys.executable, "-c", _WITHOUT_PYTEST], capture_output=True, text=True, check=False
    )
    assert (child.returncode, child.stdout) == (0, "imported\n"), child.stderr


_USER_TEST = """
from meshbus import ManualClock, Node, Session


async def test_fixtures(meshbus_node, meshbus_clock, meshbus_session):
    assert isinstance(meshbus_node, Node)
    assert meshbus_node.name == "test"
    assert isinstance(meshbus_clock, ManualClock)
    assert meshbus_node.clock is meshbus_clock
    assert isinstance(meshbus_session, Session)
    assert meshbus_session.client_name == "test-session"
"""


@pytest.mark.parametrize(
    ("env", "options"),
    [({}, []), ({"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}, ["-p", "anyio", "-p", "meshbus"])],
    ids=["autoloaded", "loaded by name"],
)
def test_the_plugin_gives_a_users_suite_the_fixtures(
    tmp_path: Path, env: dict[str, str], options: list[str]
) -> None:
    # A user's project: its own folder and settings, meshbus merely installed.
    (tmp_path / "test_user.py").write_text(_USER_TEST, encoding="utf-8")
    (tmp_path / "pytest.ini").write_text("[pytest]\nanyio_mode = auto\n", encoding="utf-8")
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *options],
        cwd=tmp_path,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert child.returncode == 0, child.stdout + child.stderr
    assert child.stdout.splitlines()[-1].startswith("2 passed in "), child.stdout  # no warning
