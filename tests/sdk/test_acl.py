"""ACL profiles, subscription managers and password hashing (SPEC 2 and 6)."""

from __future__ import annotations

import pytest

from meshbus import (
    AccessDeniedError,
    AclProfile,
    ClientProfile,
    ClientUsername,
    ConfigurationError,
    InvalidTopicError,
    LimitExceededError,
    Message,
    Node,
    Session,
    StateError,
    hash_password,
    verify_password,
)


def drain(session: Session) -> list[Message]:
    out = []
    while (message := session.receive_nowait()) is not None:
        out.append(message)
    return out


def login_with(node: Node, profile: AclProfile, username: str = "user", **kw: object) -> Session:
    vpn = node.vpn()
    vpn.add_acl_profile(profile)
    vpn.add_user(username, acl_profile=profile.name)
    return node.connect(username=username, **kw)  # type: ignore[arg-type]


def may_publish(session: Session, topic: str) -> bool:
    try:
        session.publish(topic)
    except AccessDeniedError as exc:
        denied = exc
    else:
        return True
    assert (denied.action, denied.topic, denied.username) == ("publish", topic, session.username)
    return False


def may_subscribe(session: Session, subscription: str) -> bool:
    try:
        session.subscribe(subscription)
    except AccessDeniedError as exc:
        denied = exc
    else:
        assert subscription in session.subscriptions
        session.unsubscribe(subscription)
        return True
    assert (denied.action, denied.topic) == ("subscribe", subscription)
    assert subscription not in session.subscriptions
    return False


# --- publish ------------------------------------------------------------------------------------


async def test_publish_default_allow_with_exceptions(meshbus_node: Node) -> None:
    session = login_with(
        meshbus_node,
        AclProfile("p", publish_default="allow", publish_exceptions=["secret/>", "*/admin", "ab*"]),
    )
    allowed = ["public", "secret", "a/admin/x", "a", "b", "public/x"]
    denied = ["secret/x", "secret/x/y", "x/admin", "/admin", "ab", "abc"]
    assert [t for t in allowed + denied if may_publish(session, t)] == allowed
    assert session.statistics().denied == len(denied)


async def test_publish_default_deny_with_exceptions(meshbus_node: Node) -> None:
    session = login_with(
        meshbus_node,
        AclProfile("p", publish_default="deny", publish_exceptions=["out/*", "log/>"]),
    )
    allowed = ["out/a", "out/", "log/x", "log/x/y"]
    denied = ["out", "out/a/b", "log", "other", "Out/a"]
    assert [t for t in allowed + denied if may_publish(session, t)] == allowed


async def test_denied_publish_delivers_nothing_and_is_counted_every_time(
    meshbus_node: Node,
) -> None:
    sub = meshbus_node.connect()
    sub.subscribe(">")
    session = login_with(meshbus_node, AclProfile("p", publish_exceptions=["no"]))
    for _ in range(3):
        with pytest.raises(AccessDeniedError):
            session.publish("no", b"x")
    session.publish("yes", b"y")
    assert [m.topic for m in drain(sub)] == ["yes"]
    stats = session.statistics()
    assert (stats.published, stats.denied) == (1, 3)
    vpn_stats = meshbus_node.vpn().statistics()
    assert (vpn_stats.published, vpn_stats.denied, vpn_stats.unmatched) == (1, 3, 0)


async def test_an_allowed_topic_stays_allowed_and_a_denied_one_denied(meshbus_node: Node) -> None:
    # Decisions are cached per topic: the cache must not mix them up.
    session = login_with(meshbus_node, AclProfile("p", publish_exceptions=["a/1"]))
    for _ in range(3):
        assert may_publish(session, "a/2")
        assert not may_publish(session, "a/1")


# --- subscribe ----------------------------------------------------------------------------------


async def test_subscribe_default_allow_denies_filters_overlapping_an_exception(
    meshbus_node: Node,
) -> None:
    session = login_with(
        meshbus_node,
        AclProfile("p", subscribe_exceptions=["secret/>", "x/*/private"]),
    )
    allowed = ["public/>", "secret", "x/a/public", "x/>/y", "*", "secre", "x/a"]
    denied = [">", "secret/a", "secret/*", "secret/>", "*/a", "s*/a", "x/a/private", "x/*/*"]
    denied += ["x/>", "#noexport/secret/a", "#share/g/secret/a"]
    assert [f for f in allowed + denied if may_subscribe(session, f)] == allowed
    assert session.subscriptions == ()
    assert session.statistics().denied == len(denied)


