"""Plugin composition, the plugin manager facade, the router pipeline, lifespans and stashes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio
import pytest
from anyio.abc import TaskStatus

import meshbus.plugins.direct as direct_plugin
from meshbus import (
    DEFAULT_PLUGINS,
    ConfigurationError,
    Envelope,
    MeshbusError,
    Message,
    Node,
    Pipeline,
    PluginError,
    PluginManager,
    Stash,
    StashKey,
    Vpn,
    available_plugins,
    hookimpl,
)

# --- plugins used below ----------------------------------------------------------------


class Configured:
    """Records configure/unconfigure calls into a shared log."""

    def __init__(self, name: str, log: list[tuple[str, str]]) -> None:
        self.name = name
        self.log = log

    @hookimpl
    def meshbus_configure(self, node: Node) -> None:
        self.log.append(("configure", self.name))

    @hookimpl
    def meshbus_unconfigure(self, node: Node) -> None:
        self.log.append(("unconfigure", self.name))


class Spanning:
    """A plugin with a lifespan that logs when it is entered and exited."""

    def __init__(self, name: str, log: list[tuple[str, str]]) -> None:
        self.name = name
        self.log = log

    @hookimpl
    def meshbus_lifespan(self, node: Node) -> AbstractAsyncContextManager[None] | None:
        return self._span(node)

    @asynccontextmanager
    async def _span(self, node: Node) -> AsyncIterator[None]:
        self.log.append(("enter", self.name))
        try:
            yield
        finally:
            self.log.append(("exit", self.name))


class Counting:
    """Contributes a router that counts every message it sees (and delivers none)."""

    def __init__(self, name: str = "counting") -> None:
        self.name = name
        self.seen: list[tuple[str, object]] = []

    @hookimpl
    def meshbus_vpn_pipeline(self, vpn: Vpn, pipeline: Pipeline) -> None:
        pipeline.add_router(self.name, self.route)

    def route(self, envelope: Envelope) -> int:
        self.seen.append((envelope.message.topic, envelope.origin))
        return 0


class Misspelt:
    @hookimpl
    def meshbus_sesion_opened(self, session: object) -> None:  # sic: the typo under test
        raise AssertionError("never registered, never called")


class ExtraArgument:
    """Valid configure hook, invalid session hook: registration must be all or nothing."""

    def __init__(self) -> None:
        self.configured = False

    @hookimpl
    def meshbus_configure(self, node: Node) -> None:
        self.configured = True

    @hookimpl
    def meshbus_session_opened(self, session: object, user: object) -> None:
        raise AssertionError("never registered, never called")


# --- composition ---------------------------------------------------------------------------


def test_default_plugins_are_the_builtin_entry_points() -> None:
    assert DEFAULT_PLUGINS == (
        "direct",
        "shared",
        "eliding",
        "guaranteed",
        "retained",
        "mqtt",
        "hopcount",
        "bridge",
        "dmr",
    )
    assert set(DEFAULT_PLUGINS) <= set(available_plugins())
    assert Node().plugins.names() == list(DEFAULT_PLUGINS)
    assert Node(plugins=None).plugins.get("direct") is direct_plugin


async def test_plugin_composed_by_entry_point_name_delivers() -> None:
    async with Node(plugins=["direct"]) as node, node.connect() as session:
        session.subscribe("a/*")
        session.publish("a/b", b"x")
        assert node.plugins.names() == ["direct"]
        message = session.receive_nowait()
        assert message is not None
        assert message.payload == b"x"


async def test_plugin_composed_by_object_delivers() -> None:
    async with Node(plugins=[direct_plugin]) as node, node.connect() as session:
        session.subscribe("a/>")
        session.publish("a/b/c", b"x")
        assert node.plugins.names() == ["meshbus.plugins.direct"]
        assert node.vpn().routers == ("direct", "links")
        message = session.receive_nowait()
        assert message is not None
        assert message.topic == "a/b/c"


async def test_node_without_plugins_has_no_direct_delivery() -> None:
    async with Node(plugins=[]) as node, node.connect() as session:
        assert node.plugins.names() == []
        assert node.vpn().routers == ("links",)
        with pytest.raises(ConfigurationError, match="'direct' plugin") as info:
            session.subscribe("a/b")
        assert "'a/b'" in str(info.value)
        assert session.subscriptions == ()  # nothing half-applied
        session.publish("a/b", b"x")
        assert session.receive_nowait() is None
        assert node.vpn().statistics().unmatched == 1


def test_autoload_registers_every_installed_plugin_once() -> None:
    node = Node(plugins=["direct"], autoload=True)
    assert sorted(node.plugins.names()) == sorted(available_plugins())
    again = Node(plugins=[], autoload=True).plugins.names()
    assert sorted(again) == sorted(node.plugins.names())


async def test_block_keeps_an_installed_plugin_out_of_autoload() -> None:
    node = Node(plugins=[], autoload=True, block=["direct"])
    assert "direct" not in node.plugins.names()
    assert node.plugins.get("direct") is None
    async with node, node.connect() as session:
        with pytest.raises(ConfigurationError, match="direct"):
            session.subscribe("a")


def test_block_removes_a_default_plugin() -> None:
    assert Node(block=["direct"]).plugins.names() == list(DEFAULT_PLUGINS[1:])


# --- bad registrations: a typed error naming the problem, and nothing changed -----------


def test_plugin_error_is_a_configuration_error() -> None:
    assert issubclass(PluginError, ConfigurationError)
    assert issubclass(PluginError, MeshbusError)


def test_unknown_entry_point_name_is_refused() -> None:
    with pytest.raises(PluginError, match=r"no installed meshbus plugin named 'nope'") as info:
        Node(plugins=["direct", "nope"])
    assert info.value.plugin == "nope"
    assert "direct" in str(info.value)  # lists what is installed


@pytest.mark.parametrize(
    "plugins",
    [
        pytest.param(["direct", "direct"], id="name-twice"),
        pytest.param([direct_plugin, direct_plugin], id="object-twice"),
        pytest.param([direct_plugin, "direct"], id="object-then-name"),
        pytest.param(["direct", direct_plugin], id="name-then-object"),
    ],
)
def test_the_same_plugin_twice_is_refused(plugins: list[object]) -> None:
    with pytest.raises(PluginError, match="registered twice"):
        Node(plugins=plugins)


def test_misspelt_hook_is_refused_at_registration() -> None:
    pm = PluginManager()
    pm.register(direct_plugin, "direct")
    bad = Misspelt()
    with pytest.raises(PluginError, match="unknown hooks: meshbus_sesion_opened") as info:
        pm.register(bad)
    assert info.value.plugin is bad
    assert pm.names() == ["direct"]
    pm.check_pending()  # no stray hookimpl was left behind


def test_hookimpl_argument_missing_from_the_spec_is_refused_and_nothing_registered() -> None:
    log: list[tuple[str, str]] = []
    pm = PluginManager()
    pm.register(Configured("first", log))
    bad = ExtraArgument()
    with pytest.raises(PluginError, match=r"meshbus_session_opened[\s\S]*'user'") as info:
        pm.register(bad)
    assert info.value.plugin is bad
    assert len(pm.names()) == 1
    # Its valid hook was not registered either: registration is all or nothing.
    pm.configure(Node(plugins=[]))
    assert not bad.configured
    assert log == [("configure", "first")]


def test_specname_and_optionalhook_are_not_mistaken_for_typos() -> None:
    configured: list[Node] = []

    class Options:
        @hookimpl(specname="meshbus_configure")
        def meshbus_setup(self, node: Node) -> None:
            configured.append(node)

        @hookimpl(optionalhook=True)
        def meshbus_link_up(self, node: Node) -> None:
            """A hook of another plugin, which may not be installed: pluggy's optionalhook."""

    node = Node(plugins=[Options()])
    assert configured == [node]


