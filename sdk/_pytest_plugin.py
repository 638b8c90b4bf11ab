"""meshbus's pytest plugin: the fixtures described in :mod:`meshbus.testing`.

pytest loads it by itself in any project that has meshbus installed (the
``pytest11`` entry point ``meshbus``; with plugin autoloading off, ``-p meshbus``).
It lives apart from :mod:`meshbus.testing` because it needs pytest, and the
helpers must import without it: in an application's runtime, or for a
documentation build that installs only the ``docs`` extra.

An async fixture has to run on the event loop of the test that uses it, and two
plugins run async tests: anyio's and pytest-asyncio. :func:`register_async_fixtures`
registers the async fixtures when pytest is configured, to fit the plugins of the
run:

* pytest-asyncio not active (not installed, or ``-p no:asyncio``): each fixture
  asks for ``anyio_backend``, so anyio's plugin runs it, and the test that uses it,
  on each backend, as with any anyio fixture.
* pytest-asyncio active: each fixture follows the plugin that runs the test. For a
  test pytest-asyncio runs (marked ``asyncio``, or any async test in its auto mode)
  the fixture runs on pytest-asyncio's loop of the test's loop scope; for a test
  anyio's plugin runs (one with ``anyio_backend``: marked ``anyio`` or in anyio's
  auto mode) on anyio's runner. A test that neither runs fails, saying what to do,
  and so does a pytest-asyncio test with ``anyio_backend`` (anyio's auto mode gives
  it to every async test): both plugins wrap its async fixtures, and the one loaded
  last decides the loop they run on, not necessarily the test's.

pytest-asyncio is imported only when its plugin is active: meshbus does not need it.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable, Mapping
from types import ModuleType
from typing import Any, Literal

import pytest

from ._clock import ManualClock
from ._node import Node
from ._session import Session

__all__ = ["meshbus_clock", "register_async_fixtures"]

#: An async generator function that yields a fixture's value once; its parameters
#: name the fixtures it needs.
AsyncFixtureFunction = Callable[..., AsyncIterator[Any]]

# pytest-asyncio's scopes for an event loop, each the scope of a fixture.
_LOOP_SCOPES: tuple[Literal["function", "class", "module", "package", "session"], ...] = (
    "function",
    "class",
    "module",
    "package",
    "session",
)


@pytest.fixture
def meshbus_clock() -> ManualClock:
    """A clock that moves only when the test calls ``advance``."""
    return ManualClock()


async def _meshbus_node(meshbus_clock: ManualClock) -> AsyncIterator[Node]:
    """A running node with the default plugins, a fixed random seed and a manual clock."""
    async with Node(name="test", clock=meshbus_clock, seed=0) as node:
        yield node


async def _meshbus_session(meshbus_node: Node) -> AsyncIterator[Session]:
    """A session on the default VPN of ``meshbus_node``."""
    async with meshbus_node.connect(client_name="test-session") as session:
        yield session


def pytest_configure(config: pytest.Config) -> None:
    register_async_fixtures(
        config,
        "meshbus-fixtures",
        {"meshbus_node": _meshbus_node, "meshbus_session": _meshbus_session},
    )


def register_async_fixtures(
    config: pytest.Config, plugin_name: str, fixtures: Mapping[str, AsyncFixtureFunction]
) -> None:
    """Register function-scoped async fixtures, by name, for the async test plugins of
    this run (see the module's docstring); ``plugin_name`` names the plugin that holds
    them. Call it from ``pytest_configure``."""
    holder = ModuleType(f"{__name__}.{plugin_name}")
    if not config.pluginmanager.has_plugin("asyncio"):
        for name, function in fixtures.items():
            _hold(holder, name, _calling(function, name, ("anyio_backend",)))
    else:
        import pytest_asyncio

        for name, function in fixtures.items():
            _hold(holder, name, _following_the_runner(name, function.__doc__))
            anyio_variant = _calling(function, name, ("anyio_backend",))
            _hold(holder, f"_{name}_anyio", anyio_variant)
            for scope in _LOOP_SCOPES:
                variant = f"_{name}_asyncio_{scope}"
                in_a_task = _in_a_task_of_its_own(_calling(function, name, ()))
                setattr(
                    holder,
                    variant,
                    pytest_asyncio.fixture(in_a_task, loop_scope=scope, name=variant),
                )
    config.pluginmanager.register(holder, plugin_name)


def _hold(holder: ModuleType, name: str, function: Callable[..., Any]) -> None:
    setattr(holder, name, pytest.fixture(function, name=name))


def _calling(
    function: AsyncFixtureFunction, name: str, ignored: tuple[str, ...]
) -> AsyncFixtureFunction:
    """A new async generator function that yields what ``function`` yields; it takes
    ``function``'s fixtures and those named in ``ignored``, which it does not pass on."""
    needs = [p for p in inspect.signature(function).parameters if p not in ignored]

    async def fixture(**kwargs: Any) -> AsyncIterator[Any]:
        async for value in function(**{need: kwargs[need] for need in needs}):
            yield value

    fixture.__name__ = fixture.__qualname__ = name
    fixture.__doc__ = function.__doc__
    fixture.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter(param, inspect.Parameter.POSITIONAL_OR_KEYWORD)
            for param in (*ignored, *needs)
        ]
    )
    return fixture