async def test_subscribe_default_deny_allows_only_filters_covered_by_an_exception(
    meshbus_node: Node,
) -> None:
    session = login_with(
        meshbus_node,
        AclProfile("p", subscribe_default="deny", subscribe_exceptions=["public/>", "dev/*/log"]),
    )
    allowed = ["public/a", "public/a/b", "public/*", "public/>", "public/ab*", "dev/x/log"]
    allowed += ["dev/*/log", "dev/ab*/log", "#noexport/public/a"]
    denied = [">", "public", "*/a", "p*/a", "dev/x", "dev/>", "dev/x/log/y", "*"]
    assert [f for f in allowed + denied if may_subscribe(session, f)] == allowed


async def test_denied_subscribe_changes_nothing(meshbus_node: Node) -> None:
    session = login_with(
        meshbus_node, AclProfile("p", subscribe_default="deny", subscribe_exceptions=["ok"])
    )
    session.subscribe("ok")
    with pytest.raises(AccessDeniedError):
        session.subscribe("forbidden")
    assert session.subscriptions == ("ok",)
    pub = meshbus_node.connect()
    pub.publish("forbidden", b"x")
    pub.publish("ok", b"y")
    assert [m.topic for m in drain(session)] == ["ok"]
    assert meshbus_node.vpn().statistics().unmatched == 1


async def test_an_invalid_filter_is_a_topic_error_before_the_acl(meshbus_node: Node) -> None:
    session = login_with(meshbus_node, AclProfile("p", subscribe_default="deny"))
    with pytest.raises(InvalidTopicError):
        session.subscribe("#bad")
    with pytest.raises(InvalidTopicError):
        session.publish("#bad")
    assert session.statistics().denied == 0


# --- substitution -------------------------------------------------------------------------------


async def test_client_username_and_client_name_are_substituted(meshbus_node: Node) -> None:
    profile = AclProfile(
        "own",
        publish_default="deny",
        publish_exceptions=["users/$client-username/>", "clients/$client-name"],
        subscribe_default="deny",
        subscribe_exceptions=["inbox/$client-username/$client-name/>"],
    )
    alice = login_with(meshbus_node, profile, "alice", client_name="phone")
    bob = meshbus_node.connect(username="bob", client_name="laptop")  # auth none: default ACL
    assert may_publish(alice, "users/alice/x")
    assert may_publish(alice, "clients/phone")
    assert not may_publish(alice, "users/bob/x")
    assert not may_publish(alice, "clients/laptop")
    assert not may_publish(alice, "users/$client-username/x")
    assert may_subscribe(alice, "inbox/alice/phone/>")
    assert not may_subscribe(alice, "inbox/alice/laptop/x")
    assert not may_subscribe(alice, "inbox/alice/*/x")
    assert may_publish(bob, "users/alice/x")  # bob's profile has no exceptions


async def test_substitution_applies_the_unknown_username_under_auth_none(
    meshbus_node: Node,
) -> None:
    vpn = meshbus_node.vpn()
    vpn.add_acl_profile(
        AclProfile("default", publish_default="deny", publish_exceptions=["u/$client-username"])
    )
    carol = meshbus_node.connect(username="carol")
    assert may_publish(carol, "u/carol")
    assert not may_publish(carol, "u/default")


async def test_substituted_values_are_not_substituted_again(meshbus_node: Node) -> None:
    profile = AclProfile(
        "own", publish_default="deny", publish_exceptions=["users/$client-username/>"]
    )
    # A username may contain '$': it is a literal, not a variable of its own.
    odd = login_with(meshbus_node, profile, "$client-name", client_name="alice")
    assert not may_publish(odd, "users/alice/x")
    assert may_publish(odd, "users/$client-name/x")


# --- connect ------------------------------------------------------------------------------------