def test_refused_plugin_stops_node_creation_before_any_configure() -> None:
    log: list[tuple[str, str]] = []
    with pytest.raises(PluginError, match="meshbus_sesion_opened"):
        Node(plugins=["direct", Configured("ok", log), Misspelt()])
    assert log == []


@pytest.mark.parametrize(
    ("plugins", "blocked"),
    [
        pytest.param(["direct"], ["direct"], id="by-name"),
        pytest.param([direct_plugin], ["meshbus.plugins.direct"], id="by-object"),
    ],
)
def test_blocked_plugin_is_refused(plugins: list[object], blocked: list[str]) -> None:
    with pytest.raises(PluginError, match="blocked"):
        Node(plugins=plugins, block=blocked)


def test_blocked_plugin_object_under_an_explicit_name_is_refused() -> None:
    pm = PluginManager()
    pm.block("audit")
    with pytest.raises(PluginError, match="'audit' is blocked"):
        pm.register(Counting(), "audit")
    assert pm.names() == []


def test_name_taken_by_another_plugin_is_refused() -> None:
    pm = PluginManager()
    pm.register(Counting("a"), "audit")
    with pytest.raises(PluginError, match="'audit' is already registered"):
        pm.register(Counting("b"), "audit")
    assert pm.names() == ["audit"]


