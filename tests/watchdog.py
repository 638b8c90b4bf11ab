"""A last resort for a test that pytest-timeout cannot end.

pytest-timeout ends a test by raising from a SIGALRM handler in the main thread.
When the signal lands inside an asyncio callback, asyncio's handler catches the
exception, logs it and runs the loop on: a test that spins the loop (two tasks
waking each other for ever) then hangs the whole run until CI's own limit, with
no stack to show where. This plugin arms :func:`faulthandler.dump_traceback_later`
for each test, a little after its pytest-timeout limit: if the test is still
running then, every thread's stack is written to the terminal's stderr and the
process exits with status 1.
"""

from __future__ import annotations

import faulthandler
import os
from collections.abc import Iterator

import pytest

_STDERR_FD = pytest.StashKey[int]()


def pytest_configure(config: pytest.Config) -> None:
    # A copy of stderr taken before any test's output is captured, so the stacks
    # reach the terminal even though the process then exits without pytest.
    config.stash[_STDERR_FD] = os.dup(2)


def pytest_unconfigure(config: pytest.Config) -> None:
    fd = config.stash.get(_STDERR_FD, None)
    if fd is not None:
        faulthandler.cancel_dump_traceback_later()
        os.close(fd)


def _limit(item: pytest.Item) -> float:
    """The test's pytest-timeout limit, found as pytest-timeout finds it: its marker,
    else ``--timeout``, else ``PYTEST_TIMEOUT``, else the ini file; 0 for none, and
    none while a debugger may stop the test (``--pdb``)."""
    config = item.config
    if config.getoption("usepdb", False):
        return 0.0
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        return float(marker.args[0])
    for value in (
        config.getoption("timeout", None),
        os.environ.get("PYTEST_TIMEOUT"),
        config.getini("timeout"),
    ):
        if value not in (None, ""):
            return float(value)
    return 0.0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    limit = _limit(item)
    if limit > 0:
        grace = max(5.0, limit / 2)
        faulthandler.dump_traceback_later(
            limit + grace, exit=True, file=item.config.stash[_STDERR_FD]
        )
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