async def test_connect_default_deny(meshbus_node: Node) -> None:
    vpn = meshbus_node.vpn()
    vpn.add_acl_profile(AclProfile("nobody", connect_default="deny"))
    vpn.add_user("blocked", acl_profile="nobody")
    with pytest.raises(AccessDeniedError) as info:
        meshbus_node.connect(username="blocked")
    assert (info.value.action, info.value.username) == ("connect", "blocked")
    assert vpn.statistics().login_failures == 1
    assert meshbus_node.connect(username="someone-else").username == "someone-else"


# --- subscription managers ----------------------------------------------------------------------


def add_manager(node: Node, acl: AclProfile | None = None) -> Session:
    vpn = node.vpn()
    if acl is not None:
        vpn.add_acl_profile(acl)
    vpn.add_user("manager", subscription_manager=True, acl_profile=acl.name if acl else "default")
    return node.connect(username="manager", client_name="manager")


async def test_manager_subscriptions_behave_like_the_targets_own(meshbus_node: Node) -> None:
    manager = add_manager(meshbus_node)
    worker = meshbus_node.connect(client_name="worker")
    manager.subscribe_for("worker", "jobs/>")
    assert worker.subscriptions == ("jobs/>",)
    assert manager.subscriptions == ()
    pub = meshbus_node.connect()
    pub.publish("jobs/1", b"x")
    assert [m.topic for m in drain(worker)] == ["jobs/1"]
    assert drain(manager) == []
    worker.unsubscribe("jobs/>")  # the target may remove it itself
    pub.publish("jobs/2", b"x")
    assert drain(worker) == []


async def test_manager_unsubscribe_for(meshbus_node: Node) -> None:
    manager = add_manager(meshbus_node)
    worker = meshbus_node.connect(client_name="worker")
    worker.subscribe("own")
    manager.subscribe_for("worker", "added")
    manager.unsubscribe_for("worker", "own")
    manager.unsubscribe_for("worker", "never-held")
    assert worker.subscriptions == ("added",)


async def test_closing_the_manager_leaves_its_subscriptions_in_place(meshbus_node: Node) -> None:
    manager = add_manager(meshbus_node)
    worker = meshbus_node.connect(client_name="worker")
    manager.subscribe_for("worker", "jobs/>")
    manager.close()
    meshbus_node.connect().publish("jobs/1", b"x")
    assert [m.topic for m in drain(worker)] == ["jobs/1"]
    with pytest.raises(StateError):
        manager.subscribe_for("worker", "more")


async def test_manager_subscriptions_go_when_the_target_closes(meshbus_node: Node) -> None:
    manager = add_manager(meshbus_node)
    worker = meshbus_node.connect(client_name="worker")
    manager.subscribe_for("worker", "jobs/>")
    worker.close()
    with pytest.raises(StateError):
        manager.subscribe_for("worker", "jobs/>")  # no such open session now
    again = meshbus_node.connect(client_name="worker")
    assert again.subscriptions == ()
    meshbus_node.connect().publish("jobs/1", b"x")
    assert drain(again) == []
    assert meshbus_node.vpn().statistics().unmatched == 1


async def test_the_managers_acl_applies_not_the_targets(meshbus_node: Node) -> None:
    manager = add_manager(
        meshbus_node,
        AclProfile("mgr", subscribe_default="deny", subscribe_exceptions=["jobs/>"]),
    )
    vpn = meshbus_node.vpn()
    vpn.add_acl_profile(
        AclProfile("worker", subscribe_default="deny", subscribe_exceptions=["private/>"])
    )
    vpn.add_user("worker", acl_profile="worker")
    worker = meshbus_node.connect(username="worker", client_name="worker")
    # The target may not subscribe to jobs/> itself, but the manager may do it for it ...
    with pytest.raises(AccessDeniedError):
        worker.subscribe("jobs/>")
    manager.subscribe_for("worker", "jobs/>")
    # ... and the manager may not add what it is denied, even if the target is allowed.
    with pytest.raises(AccessDeniedError) as info:
        manager.subscribe_for("worker", "private/x")
    assert info.value.username == "manager"
    assert worker.subscriptions == ("jobs/>",)
    assert (manager.statistics().denied, worker.statistics().denied) == (1, 1)


