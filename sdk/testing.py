"""Test helpers for applications built on meshbus; importing them does not need pytest.

The fixtures of meshbus's pytest plugin (the ``pytest11`` entry point ``meshbus``,
a module of its own because it needs pytest) are these, each function scoped. The
async ones run on the event loop of the test that asks for them, whichever plugin
runs it: anyio's pytest plugin (a test marked ``anyio``, or anyio's auto mode; on
each backend) or pytest-asyncio (a test marked ``asyncio``, or its auto mode).
The testing reference in the documentation gives the settings for each.

``meshbus_clock``
    A :class:`~meshbus.ManualClock`: time moves only when the test calls
    :meth:`~meshbus.ManualClock.advance`.

``meshbus_node``
    A running :class:`meshbus.Node` named ``test`` with the default plugins, a
    fixed random seed (``seed=0``) and ``meshbus_clock`` as its clock; stopped
    after the test.

``meshbus_session``
    A :class:`meshbus.Session` named ``test-session`` on the default VPN of
    ``meshbus_node``; closed after the test.
"""

from __future__ import annotations

from ._clock import ManualClock

__all__ = ["ManualClock"]
