"""Message VPNs, logins, profiles and the node lifecycle (SPEC 6)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from meshbus import (
    AccessDeniedError,
    AclProfile,
    AuthenticationError,
    ClientProfile,
    ClientUsername,
    ConfigurationError,
    Message,
    Node,
    Session,
    StateError,
)


def drain(session: Session) -> list[Message]:
    out = []
    while (message := session.receive_nowait()) is not None:
        out.append(message)
    return out


# --- VPN isolation -----------------------------------------------------------------------------


async def test_nothing_crosses_vpns(meshbus_node: Node) -> None:
    meshbus_node.create_vpn("blue")
    meshbus_node.create_vpn("green")
    # The same client name may be used once per VPN.
    blue = meshbus_node.connect("blue", client_name="app")
    green = meshbus_node.connect("green", client_name="app")
    default = meshbus_node.connect(client_name="app")
    for session in (blue, green, default):
        session.subscribe(">")
    blue.publish("prices/eur", b"blue")
    green.publish("prices/eur", b"green")
    assert [m.payload for m in drain(blue)] == [b"blue"]
    assert [m.payload for m in drain(green)] == [b"green"]
    assert drain(default) == []
    assert meshbus_node.vpn("blue").statistics().published == 1
    assert meshbus_node.vpn("default").statistics().published == 0
    assert blue.vpn is meshbus_node.vpn("blue")


async def test_vpns_have_their_own_users_and_profiles(meshbus_node: Node) -> None:
    tenant = meshbus_node.create_vpn("tenant")
    tenant.add_acl_profile(AclProfile("ro", publish_default="deny"))
    tenant.add_user("alice", acl_profile="ro")
    assert "ro" not in meshbus_node.vpn().acl_profiles
    assert "alice" not in meshbus_node.vpn().users
    with pytest.raises(AccessDeniedError):
        meshbus_node.connect("tenant", username="alice").publish("t")
    meshbus_node.connect(username="alice").publish("t")  # default VPN: default profiles


# --- creating and removing VPNs --------------------------------------------------------------


async def test_create_vpn_refuses_duplicates_and_bad_settings(meshbus_node: Node) -> None:
    meshbus_node.create_vpn("a")
    with pytest.raises(StateError):
        meshbus_node.create_vpn("a")
    with pytest.raises(StateError):
        meshbus_node.create_vpn("default")
    for bad in ("", "x/y", 5):
        with pytest.raises(ConfigurationError):
            meshbus_node.create_vpn(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="authentication"):
        meshbus_node.create_vpn("b", authentication="kerberos")
    assert sorted(meshbus_node.vpns) == ["a", "default"]
    with pytest.raises(StateError):
        meshbus_node.vpn("b")
    with pytest.raises(TypeError):
        meshbus_node.vpns["c"] = meshbus_node.vpn()  # type: ignore[index]


async def test_remove_vpn_closes_its_sessions(meshbus_node: Node) -> None:
    gone = meshbus_node.create_vpn("gone")
    waiting = meshbus_node.connect("gone")
    other = meshbus_node.connect("gone")
    kept = meshbus_node.connect()
    ended = anyio.Event()

    async def consume() -> None:
        async for _ in waiting:
            pass
        ended.set()

    with anyio.fail_after(2):
        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            await anyio.wait_all_tasks_blocked()
            meshbus_node.remove_vpn("gone")
            await ended.wait()
    assert waiting.closed
    assert other.closed
    assert not kept.closed
    assert gone.removed
    assert "gone" not in meshbus_node.vpns
    with pytest.raises(StateError):
        meshbus_node.vpn("gone")
    with pytest.raises(StateError):
        gone.open_session()
    with pytest.raises(AuthenticationError):
        meshbus_node.connect("gone")
    with pytest.raises(StateError):
        meshbus_node.remove_vpn("gone")
    # The name can be used again, for a fresh VPN.
    again = meshbus_node.create_vpn("gone")
    assert again is not gone
    assert again.sessions == {}


async def test_connect_to_an_unknown_vpn_is_an_authentication_error(meshbus_node: Node) -> None:
    with pytest.raises(AuthenticationError) as info:
        meshbus_node.connect("nowhere", username="bob")
    assert info.value.username == "bob"
    assert info.value.action == "connect"


# --- authentication "none" ---------------------------------------------------------------------


async def test_auth_none_unknown_user_gets_default_profiles_and_keeps_username(
    meshbus_node: Node,
) -> None:
    vpn = meshbus_node.vpn()
    vpn.add_client_profile(ClientProfile("default", egress_max_messages=7))
    session = meshbus_node.connect(username="stranger", password="ignored")
    assert session.username == "stranger"
    assert session.user.name == "default"
    assert session.client_profile.egress_max_messages == 7
    assert session.acl_profile is vpn.acl_profiles["default"]
    assert "stranger" not in vpn.users


async def test_auth_none_known_user_gets_its_profiles_whatever_the_password(
    meshbus_node: Node,
) -> None:
    vpn = meshbus_node.vpn()
    vpn.add_client_profile(ClientProfile("small", egress_max_messages=2))
    vpn.add_user("known", client_profile="small")
    session = meshbus_node.connect(username="known", password="anything")
    assert session.user is vpn.users["known"]
    assert session.client_profile.name == "small"


async def test_auth_none_disabled_users_are_refused(meshbus_node: Node) -> None:
    vpn = meshbus_node.vpn()
    vpn.add_user("off", enabled=False)
    with pytest.raises(AuthenticationError, match="login refused"):
        meshbus_node.connect(username="off")
    vpn.add_user("default", enabled=False)  # unknown names log in as 'default'
    with pytest.raises(AuthenticationError):
        meshbus_node.connect(username="stranger")
    assert vpn.statistics().login_failures == 2
    assert vpn.sessions == {}


# --- authentication "basic" --------------------------------------------------------------------


async def test_auth_basic(meshbus_node: Node) -> None:
    vpn = meshbus_node.create_vpn("secure", authentication="basic")
    vpn.add_acl_profile(AclProfile("ro", publish_default="deny"))
    user = vpn.add_user("alice", password="s3cret", acl_profile="ro")
    vpn.add_user("nopass")
    assert vpn.users["alice"] is user
    assert user.password_hash is not None
    assert "s3cret" not in user.password_hash

    refused: list[dict[str, Any]] = [
        {"username": "mallory", "password": "s3cret"},  # unknown user
        {"username": "alice", "password": "wrong"},
        {"username": "alice"},  # no password
        {"username": "nopass"},  # user without a password cannot log in
        {"username": "default"},  # nor can the built-in default user
    ]
    for i, login in enumerate(refused, start=1):
        with pytest.raises(AuthenticationError) as info:
            await meshbus_node.login("secure", **login)
        assert info.value.username == login["username"]
        assert info.value.why == "login refused"  # whatever the reason (SPEC 6)
        assert vpn.statistics().login_failures == i
    assert vpn.sessions == {}

    session = await meshbus_node.login("secure", username="alice", password="s3cret")
    assert session.user is user
    assert session.acl_profile.name == "ro"
    assert vpn.statistics().login_failures == len(refused)

    vpn.add_user("alice", password="s3cret", enabled=False)
    with pytest.raises(AuthenticationError, match="login refused"):
        await meshbus_node.login("secure", username="alice", password="s3cret")
    assert not session.closed  # replacing the user does not log out open sessions
    assert meshbus_node.statistics().login_failures == len(refused) + 1


async def test_a_plugin_opens_a_session_for_a_client_who_logged_in_before(
    meshbus_node: Node,
) -> None:
    # What an MQTT will that waited needs once its client is gone: no password, the
    # username's profiles as they are now, and no session for a username that went.
    vpn = meshbus_node.create_vpn("secure", authentication="basic")
    vpn.add_acl_profile(AclProfile("ro", publish_default="deny"))
    vpn.add_user("alice", password="s3cret", acl_profile="ro")
    session = vpn.open_session_for("alice", "device-7")
    assert (session.client_name, session.username) == ("device-7", "alice")
    assert session.acl_profile.name == "ro"
    with pytest.raises(AccessDeniedError):
        session.publish("status/device-7", b"offline")
    with pytest.raises(StateError, match="in use"):
        vpn.open_session_for("alice", "device-7")
    session.close()
    with pytest.raises(AuthenticationError):
        vpn.open_session_for("mallory")
    vpn.add_user("alice", password="s3cret", enabled=False)
    with pytest.raises(AuthenticationError):
        vpn.open_session_for("alice")
    # What a plugin's authentication resolved the login to serves where it is given.
    hooked = ClientUsername("hooked")
    assert vpn.open_session_for("hooked", user=hooked).user is hooked
    assert vpn.statistics().login_failures == 0  # none of this was a client's login
    # Under authentication "none" an unknown username is the default user's, as at login.
    assert meshbus_node.vpn().open_session_for("anyone").user.name == "default"


# --- identities --------------------------------------------------------------------------------


async def test_duplicate_client_names_are_refused(meshbus_node: Node) -> None:
    first = meshbus_node.connect(client_name="app")
    with pytest.raises(StateError):
        meshbus_node.connect(client_name="app")
    assert meshbus_node.vpn().sessions["app"] is first
    first.close()
    second = meshbus_node.connect(client_name="app")
    assert meshbus_node.vpn().sessions["app"] is second


async def test_generated_client_names_are_unique(meshbus_node: Node) -> None:
    names = {meshbus_node.connect().client_name for _ in range(5)}
    assert len(names) == 5


@pytest.mark.parametrize("bad", ["a/b", "a*", "a>", "#a", "", "x" * 190, "nul\x00"])
async def test_bad_usernames_and_client_names_are_refused(meshbus_node: Node, bad: str) -> None:
    vpn = meshbus_node.vpn()
    with pytest.raises(ConfigurationError):
        meshbus_node.connect(username=bad)
    with pytest.raises(ConfigurationError):
        meshbus_node.connect(client_name=bad)
    with pytest.raises(ConfigurationError):
        vpn.add_user(bad)
    assert vpn.sessions == {}
    assert list(vpn.users) == ["default"]


async def test_connect_default_deny_refuses_login(meshbus_node: Node) -> None:
    vpn = meshbus_node.vpn()
    vpn.add_acl_profile(AclProfile("locked", connect_default="deny"))
    vpn.add_user("locked", acl_profile="locked")
    with pytest.raises(AccessDeniedError) as info:
        meshbus_node.connect(username="locked", client_name="c")
    assert info.value.action == "connect"
    assert "c" not in vpn.sessions
    assert vpn.statistics().login_failures == 1


# --- profile validation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "settings",
    [
        {"egress_max_messages": 0},
        {"egress_max_messages": -1},
        {"egress_max_bytes": 0},
        {"egress_max_messages": "10"},
        {"egress_max_messages": 1.5},
        {"egress_max_messages": True},
        {"max_subscriptions": 0},
        {"max_wildcard_levels": 0},
        {"max_wildcard_levels": 2.5},
        {"max_eliding_topics": 0},
        {"eliding_delay_ms": -1},
        {"allow_shared_subscriptions": "yes"},
        {"eliding_enabled": 1},
        {"name": ""},
        {"name": 7},
    ],
)
def test_bad_client_profile_settings(settings: dict[str, Any]) -> None:
    settings = {"name": "p", **settings}
    with pytest.raises(ConfigurationError):
        ClientProfile(**settings)


def test_client_profile_limits_accept_the_smallest_valid_values() -> None:
    profile = ClientProfile("p", egress_max_messages=1, egress_max_bytes=1, eliding_delay_ms=0)
    assert (profile.egress_max_messages, profile.egress_max_bytes) == (1, 1)


@pytest.mark.parametrize(
    "settings",
    [
        {"connect_default": "maybe"},
        {"publish_default": "ALLOW"},
        {"subscribe_default": None},
        {"publish_exceptions": "a/b"},  # a str, not a list of filters
        {"publish_exceptions": 5},
        {"publish_exceptions": [""]},
        {"publish_exceptions": ["a\x00b"]},
        {"subscribe_exceptions": ["#reserved"]},
        {"subscribe_exceptions": ["#share/g/a"]},
        {"subscribe_exceptions": ["#noexport/a"]},
        {"subscribe_exceptions": [5]},
        {"name": ""},
        # Queue topics (#P2P/QUE/<queue>) are for publishing: nobody subscribes to them.
        {"subscribe_exceptions": ["#P2P/QUE/orders"]},
        # Other reserved topics cannot be published to at all.
        {"publish_exceptions": ["#P2P/TOPIC/a"]},
        {"publish_exceptions": ["#reserved/a"]},
        {"publish_exceptions": ["#share/g/a"]},
        {"publish_exceptions": ["#P2P/QUE/"]},  # no queue name
        {"publish_exceptions": ["#P2P/QUE/#share/g/q"]},
        {"publish_exceptions": ["#P2P/QUE/a\x00b"]},
    ],
)
def test_bad_acl_profile_settings(settings: dict[str, Any]) -> None:
    settings = {"name": "p", **settings}
    with pytest.raises(ConfigurationError):
        AclProfile(**settings)


def test_acl_profile_accepts_strings_and_wildcard_exceptions() -> None:
    profile = AclProfile(
        "p", publish_default="deny", publish_exceptions=["a/*", "b/>", "c*/$client-name"]
    )
    assert profile.publish_exceptions == ("a/*", "b/>", "c*/$client-name")
    assert profile.publish_default.value == "deny"


def test_acl_profile_accepts_queue_topics_as_publish_exceptions() -> None:
    queues = ["#P2P/QUE/orders", "#P2P/QUE/inbox-*", "#P2P/QUE/$client-username", "#P2P/QUE/>"]
    profile = AclProfile("p", publish_default="deny", publish_exceptions=queues)
    assert profile.publish_exceptions == tuple(queues)


@pytest.mark.parametrize(
    "settings",
    [
        {"client_profile": ""},
        {"enabled": "no"},
        {"subscription_manager": 1},
        {"management": "yes"},
        {"password_hash": "plain-text"},
        {"name": "a/b"},
    ],
)
def test_bad_client_username_settings(settings: dict[str, Any]) -> None:
    settings = {"name": "u", **settings}
    with pytest.raises(ConfigurationError):
        ClientUsername(**settings)


async def test_bad_configuration_changes_nothing(meshbus_node: Node) -> None:
    vpn = meshbus_node.vpn()
    with pytest.raises(ConfigurationError) as info:
        vpn.add_user("u", client_profile="nope", acl_profile="neither")
    assert len(info.value.problems) == 2
    with pytest.raises(ConfigurationError):
        vpn.add_user("u", enabled="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        vpn.add_user("u", password="")
    with pytest.raises(ConfigurationError):
        vpn.add_client_profile(AclProfile("x"))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        vpn.add_acl_profile(ClientProfile("x"))  # type: ignore[arg-type]
    assert list(vpn.users) == ["default"]
    assert list(vpn.client_profiles) == ["default"]
    assert list(vpn.acl_profiles) == ["default"]
    with pytest.raises(TypeError):
        vpn.users["u"] = ClientUsername("u")  # type: ignore[index]


async def test_open_sessions_keep_the_profile_they_logged_in_with(meshbus_node: Node) -> None:
    vpn = meshbus_node.vpn()
    vpn.add_client_profile(ClientProfile("p", egress_max_messages=5))
    vpn.add_user("u", client_profile="p")
    before = meshbus_node.connect(username="u")
    vpn.add_client_profile(ClientProfile("p", egress_max_messages=9))
    after = meshbus_node.connect(username="u")
    assert before.client_profile.egress_max_messages == 5
    assert after.client_profile.egress_max_messages == 9


# --- node lifecycle ----------------------------------------------------------------------------


def test_usernames_and_profiles_can_be_removed() -> None:
    vpn = Node().vpn()
    vpn.add_client_profile(ClientProfile("gold", max_subscriptions=3))
    vpn.add_acl_profile(AclProfile("narrow", subscribe_default="deny"))
    vpn.add_user("alice", client_profile="gold", acl_profile="narrow")
    vpn.add_user("default", enabled=False)
    vpn.add_client_profile(ClientProfile("default", max_subscriptions=1))

    with pytest.raises(ConfigurationError, match=r"still the profile of username\(s\) 'alice'"):
        vpn.remove_client_profile("gold")
    with pytest.raises(ConfigurationError, match="'alice'"):
        vpn.remove_acl_profile("narrow")
    assert vpn.remove_user("alice")
    assert not vpn.remove_user("alice")
    assert vpn.remove_client_profile("gold")
    assert vpn.remove_acl_profile("narrow")
    assert not vpn.remove_client_profile("gold")
    assert set(vpn.users) == {"default"}
    assert set(vpn.client_profiles) == {"default"}
    # "default" always exists: removing it puts the built-in one back.
    assert vpn.remove_user("default")
    assert vpn.remove_client_profile("default")
    assert vpn.users["default"] == ClientUsername("default")
    assert vpn.client_profiles["default"] == ClientProfile("default")


async def test_the_node_s_own_sessions_need_no_login(meshbus_node: Node) -> None:
    vpn = meshbus_node.create_vpn("locked", authentication="basic")
    vpn.add_acl_profile(AclProfile("default", publish_default="deny", subscribe_default="deny"))
    vpn.add_user("default", enabled=False)
    with pytest.raises(AuthenticationError):
        vpn.open_session(client_name="client")
    own = vpn.open_internal_session("link:x")
    assert own.username == "internal"
    own.subscribe(">")  # the configured 'default' ACL does not apply
    own.publish("a/b", b"")
    assert [m.topic for m in drain(own)] == ["a/b"]
    with pytest.raises(StateError, match="already in use"):
        vpn.open_internal_session("link:x")
    with pytest.raises(ConfigurationError):
        vpn.open_internal_session("bad/name")


async def test_connect_before_start_and_after_stop_is_a_state_error() -> None:
    node = Node(name="lifecycle")
    assert not node.running
    with pytest.raises(StateError, match="not running"):
        node.connect()
    with pytest.raises(StateError):
        node.task_group  # noqa: B018
    async with node:
        assert node.running
        node.connect().close()
    assert not node.running
    with pytest.raises(StateError):
        node.connect()


async def test_a_node_cannot_be_started_twice() -> None:
    node = Node()
    async with node:
        with pytest.raises(StateError):
            await node.__aenter__()
        assert node.running
    with pytest.raises(StateError):
        async with node:
            pass


async def test_stopping_the_node_closes_every_session() -> None:
    ended = anyio.Event()

    async def consume(session: Session) -> None:
        async for _ in session:
            pass
        ended.set()

    with anyio.fail_after(2):
        async with anyio.create_task_group() as tg:
            async with Node() as node:
                node.create_vpn("other")
                plain = node.connect()
                other = node.connect("other")
                handled = node.connect(on_message=lambda m: None)
                tg.start_soon(consume, plain)
                await anyio.wait_all_tasks_blocked()
            # the consumer, outside the node, sees the close
            await ended.wait()
    assert plain.closed
    assert other.closed
    assert handled.closed
    assert node.statistics().sessions == 0


async def test_stopping_the_node_ends_async_handler_pumps() -> None:
    seen: list[bytes] = []

    async def handler(message: Message) -> None:
        seen.append(message.payload)

    with anyio.fail_after(2):
        async with Node() as node:
            session = node.connect(on_message=handler)
            session.subscribe("t")
            session.publish("t", b"x")
            await anyio.wait_all_tasks_blocked()
    assert seen == [b"x"]
    assert session.closed


@pytest.mark.parametrize("name", ["", None, 3])
def test_node_name_must_be_a_non_empty_str(name: object) -> None:
    with pytest.raises(ConfigurationError):
        Node(name=name)  # type: ignore[arg-type]


def test_a_new_node_has_a_default_vpn_that_allows_everything() -> None:
    node = Node()
    vpn = node.vpn()
    assert vpn.name == "default"
    assert vpn.authentication == "none"
    assert list(node.vpns) == ["default"]
    acl = vpn.acl_profiles["default"]
    assert (acl.connect_default.value, acl.publish_default.value) == ("allow", "allow")
    assert (acl.subscribe_default.value, acl.publish_exceptions) == ("allow", ())


# --- node identity (SPEC 7, 8) ---------------------------------------------------------------


def test_a_node_without_data_dir_gets_a_new_id_each_time() -> None:
    first, second = Node(), Node()
    assert first.node_id != second.node_id
    assert first.cluster is None


def test_a_node_keeps_its_id_in_its_data_dir(tmp_path: Path) -> None:
    made = Node(data_dir=tmp_path / "data").node_id
    assert (tmp_path / "data" / "node-id").is_file()
    assert Node(data_dir=tmp_path / "data").node_id == made
    assert Node(data_dir=tmp_path / "other").node_id != made
    # Given explicitly, the id wins and the kept one is left alone.
    assert Node(data_dir=tmp_path / "data", node_id="edge-7").node_id == "edge-7"
    assert Node(data_dir=tmp_path / "data").node_id == made


def test_node_id_and_cluster_are_validated(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="node id"):
        Node(node_id="a/b")
    with pytest.raises(ConfigurationError, match="cluster name"):
        Node(cluster="")
    (tmp_path / "node-id").write_bytes(b"\xff garbage")
    with pytest.raises(ConfigurationError, match="does not hold a node id"):
        Node(data_dir=tmp_path)


async def test_statistics_name_the_node_and_its_cluster() -> None:
    async with Node(node_id="n1", cluster="east") as node:
        stats = node.statistics()
    assert (stats.node_id, stats.cluster) == ("n1", "east")


def test_origin_ids_increase_across_restarts() -> None:
    # A restarted node must not reuse the numbers of its messages: neighbours would
    # drop new messages as duplicates of old ones.
    first = Node(node_id="n")
    a = first.next_origin_id()
    b = first.next_origin_id()
    later = Node(node_id="n")
    assert a < b < later.next_origin_id()
