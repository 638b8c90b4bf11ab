"""Meta-tests: every hookspec is documented, and every hookspec is exercised by a test.

A recording plugin implements every hook; one scenario drives a node through
its whole life and checks each call and its arguments. The set of hooks that
fired is then compared with the set of hookspecs, so a new hookspec fails here
until the recorder implements it and the scenario makes it fire.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import pytest

from meshbus import (
    AccessDeniedError,
    AuthenticationError,
    ClientProfile,
    ClientUsername,
    ConfigSection,
    ConfigSections,
    Envelope,
    Link,
    LinkPipeline,
    LinkState,
    Node,
    Pipeline,
    PluginManager,
    Session,
    Subscription,
    Vpn,
    hookimpl,
    hookspecs,
)
from meshbus.plugins.guaranteed import _hookspecs as guaranteed_hookspecs


def _hookspecs(module: Any = hookspecs) -> dict[str, Callable[..., Any]]:
    """The hook specifications, found the way pluggy finds them (by their marker)."""
    return {
        name: fn
        for name, fn in vars(module).items()
        if inspect.isfunction(fn) and hasattr(fn, "meshbus_spec")
    }


HOOKSPECS = _hookspecs()
# Hooks that plugins specify themselves (meshbus_add_hookspecs): documented the same way.
PLUGIN_HOOKSPECS = _hookspecs(guaranteed_hookspecs)


def test_hookspecs_are_found() -> None:
    # Guards the meta-tests below against passing vacuously.
    assert len(HOOKSPECS) >= 19
    assert set(PLUGIN_HOOKSPECS) == {"meshbus_spool_store"}
    assert all(name.startswith("meshbus_") for name in HOOKSPECS)
    named = {n for n in vars(hookspecs) if n.startswith("meshbus_")}
    assert named == set(HOOKSPECS), "a meshbus_* function without @hookspec"


@pytest.mark.parametrize("name", sorted({**HOOKSPECS, **PLUGIN_HOOKSPECS}))
def test_hookspec_documents_every_parameter(name: str) -> None:
    spec = {**HOOKSPECS, **PLUGIN_HOOKSPECS}[name]
    doc = inspect.getdoc(spec)
    assert doc, f"{name} has no docstring"
    summary = doc.splitlines()[0]
    assert summary.endswith("."), f"{name}: the first line should be a sentence"
    params = list(inspect.signature(spec).parameters)
    documented = re.findall(r"^:param (\w+):", doc, flags=re.MULTILINE)
    assert documented == params, f"{name}: document each of {params} with ':param name:'"
    for param in params:
        text = re.search(rf"^:param {param}:(.*)$", doc, flags=re.MULTILINE)
        assert text is not None
        assert text.group(1).strip(), f"{name}: {param} is not described"


# --- the recorder ------------------------------------------------------------------------------


class Recorder:
    """Implements every hook and records each call with its arguments."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.history: list[str] = []  # every hook that fired, never cleared
        self.alice = ClientUsername("alice")

    def _record(self, hook: str, **kwargs: Any) -> None:
        self.calls.append((hook, kwargs))
        if hook.startswith("meshbus_"):
            self.history.append(hook)

    def take(self) -> list[tuple[str, dict[str, Any]]]:
        """The calls so far, clearing the record."""
        calls, self.calls = self.calls, []
        return calls

    # plugin registration
    @hookimpl
    def meshbus_add_hookspecs(self, plugins: PluginManager) -> None:
        self._record("meshbus_add_hookspecs", plugins=plugins)

    @hookimpl
    def meshbus_config_sections(self, sections: ConfigSections) -> None:
        self._record("meshbus_config_sections", sections=sections)
        sections.add(ConfigSection("recorded", "node", lambda reader, raw, path, context: raw))

    # node lifecycle
    @hookimpl
    def meshbus_configure(self, node: Node) -> None:
        self._record("meshbus_configure", node=node)

    @hookimpl
    def meshbus_lifespan(self, node: Node) -> AbstractAsyncContextManager[None]:
        self._record("meshbus_lifespan", node=node)
        return self._span(node)

    @hookimpl
    def meshbus_listening(self, node: Node) -> list[str] | None:
        self._record("meshbus_listening", node=node)
        return ["recorded://here"]

    @asynccontextmanager
    async def _span(self, node: Node) -> AsyncIterator[None]:
        self._record("lifespan enter", running=node.running)
        yield
        self._record("lifespan exit", sessions=node.statistics().sessions)

    # The guaranteed plugin's own hook: optional, so the recorder also joins nodes
    # without that plugin (where nothing specifies it).
    @hookimpl(optionalhook=True)
    def meshbus_spool_store(self, node: Node) -> None:
        self._record("meshbus_spool_store", node=node)  # None: the plugin's default store

    @hookimpl
    def meshbus_unconfigure(self, node: Node) -> None:
        self._record("meshbus_unconfigure", node=node, running=node.running)

    # VPNs
    @hookimpl
    def meshbus_vpn_created(self, vpn: Vpn) -> None:
        self._record("meshbus_vpn_created", vpn=vpn)

    @hookimpl
    def meshbus_vpn_pipeline(self, vpn: Vpn, pipeline: Pipeline) -> None:
        self._record("meshbus_vpn_pipeline", vpn=vpn, pipeline=pipeline)

    @hookimpl
    def meshbus_vpn_removed(self, vpn: Vpn) -> None:
        self._record("meshbus_vpn_removed", vpn=vpn, sessions=len(vpn.sessions))

    # sessions
    @hookimpl
    def meshbus_authenticate(
        self, vpn: Vpn, username: str, password: str | None
    ) -> ClientUsername | None:
        self._record("meshbus_authenticate", vpn=vpn, username=username, password=password)
        if username == "alice":
            return self.alice
        if username == "mallory":
            raise AuthenticationError(username, "banned by the recorder")
        return None

    @hookimpl
    def meshbus_session_opened(self, session: Session) -> None:
        self._record("meshbus_session_opened", session=session, closed=session.closed)

    @hookimpl
    def meshbus_session_closed(self, session: Session) -> None:
        self._record("meshbus_session_closed", session=session, subscriptions=session.subscriptions)

    # subscriptions: return None so the direct plugin owns them
    @hookimpl
    def meshbus_subscribe(self, session: Session, subscription: Subscription) -> None:
        self._record("meshbus_subscribe", session=session, subscription=subscription)

    @hookimpl
    def meshbus_unsubscribe(self, session: Session, subscription: Subscription) -> None:
        self._record("meshbus_unsubscribe", session=session, subscription=subscription)

    @hookimpl
    def meshbus_subscription_added(self, session: Session, subscription: Subscription) -> None:
        self._record("meshbus_subscription_added", session=session, subscription=subscription)

    @hookimpl
    def meshbus_subscription_removed(self, session: Session, subscription: Subscription) -> None:
        self._record("meshbus_subscription_removed", session=session, subscription=subscription)

    # endpoints
    @hookimpl
    def meshbus_endpoint_interest(self, vpn: Vpn, endpoint: str, filters: tuple[str, ...]) -> None:
        self._record("meshbus_endpoint_interest", vpn=vpn, endpoint=endpoint, filters=filters)

    # links
    @hookimpl
    def meshbus_accept_link(
        self,
        vpn: Vpn,
        user: ClientUsername,
        kind: str,
        peer_node: str,
        peer_cluster: str | None,
        name: str,
    ) -> None:
        self._record(
            "meshbus_accept_link",
            vpn=vpn,
            user=user,
            kind=kind,
            peer_node=peer_node,
            peer_cluster=peer_cluster,
            name=name,
        )
        if peer_node == "intruder":
            raise AccessDeniedError(user.name, "connect", why="not in this cluster")

    @hookimpl
    def meshbus_vpn_statistics(self, vpn: Vpn) -> dict[str, Any] | None:
        self._record("meshbus_vpn_statistics", vpn=vpn)
        return {"recorder": {"links": len(vpn.links)}}

    @hookimpl
    def meshbus_link_pipeline(self, link: Link, pipeline: LinkPipeline) -> None:
        self._record("meshbus_link_pipeline", link=link, egress=pipeline.egress)
        pipeline.add_egress("recorder", lambda envelope: envelope.message.topic != "secret")

    @hookimpl
    def meshbus_link_opened(self, link: Link) -> None:
        self._record("meshbus_link_opened", link=link, state=link.state)

    @hookimpl
    def meshbus_link_closed(self, link: Link, reason: str) -> None:
        self._record("meshbus_link_closed", link=link, reason=reason, interest=link.interest)