def _in_a_task_of_its_own(function: AsyncFixtureFunction) -> AsyncFixtureFunction:
    """``function`` run from start to end in one asyncio task.

    pytest-asyncio runs an async generator fixture's setup and its teardown in two
    tasks, and a task group (a node's) must be left in the task that entered it.
    """

    async def fixture(**kwargs: Any) -> AsyncIterator[Any]:
        loop = asyncio.get_running_loop()
        started: asyncio.Future[Any] = loop.create_future()
        finish = asyncio.Event()

        async def lifetime() -> None:
            values = function(**kwargs)
            try:
                value = await anext(values)
            except BaseException as exc:
                started.set_exception(exc)
                return
            started.set_result(value)
            await finish.wait()
            async for _ in values:
                raise RuntimeError(f"the fixture {function.__name__!r} yielded twice")

        task = loop.create_task(lifetime())
        try:
            yield await started
        finally:
            finish.set()
            await task

    fixture.__name__ = fixture.__qualname__ = function.__name__
    fixture.__doc__ = function.__doc__
    fixture.__signature__ = inspect.signature(function)  # type: ignore[attr-defined]
    return fixture


def _following_the_runner(name: str, doc: str | None) -> Callable[..., Any]:
    """The fixture ``name``: the variant for the plugin that runs the test."""

    def fixture(request: pytest.FixtureRequest) -> Any:
        return request.getfixturevalue(_variant(request, name))

    fixture.__name__ = fixture.__qualname__ = name
    fixture.__doc__ = doc
    return fixture


def _variant(request: pytest.FixtureRequest, name: str) -> str:
    import pytest_asyncio

    item = request.node
    with_anyio = "anyio_backend" in request.fixturenames
    if pytest_asyncio.is_async_test(item) and with_anyio:
        # Both plugins then wrap every async fixture, and which runs it depends on the
        # order they were loaded in: no fixture of pytest-asyncio's is sure of its loop.
        pytest.fail(
            f"{item.name!r} is an asyncio test with anyio_backend (anyio_mode = auto gives "
            f"it to every async test): pytest-asyncio runs the test, and {name!r} cannot "
            "be sure to run on its loop. Use anyio's strict mode with pytest-asyncio, or "
            "leave such tests unmarked for anyio to run.",
            pytrace=False,
        )
    if pytest_asyncio.is_async_test(item):
        marker = item.get_closest_marker("asyncio")
        kwargs = marker.kwargs if marker is not None else {}
        scope = kwargs.get("loop_scope") or kwargs.get("scope")
        if scope is None:
            try:
                scope = request.config.getini("asyncio_default_test_loop_scope")
            except ValueError:  # a pytest-asyncio without the setting: loops per test
                scope = "function"
        return f"_{name}_asyncio_{scope}"
    if with_anyio:
        return f"_{name}_anyio"
    pytest.fail(
        f"{name!r} is an async fixture and {item.name!r} is not an async test that "
        "pytest-asyncio or anyio's plugin runs: make it an async def marked "
        "@pytest.mark.asyncio or @pytest.mark.anyio (or set asyncio_mode or anyio_mode "
        "to auto)",
        pytrace=False,
    )
