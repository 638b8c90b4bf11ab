"""The event loop the ``meshbus`` commands pick."""

from __future__ import annotations

import asyncio

import pytest

from meshbus.app._eventloop import LOOPS, run, uvloop_available


async def _which() -> str:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # no asyncio loop: running on trio
        return "trio"
    return type(loop).__module__.split(".")[0]


def test_auto_is_uvloop_when_installed() -> None:
    assert run(_which) == ("uvloop" if uvloop_available() else "asyncio")


@pytest.mark.parametrize(("loop", "expected"), [("asyncio", "asyncio"), ("trio", "trio")])
def test_a_named_loop_is_used(loop: str, expected: str) -> None:
    assert run(_which, loop=loop) == expected


@pytest.mark.skipif(not uvloop_available(), reason="uvloop is not installed here")
def test_uvloop_by_name() -> None:
    assert run(_which, loop="uvloop") == "uvloop"


def test_the_choices_are_what_meshbus_run_offers() -> None:
    from meshbus.app._cli import main

    with pytest.raises(SystemExit):
        main(["run", "--loop", "tokio"])
    assert LOOPS == ("auto", "asyncio", "uvloop", "trio")
