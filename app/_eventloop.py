"""Which event loop the ``meshbus`` commands run on.

A standalone node and the command-line clients run on asyncio with uvloop when it
is installed (it is a dependency on the platforms it supports): on this project's
benchmark machine a node on uvloop answered a request/reply round trip about a
quarter sooner than on the standard loop. Applications embedding meshbus choose
their own loop; everything in meshbus runs on asyncio, uvloop and trio alike.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

__all__ = ["LOOPS", "run", "uvloop_available"]

T = TypeVar("T")

LOOPS = ("auto", "asyncio", "uvloop", "trio")
"""Choices of ``--loop``: ``auto`` is uvloop when installed, else asyncio."""


def uvloop_available() -> bool:
    """Whether uvloop can be imported here."""
    return importlib.util.find_spec("uvloop") is not None


def run(func: Callable[..., Awaitable[T]], *args: Any, loop: str = "auto") -> T:
    """``anyio.run(func, *args)`` on the loop named by ``loop`` (one of :data:`LOOPS`)."""
    if loop == "trio":
        return anyio.run(func, *args, backend="trio")
    use_uvloop = loop == "uvloop" or (loop == "auto" and uvloop_available())
    return anyio.run(func, *args, backend="asyncio", backend_options={"use_uvloop": use_uvloop})