def test_unregister_removes_the_hooks() -> None:
    log: list[tuple[str, str]] = []
    pm = PluginManager()
    plugin = Configured("gone", log)
    pm.register(plugin)
    pm.unregister(plugin)
    pm.configure(Node(plugins=[]))
    assert log == []
    assert pm.names() == []


# --- the router pipeline ----------------------------------------------------------------------


def _router(result: int, calls: list[str], name: str) -> Callable[[Envelope], int]:
    def route(envelope: Envelope) -> int:
        calls.append(name)
        return result

    return route


def test_pipeline_refuses_a_duplicate_router_name_and_keeps_the_first() -> None:
    calls: list[str] = []
    pipeline = Pipeline()
    pipeline.add_router("audit", _router(1, calls, "first"))
    with pytest.raises(PluginError, match="'audit' is already in the pipeline") as info:
        pipeline.add_router("audit", _router(1, calls, "second"))
    assert info.value.plugin == "audit"
    assert pipeline.names == ("audit",)
    pipeline.compile()(Envelope(Message("t", b""), None))
    assert calls == ["first"]


def test_pipeline_refuses_a_router_that_is_not_callable() -> None:
    pipeline = Pipeline()
    with pytest.raises(PluginError, match="router 'audit' is not callable"):
        pipeline.add_router("audit", 42)  # type: ignore[arg-type]
    assert pipeline.names == ()


def test_pipeline_compiles_to_one_callable_summing_deliveries_in_order() -> None:
    calls: list[str] = []
    envelope = Envelope(Message("t", b""), None)
    assert Pipeline().compile()(envelope) == 0
    single = Pipeline()
    only = _router(2, calls, "only")
    single.add_router("only", only)
    assert single.compile() is only  # one router: no wrapper frame per message
    several = Pipeline()
    several.add_router("a", _router(1, calls, "a"))
    several.add_router("b", _router(0, calls, "b"))
    several.add_router("c", _router(3, calls, "c"))
    calls.clear()
    assert several.compile()(envelope) == 4
    assert calls == ["a", "b", "c"]


def test_plugin_adding_a_taken_router_name_stops_node_creation() -> None:
    with pytest.raises(PluginError, match="'direct' is already in the pipeline"):
        Node(plugins=["direct", Counting("direct")])


async def test_contributed_routers_see_every_publish_without_pluggy() -> None:
    first, second = Counting("first"), Counting("second")
    async with (
        Node(plugins=["direct", first, second]) as node,
        node.connect(client_name="sub") as subscriber,
        node.connect(client_name="pub") as publisher,
    ):
        # Three routers compiled together; pluggy calls the last registered plugin first.
        assert node.vpn().routers == ("second", "first", "direct", "links")
        subscriber.subscribe("a/*")
        hook_calls: list[str] = []
        # pluggy's own monitoring sees every hook call, whichever module makes it.
        undo = node.plugins._pm.add_hookcall_monitoring(
            lambda name, impls, kwargs: hook_calls.append(name), lambda *args: None
        )
        try:
            topics = ["a/1", "b/1", "a/2", "a/1", "c"]
            for topic in topics:
                publisher.publish(topic, b"x")
        finally:
            undo()
        assert hook_calls == []  # the data plane never goes through pluggy
        assert first.seen == second.seen == [(t, publisher) for t in topics]
        got = [m.topic for m in iter(subscriber.receive_nowait, None)]
        assert got == ["a/1", "a/2", "a/1"]  # counting routers deliver nothing themselves
        assert node.vpn().statistics().unmatched == 2


