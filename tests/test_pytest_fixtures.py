"""meshbus's pytest fixtures in a user's suite, under each async test plugin.

Each case writes a small project (settings and one test file that uses the
fixtures for real) and runs pytest on it with ``-W error``: under anyio's plugin
(on asyncio and trio), under pytest-asyncio in strict and in auto mode, and with
both plugins on. This suite itself runs with pytest-asyncio off (``-p no:asyncio``
in pyproject.toml); the runs here are separate pytest runs with their own
settings, so they turn it on or leave it off as each case needs.
"""

from __future__ import annotations

import textwrap

import pytest

pytest_plugins = ["pytester"]

# The body every case runs: a message published and received, an async handler
# that only the node's own tasks can call, and time moved on the manual clock.
# Were a fixture set up on another event loop than the test's, the handler
# would never run and settle() would not see the node's tasks.
_BODY = """
    from meshbus import ManualClock, Node, Session

    {marker}
    async def test_fixtures_serve_the_test(
        meshbus_node: Node, meshbus_session: Session, meshbus_clock: ManualClock
    ) -> None:
        assert meshbus_node.clock is meshbus_clock
        meshbus_session.subscribe("greetings/>")
        handled = []

        async def handler(message):
            handled.append((message.payload, meshbus_clock.monotonic()))

        meshbus_node.connect(client_name="handler", on_message=handler).subscribe("greetings/>")
        other = meshbus_node.connect(client_name="other", timestamps=True)

        async def publish_later() -> None:
            await meshbus_clock.sleep_until(30)
            other.publish("greetings/world", b"hello")

        async with anyio.create_task_group() as tg:
            tg.start_soon(publish_later)
            await meshbus_clock.run(30)
        with meshbus_clock.fail_after(1):
            message = await meshbus_session.receive()
        assert (message.payload, message.sender) == (b"hello", "other")
        assert message.timestamp == meshbus_clock.time() == 1_700_000_030.0
        await meshbus_clock.settle()
        assert handled == [(b"hello", 30.0)]


    {marker}
    async def test_a_mesh_links_two_nodes(mesh) -> None:
        shop = await mesh.start("shop")
        warehouse = await mesh.start("warehouse")
        await mesh.in_sync(mesh.link(warehouse, "shop", wants=["orders/>"]))
        picker = warehouse.connect(client_name="picker")
        picker.subscribe("orders/>")
        shop.connect(client_name="till").publish("orders/42", b"2 chairs")
        await mesh.clock.settle()
        assert picker.receive_nowait().payload == b"2 chairs"
"""


def _source(marker: str) -> str:
    return "import anyio\nimport pytest\n" + textwrap.dedent(_BODY).format(marker=marker)


def _project(pytester: pytest.Pytester, ini: str, marker: str = "") -> None:
    pytester.makeini("[pytest]\n" + ini)
    pytester.makepyfile(test_user=_source(marker))


def _run(pytester: pytest.Pytester, *options: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(
        "-W", "error", "-p", "no:cacheprovider", "--timeout=20", *options
    )


def _assert_clean(result: pytest.RunResult, passed: int) -> None:
    output = "\n".join(result.outlines + result.errlines)
    result.assert_outcomes(passed=passed)
    assert "warning" not in output.lower(), output


# The settings pytest-asyncio 1.x wants in any project (it warns without the
# fixture loop scope); with anyio's plugin they change nothing.
_ASYNCIO_SCOPE = "asyncio_default_fixture_loop_scope = function\n"


def test_anyio_auto_mode_runs_on_asyncio_and_trio(pytester: pytest.Pytester) -> None:
    _project(pytester, "anyio_mode = auto\n")
    result = _run(pytester, "-p", "no:asyncio", "-v")
    _assert_clean(result, passed=4)
    result.stdout.fnmatch_lines(["*serve_the_test?asyncio?*", "*serve_the_test?trio?*"])


def test_anyio_strict_mode_runs_on_the_backends_the_project_chooses(
    pytester: pytest.Pytester,
) -> None:
    _project(pytester, "", marker="@pytest.mark.anyio")
    pytester.makeconftest(
        "import pytest\n\n"
        "@pytest.fixture(params=['asyncio', 'trio'])\n"
        "def anyio_backend(request):\n"
        "    return request.param\n"
    )
    # Without pytest-asyncio the fixtures ask for anyio_backend themselves, so anyio's
    # plugin runs a test that uses them even unmarked.
    pytester.makepyfile(test_unmarked=_source(""))
    _assert_clean(_run(pytester, "-p", "no:asyncio"), passed=8)


def test_pytest_asyncio_strict_mode(pytester: pytest.Pytester) -> None:
    _project(pytester, _ASYNCIO_SCOPE + "asyncio_mode = strict\n", marker="@pytest.mark.asyncio")
    # A module whose tests share one loop: the fixtures run on that loop too.
    pytester.makepyfile(
        test_module_loop=_source("") + "\npytestmark = pytest.mark.asyncio(loop_scope='module')\n"
    )
    _assert_clean(_run(pytester, "-p", "asyncio"), passed=4)


def test_pytest_asyncio_auto_mode(pytester: pytest.Pytester) -> None:
    _project(pytester, _ASYNCIO_SCOPE + "asyncio_mode = auto\n")
    _assert_clean(_run(pytester, "-p", "asyncio"), passed=2)


def test_both_plugins_each_test_runs_where_its_marker_says(pytester: pytest.Pytester) -> None:
    # Both plugins in strict mode, one module marked for each: the anyio tests run on
    # each backend anyio has (its own anyio_backend fixture), the others once, on
    # pytest-asyncio's loop.
    _project(pytester, _ASYNCIO_SCOPE, marker="@pytest.mark.asyncio")
    pytester.makepyfile(test_other=_source("@pytest.mark.anyio"))
    result = _run(pytester, "-p", "asyncio", "-v")
    _assert_clean(result, passed=6)
    result.stdout.fnmatch_lines_random(
        [
            "test_user.py::test_fixtures_serve_the_test PASSED*",
            "test_other.py::test_fixtures_serve_the_test?trio? PASSED*",
        ]
    )


def test_a_test_both_plugins_claim_fails_saying_why(pytester: pytest.Pytester) -> None:
    # anyio's auto mode gives every async test anyio_backend, those marked asyncio too;
    # pytest-asyncio runs them, but both plugins wrap their async fixtures.
    _project(pytester, _ASYNCIO_SCOPE + "anyio_mode = auto\n", marker="@pytest.mark.asyncio")
    pytester.makepyfile(test_other=_source(""))
    result = _run(pytester, "-p", "asyncio")
    result.assert_outcomes(passed=4, errors=4)
    result.stdout.fnmatch_lines(["*is an asyncio test with anyio_backend*"])


def test_an_async_test_no_plugin_runs_fails_saying_why(pytester: pytest.Pytester) -> None:
    _project(pytester, _ASYNCIO_SCOPE)
    result = _run(pytester, "-p", "asyncio")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(
        ["*'meshbus_node' is an async fixture and 'test_fixtures_serve_the_test' is not*"]
    )