class _ListLink(Link):
    """A link that keeps what it is given to send."""

    def __init__(self, vpn: Vpn, name: str) -> None:
        super().__init__(vpn, name, "test")
        self.sent: list[str] = []

    def send(self, envelope: Envelope) -> bool:
        self.sent.append(envelope.message.topic)
        return True


def test_recorder_implements_every_hookspec_with_its_signature() -> None:
    for name, spec in {**HOOKSPECS, **PLUGIN_HOOKSPECS}.items():
        impl = getattr(Recorder, name, None)
        assert impl is not None, f"Recorder does not implement {name}"
        spec_params = list(inspect.signature(spec).parameters)
        impl_params = list(inspect.signature(impl).parameters)[1:]  # minus self
        assert impl_params == spec_params, name


# --- the scenario -----------------------------------------------------------------------------


def _sub(text: str) -> Subscription:
    return Subscription(text=text, filter=text)


async def test_every_hook_fires_with_the_right_arguments() -> None:
    rec = Recorder()
    node = Node(name="meta", plugins=["direct", rec])
    default = node.vpn()
    calls = rec.take()
    assert [hook for hook, _ in calls] == [
        "meshbus_add_hookspecs",
        "meshbus_configure",
        "meshbus_vpn_created",
        "meshbus_vpn_pipeline",
    ]
    assert calls[0][1] == {"plugins": node.plugins}
    assert calls[1][1] == {"node": node}
    assert calls[2][1] == {"vpn": default}
    assert calls[3][1]["vpn"] is default
    assert isinstance(calls[3][1]["pipeline"], Pipeline)

    # Asked for when a configuration file is read (before any node runs).
    sections = node.plugins.config_sections()
    assert rec.take() == [("meshbus_config_sections", {"sections": sections})]
    assert sections.names("node") == ("recorded",)

    async with node:
        calls = rec.take()
        assert calls == [
            ("meshbus_lifespan", {"node": node}),
            ("lifespan enter", {"running": calls[1][1]["running"]}),
        ]

        # Asked by `meshbus run` once the node serves: each plugin's listeners.
        assert node.plugins.listening(node) == ["recorded://here"]
        assert rec.take() == [("meshbus_listening", {"node": node})]

        tenant = node.create_vpn("tenant")
        calls = rec.take()
        assert [hook for hook, _ in calls] == ["meshbus_vpn_created", "meshbus_vpn_pipeline"]
        assert calls[0][1]["vpn"] is tenant
        assert calls[1][1]["vpn"] is tenant
        assert tenant.routers == ("direct", "links")

        # The hook authenticates alice, although the VPN has no such user.
        alice = node.connect("tenant", username="alice", password="pw", client_name="a")
        assert alice.user is rec.alice
        assert rec.take() == [
            (
                "meshbus_authenticate",
                {"vpn": tenant, "username": "alice", "password": "pw"},
            ),
            ("meshbus_session_opened", {"session": alice, "closed": False}),
        ]

        # The hook refuses mallory: no session, and the failure is counted.
        with pytest.raises(AuthenticationError, match="banned by the recorder"):
            node.connect("tenant", username="mallory", client_name="m")
        assert rec.take() == [
            ("meshbus_authenticate", {"vpn": tenant, "username": "mallory", "password": None}),
        ]
        assert "m" not in tenant.sessions
        assert tenant.statistics().login_failures == 1

        alice.subscribe("orders/>")
        assert rec.take() == [
            ("meshbus_subscribe", {"session": alice, "subscription": _sub("orders/>")}),
            ("meshbus_subscription_added", {"session": alice, "subscription": _sub("orders/>")}),
        ]

        # The data plane goes through no hook at all.
        alice.publish("orders/1", b"x")
        message = alice.receive_nowait()
        assert message is not None
        assert message.topic == "orders/1"
        assert rec.take() == []

        alice.unsubscribe("orders/>")
        assert rec.take() == [
            ("meshbus_unsubscribe", {"session": alice, "subscription": _sub("orders/>")}),
            (
                "meshbus_subscription_removed",
                {"session": alice, "subscription": _sub("orders/>")},
            ),
        ]
        alice.unsubscribe("orders/>")  # not held: a no-op, no hook
        assert rec.take() == []

        # Closing removes what is left (each subscription reported), then the session.
        alice.subscribe("invoices")
        rec.take()
        alice.close()
        assert rec.take() == [
            ("meshbus_unsubscribe", {"session": alice, "subscription": _sub("invoices")}),
            (
                "meshbus_subscription_removed",
                {"session": alice, "subscription": _sub("invoices")},
            ),
            ("meshbus_session_closed", {"session": alice, "subscriptions": ()}),
        ]
        alice.close()  # idempotent: no second notification
        assert rec.take() == []

        # A username the hook leaves alone falls through to the VPN's own authentication.
        bob = node.connect("tenant", username="bob", client_name="b")
        assert bob.user.name == "default"  # authentication "none": unknown users are default
        assert rec.take() == [
            ("meshbus_authenticate", {"vpn": tenant, "username": "bob", "password": None}),
            ("meshbus_session_opened", {"session": bob, "closed": False}),
        ]

        # Links: a peer asking for one is accepted (the profile allows bridges) or refused.
        tenant.add_client_profile(ClientProfile("bridges", allow_bridge_connections=True))
        peer = tenant.add_user("peer", client_profile="bridges")
        tenant.accept_link(peer, "bridge", "node-b", "eu", "to-tenant")
        assert rec.take() == [
            (
                "meshbus_accept_link",
                {
                    "vpn": tenant,
                    "user": peer,
                    "kind": "bridge",
                    "peer_node": "node-b",
                    "peer_cluster": "eu",
                    "name": "to-tenant",
                },
            )
        ]
        with pytest.raises(AccessDeniedError, match="not in this cluster"):
            tenant.accept_link(peer, "bridge", "intruder")
        rec.take()
        with pytest.raises(AccessDeniedError, match="does not allow bridge connections"):
            tenant.accept_link(tenant.users["default"], "bridge", "node-b")
        assert rec.take() == []  # refused by the core: plugins are not asked

        link = _ListLink(tenant, "to-b")
        tenant.links.attach(link)
        assert rec.take() == [("meshbus_link_pipeline", {"link": link, "egress": ()})]
        link.opened("node-b", "east")
        assert rec.take() == [("meshbus_link_opened", {"link": link, "state": LinkState.SYNCING})]
        link.add_interest("news/>")
        link.add_interest("secret")
        publisher = node.connect("tenant", client_name="p")
        rec.take()  # the login
        publisher.publish("news/1", b"x")
        publisher.publish("secret", b"x")  # the recorder's stage keeps it off the link
        assert link.sent == ["news/1"]  # through the link router and stages, no hook
        assert rec.take() == []
        link.closed("peer went away")
        assert rec.take() == [
            ("meshbus_link_closed", {"link": link, "reason": "peer went away", "interest": ()})
        ]
        # Asked only when statistics are: each plugin's figures, merged.
        assert node.plugins.vpn_statistics(tenant) == {"recorder": {"links": 1}}
        assert rec.take() == [("meshbus_vpn_statistics", {"vpn": tenant})]
        publisher.close()
        rec.take()

        node.remove_vpn("tenant")
        assert rec.take() == [
            ("meshbus_session_closed", {"session": bob, "subscriptions": ()}),
            ("meshbus_vpn_removed", {"vpn": tenant, "sessions": 0}),
        ]

    calls = rec.take()
    assert [hook for hook, _ in calls][-2:] == ["lifespan exit", "meshbus_unconfigure"]
    assert calls[-1][1] == {"node": node, "running": False}

    # The spool-store hook fires when the guaranteed plugin starts a node.
    store_node = Node(plugins=["guaranteed", rec])
    rec.take()
    async with store_node:
        calls = rec.take()
        assert calls[:3] == [
            ("meshbus_lifespan", {"node": store_node}),
            ("meshbus_spool_store", {"node": store_node}),
            ("lifespan enter", {"running": True}),
        ]
        service: Any = store_node.guaranteed
        queue = service.create_queue("q", subscriptions=["a/>"])  # the default store (memory)
        service.add_subscription("q", "b")
        await service.delete_queue("q")
        default = store_node.vpn()
        assert [args for hook, args in rec.take() if hook == "meshbus_endpoint_interest"] == [
            # A queue also attracts what is sent to it by name: its own topic.
            {"vpn": default, "endpoint": queue.endpoint, "filters": ("#P2P/QUE/q", "a/>")},
            {"vpn": default, "endpoint": queue.endpoint, "filters": ("#P2P/QUE/q", "a/>", "b")},
            {"vpn": default, "endpoint": queue.endpoint, "filters": ()},
        ]

    # Every call above was compared in full, so each hook that fired was checked.
    fired = set(rec.history)
    every = set(HOOKSPECS) | set(PLUGIN_HOOKSPECS)
    assert fired == every, (
        f"hookspecs never exercised: {sorted(every - fired)}; "
        f"recorded but not specified: {sorted(fired - every)}"
    )


async def test_vpn_removed_fires_for_every_vpn_when_the_node_stops() -> None:
    rec = Recorder()
    async with Node(plugins=["direct", rec]) as node:
        tenant = node.create_vpn("tenant")
        session = node.connect("tenant")
        rec.take()
    calls = [(hook, args) for hook, args in rec.take() if hook.startswith("meshbus_")]
    removed = [args["vpn"] for hook, args in calls if hook == "meshbus_vpn_removed"]
    assert sorted(vpn.name for vpn in removed) == ["default", "tenant"]
    # After the VPN's sessions closed, as for Node.remove_vpn.
    closed_at = calls.index(("meshbus_session_closed", {"session": session, "subscriptions": ()}))
    assert closed_at < calls.index(("meshbus_vpn_removed", {"vpn": tenant, "sessions": 0}))