async def test_a_vpn_says_whether_routers_besides_one_are_on() -> None:
    async with Node(plugins=["direct", Counting()]) as node:
        vpn = node.vpn()
        assert vpn.routers_besides("direct")  # the counting router is on
        vpn.enable_router("counting", False)
        assert not vpn.routers_besides("direct")  # direct is off too: no subscription
        assert not vpn.routers_besides("counting")
        subscriber = node.connect()
        subscriber.subscribe("a/>")
        assert vpn.routers_besides("counting")
        assert not vpn.routers_besides("direct")
        subscriber.unsubscribe("a/>")
        assert not vpn.routers_besides("counting")


async def test_contributed_router_is_per_vpn() -> None:
    counting = Counting()
    async with Node(plugins=["direct", counting]) as node:
        tenant = node.create_vpn("tenant")
        assert tenant.routers == ("counting", "direct", "links")
        async with node.connect("tenant") as a, node.connect() as b:
            a.publish("x", b"")
            b.publish("y", b"")
    assert counting.seen == [("x", a), ("y", b)]


# --- lifecycle: configure, lifespans, unconfigure ------------------------------------------------


async def test_lifespans_enter_in_registration_order_and_exit_in_reverse() -> None:
    log: list[tuple[str, str]] = []

    class Idle:
        @hookimpl
        def meshbus_lifespan(self, node: Node) -> None:
            return None  # needs nothing running: skipped

    node = Node(plugins=["direct", Spanning("a", log), Idle(), Spanning("b", log)])
    node.plugins.register(Spanning("c", log))
    assert log == []
    async with node:
        assert log == [("enter", "a"), ("enter", "b"), ("enter", "c")]
        log.clear()
    assert log == [("exit", "c"), ("exit", "b"), ("exit", "a")]


async def test_failing_lifespan_unwinds_the_ones_already_entered() -> None:
    log: list[tuple[str, str]] = []

    class Broken:
        @hookimpl
        def meshbus_lifespan(self, node: Node) -> AbstractAsyncContextManager[None]:
            return self._span()

        @asynccontextmanager
        async def _span(self) -> AsyncIterator[None]:
            raise ConfigurationError("cannot start")
            yield  # pragma: no cover

    node = Node(plugins=[Spanning("a", log), Broken(), Spanning("c", log)])
    with pytest.raises(ConfigurationError, match="cannot start"):  # the error itself, no group
        async with node:
            pytest.fail("the node must not start")
    assert log == [("enter", "a"), ("exit", "a")]
    assert not node.running


async def test_lifespan_task_runs_in_the_node_task_group_and_is_cancelled_on_exit() -> None:
    events: list[str] = []

    class Ticker:
        @hookimpl
        def meshbus_lifespan(self, node: Node) -> AbstractAsyncContextManager[None]:
            return self._span(node)

        @asynccontextmanager
        async def _span(self, node: Node) -> AsyncIterator[None]:
            await node.task_group.start(self._run)
            yield
            events.append("lifespan exit")

        async def _run(self, *, task_status: TaskStatus[None]) -> None:
            events.append("started")
            task_status.started()
            try:
                await anyio.sleep(0)
                events.append("running")
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                events.append("cancelled")
                raise

    async with Node(plugins=["direct", Ticker()]) as node:
        assert events[0] == "started"  # ready before the node is: tg.start waited for it
        with anyio.fail_after(5):
            while "running" not in events:
                await anyio.sleep(0.001)
        assert node.running
    # The plugin cleaned up while its task still ran, then the node cancelled the task.
    assert events[-2:] == ["lifespan exit", "cancelled"]


