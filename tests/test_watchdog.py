"""The suite's watchdog ends a test that pytest-timeout's signal cannot end."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

_ROOT = Path(__file__).resolve().parent.parent

# The alarm lands in the spinning callback, where asyncio catches and logs it.
_SPINNING_TEST = """
    import asyncio
    import time

    import pytest

    pytestmark = pytest.mark.anyio


    @pytest.fixture
    def anyio_backend():
        return "asyncio"


    async def test_spins_the_loop():
        loop = asyncio.get_running_loop()

        def spin():
            started = time.monotonic()
            while time.monotonic() - started < 0.01:
                pass
            loop.call_soon(spin)

        loop.call_soon(spin)
        await asyncio.Event().wait()
"""


@pytest.mark.parametrize(
    ("options", "fired"),
    [([], "0:00:06"), (["--timeout", "2"], "0:00:07")],
    ids=["ini", "command line"],
)
def test_a_test_that_swallows_the_timeout_ends_the_run_with_its_stack(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, options: list[str], fired: str
) -> None:
    """1 s in the ini file (or 2 s on the command line, which wins, as it does for
    pytest-timeout): the watchdog fires 5 s after it."""
    monkeypatch.setenv("PYTHONPATH", str(_ROOT))
    pytester.makeini("[pytest]\ntimeout = 1\naddopts = -p no:cacheprovider -p no:asyncio\n")
    pytester.makeconftest('pytest_plugins = ["tests.watchdog"]\n')
    pytester.makepyfile(test_spin=textwrap.dedent(_SPINNING_TEST))
    result = pytester.runpytest_subprocess(*options, timeout=45)
    assert result.ret == 1
    stderr = result.stderr.str()
    assert f"Timeout ({fired})!" in stderr
    assert "(most recent call first)" in stderr