async def test_the_targets_limits_apply(meshbus_node: Node) -> None:
    manager = add_manager(meshbus_node)
    vpn = meshbus_node.vpn()
    vpn.add_client_profile(ClientProfile("one", max_subscriptions=1))
    vpn.add_user("worker", client_profile="one")
    meshbus_node.connect(username="worker", client_name="worker")
    manager.subscribe_for("worker", "a")
    with pytest.raises(LimitExceededError):
        manager.subscribe_for("worker", "b")
    with pytest.raises(InvalidTopicError):
        manager.subscribe_for("worker", "#bad")
    assert vpn.sessions["worker"].subscriptions == ("a",)


async def test_the_targets_wildcard_limit_applies(meshbus_node: Node) -> None:
    manager = add_manager(meshbus_node)
    vpn = meshbus_node.vpn()
    vpn.add_client_profile(ClientProfile("small", max_wildcard_levels=2))
    vpn.add_user("worker", client_profile="small")
    meshbus_node.connect(username="worker", client_name="worker")
    manager.subscribe_for("worker", "a/*")
    with pytest.raises(LimitExceededError) as info:
        manager.subscribe_for("worker", "b*")
    assert info.value.limit == 2
    manager.subscribe("b/*/>")  # the manager's own limit is the default one
    assert vpn.sessions["worker"].subscriptions == ("a/*",)


async def test_non_managers_are_refused(meshbus_node: Node) -> None:
    plain = meshbus_node.connect(client_name="plain")
    worker = meshbus_node.connect(client_name="worker")
    worker.subscribe("mine")
    with pytest.raises(AccessDeniedError):
        plain.subscribe_for("worker", "jobs/>")
    with pytest.raises(AccessDeniedError):
        plain.unsubscribe_for("worker", "mine")
    assert worker.subscriptions == ("mine",)
    assert plain.statistics().denied == 2


async def test_manager_target_must_be_an_open_session_of_the_same_vpn(
    meshbus_node: Node,
) -> None:
    manager = add_manager(meshbus_node)
    meshbus_node.create_vpn("other")
    elsewhere = meshbus_node.connect("other", client_name="elsewhere")
    with pytest.raises(StateError):
        manager.subscribe_for("nobody", "a")
    with pytest.raises(StateError):
        manager.subscribe_for("elsewhere", "a")
    with pytest.raises(StateError):
        manager.unsubscribe_for("nobody", "a")
    assert elsewhere.subscriptions == ()


# --- passwords (sync: hashing costs tens of milliseconds) ---------------------------------------


def test_passwords_are_hashed_salted_and_verified() -> None:
    first = hash_password("correct horse")
    second = hash_password("correct horse")
    assert first.startswith("scrypt$")
    assert "correct horse" not in first
    assert first != second  # salted
    assert verify_password("correct horse", first)
    assert verify_password("correct horse", second)
    assert not verify_password("correct hors", first)
    assert not verify_password("", first)
    for garbage in ("", "scrypt$", "bcrypt$1$2$3$00$00", "scrypt$x$8$1$00$00", first + "$"):
        assert not verify_password("correct horse", garbage)


@pytest.mark.parametrize("bad", ["", None, b"bytes"])
def test_hash_password_refuses_non_passwords(bad: object) -> None:
    with pytest.raises(ConfigurationError):
        hash_password(bad)  # type: ignore[arg-type]


def test_add_user_stores_only_the_hash() -> None:
    vpn = Node().vpn()
    user = vpn.add_user("u", password="p4ss")
    assert user.password_hash is not None
    assert user.password_hash != "p4ss"
    assert "p4ss" not in repr(user)
    assert verify_password("p4ss", user.password_hash)
    assert vpn.users["u"] is user
    assert vpn.add_user("v").password_hash is None
    hashed = vpn.add_user("h", password_hash=user.password_hash)
    assert hashed.password_hash == user.password_hash
    with pytest.raises(ConfigurationError, match="not both"):
        vpn.add_user("x", password="p4ss", password_hash=user.password_hash)
    with pytest.raises(ConfigurationError):
        vpn.add_user("y", password_hash="p4ss")  # not a hash
    assert "x" not in vpn.users
    with pytest.raises(ConfigurationError):
        ClientUsername("w", password_hash="p4ss")