async def test_a_plugin_failing_while_the_node_stops_does_not_leave_its_tasks_running() -> None:
    """The node's tasks are cancelled even when stopping fails before the lifespans exit
    (here a subscription hook raising as the node closes its sessions)."""

    class Broken:
        @hookimpl
        def meshbus_subscription_removed(self, session: object, subscription: object) -> None:
            raise RuntimeError("broken on the way out")

    async def forever() -> None:
        await anyio.sleep_forever()

    async def run_and_stop() -> None:
        async with Node(plugins=["direct", Broken()]) as node:
            node.task_group.start_soon(forever)
            node.connect().subscribe("a")

    with anyio.fail_after(10), pytest.raises(RuntimeError, match="broken on the way out"):
        await run_and_stop()


async def test_configure_at_creation_and_unconfigure_after_stop_last_registered_first() -> None:
    log: list[tuple[str, str]] = []
    node = Node(
        plugins=["direct", Configured("a", log), Spanning("span", log), Configured("b", log)]
    )
    # pluggy's order for notification hooks: the plugin registered last first.
    assert log == [("configure", "b"), ("configure", "a")]
    log.clear()
    async with node:
        assert log == [("enter", "span")]
        log.clear()
    # Unconfigure comes after every lifespan exited.
    assert log == [("exit", "span"), ("unconfigure", "b"), ("unconfigure", "a")]


def test_configure_error_refuses_the_node() -> None:
    class Strict:
        @hookimpl
        def meshbus_configure(self, node: Node) -> None:
            raise ConfigurationError("missing setting 'x'")

    with pytest.raises(ConfigurationError, match="missing setting 'x'"):
        Node(plugins=["direct", Strict()])


def test_node_never_started_is_not_unconfigured() -> None:
    log: list[tuple[str, str]] = []
    Node(plugins=[Configured("a", log)])
    assert log == [("configure", "a")]


# --- Stash and StashKey --------------------------------------------------------------------------


def test_stash_stores_values_per_key() -> None:
    count: StashKey[int] = StashKey()
    names: StashKey[list[str]] = StashKey()
    stash = Stash()
    assert len(stash) == 0
    assert count not in stash
    with pytest.raises(KeyError):
        stash[count]
    assert stash.get(count, -1) == -1
    assert count not in stash  # get does not store
    stash[count] = 1
    assert stash[count] == 1
    assert stash.setdefault(count, 5) == 1
    stored = stash.setdefault(names, [])
    stored.append("x")
    assert stash[names] == ["x"]
    assert len(stash) == 2
    del stash[count]
    assert count not in stash
    assert names in stash
    with pytest.raises(KeyError):
        del stash[count]


def test_stash_keys_are_distinct_objects_and_stashes_do_not_share() -> None:
    first: StashKey[str] = StashKey()
    second: StashKey[str] = StashKey()
    a, b = Stash(), Stash()
    a[first] = "one"
    assert second not in a
    assert first not in b
    with pytest.raises(AttributeError):
        first.value = 1  # type: ignore[attr-defined]  # slotted: a key carries no state
    with pytest.raises(AttributeError):
        a.extra = 1  # type: ignore[attr-defined]


async def test_node_vpn_and_session_each_have_their_own_stash() -> None:
    key: StashKey[str] = StashKey()
    seen: dict[str, Any] = {}

    class Stashing:
        @hookimpl
        def meshbus_vpn_created(self, vpn: Vpn) -> None:
            vpn.stash[key] = f"vpn {vpn.name}"

        @hookimpl
        def meshbus_session_opened(self, session: Any) -> None:
            session.stash[key] = f"session {session.client_name}"
            seen["vpn"] = session.vpn.stash[key]

    async with Node(plugins=["direct", Stashing()]) as node:
        node.stash[key] = "node"
        async with node.connect(client_name="c1") as session:
            assert session.stash[key] == "session c1"
        assert seen["vpn"] == "vpn default"
        assert node.stash[key] == "node"
        assert node.create_vpn("other").stash[key] == "vpn other"
