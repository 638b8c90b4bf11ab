"""The API rule (docs/explanation/api-rule.rst): a method is ``async`` if and only if
it may wait -- for I/O (the network, the spool store's disk) or for something to
happen (a message, a peer's answer, room in a window); everything else is plain.

Every public method of the guaranteed and remote-session API is listed below with
the reason for its colour; the test fails when one is async against its entry, or
when a public method appears that the table does not classify (add it, with its
reason, after reading the rule).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

from meshbus import Session
from meshbus.abc import Flow, GuaranteedMessaging, SessionAPI
from meshbus.plugins.guaranteed import GuaranteedService, Queue, QueueFlow, SpoolStore
from meshbus.transports import RemoteFlow, RemoteSession

WAITS = True  # async: it may wait
AT_ONCE = False  # plain: it never waits

# Reasons, named once so the table reads as the rule's cases.
NETWORK = "a round trip to the node (or writing to it)"
STORE = "reads or writes the spool store"
MESSAGE = "waits for a message"
INTERFACE = "an interface method: an implementation may wait (remote: the node)"
MEMORY = "changes the node's tables in memory"
BUFFERED = "buffered: sent later, a refusal is raised by confirm()"
LOOKUP = "reads state or counters in memory"
NOWAIT = "hands out what is there, or None"

FLOW = {
    "receive": (WAITS, MESSAGE),
    "receive_nowait": (AT_ONCE, NOWAIT),
    "ack": (AT_ONCE, "recorded now, committed with the next batch of acks"),
    "unbind": (WAITS, "commits pending acks (store) or tells the node (network)"),
}

GUARANTEED = {
    "create_queue": (AT_ONCE, MEMORY + "; the store is read when flows ask"),
    "add_subscription": (AT_ONCE, MEMORY),
    "remove_subscription": (AT_ONCE, MEMORY),
    "enable_queue": (AT_ONCE, MEMORY),
    "queue_statistics": (AT_ONCE, LOOKUP),
    "delete_queue": (WAITS, STORE + ": deletes what the queue holds"),
    "purge_queue": (WAITS, STORE + ": deletes what the queue holds"),
    "send": (WAITS, STORE + ": returns once the message is held"),
    "send_to_queue": (WAITS, STORE + ": returns once the message is held"),
    "send_many": (WAITS, STORE + ": returns once the messages are held"),
    "put_in_queue": (WAITS, STORE + ": returns once the message is held"),
    "spool_from_link": (WAITS, STORE + ": returns once the message is held"),
    "spool_many_from_link": (WAITS, STORE + ": returns once the messages are held"),
    "bind": (WAITS, INTERFACE),
    "bind_topic_endpoint": (WAITS, STORE + ": a new subscription drops what it held"),
}

SESSION = {
    "publish": (AT_ONCE, "direct messaging never waits for subscribers"),
    "subscribe": (AT_ONCE, MEMORY + " (in process); " + BUFFERED + " (remote)"),
    "unsubscribe": (AT_ONCE, MEMORY + " (in process); " + BUFFERED + " (remote)"),
    "subscribe_for": (AT_ONCE, MEMORY + " (in process); " + BUFFERED + " (remote)"),
    "unsubscribe_for": (AT_ONCE, MEMORY + " (in process); " + BUFFERED + " (remote)"),
    "confirm": (WAITS, INTERFACE + ": a round trip"),
    "receive": (WAITS, MESSAGE),
    "receive_nowait": (AT_ONCE, NOWAIT),
    "send": (WAITS, GUARANTEED["send"][1]),
    "send_to_queue": (WAITS, GUARANTEED["send_to_queue"][1]),
    "send_many": (WAITS, GUARANTEED["send_many"][1]),
    "bind": (WAITS, INTERFACE),
    "bind_topic_endpoint": (WAITS, INTERFACE),
    "aclose": (WAITS, INTERFACE + ": a remote session flushes and logs out"),
    "statistics": (AT_ONCE, LOOKUP),
}

TABLE: dict[type, dict[str, tuple[bool, str]]] = {
    Flow: FLOW,
    QueueFlow: {**FLOW, "detach": (AT_ONCE, "unbinds now; the acks are committed later")}
    | {"forget_purged": (AT_ONCE, MEMORY)},
    RemoteFlow: FLOW,
    GuaranteedMessaging: GUARANTEED,
    GuaranteedService: {
        **GUARANTEED,
        "create_topic_endpoint": (AT_ONCE, MEMORY + "; its subscription was read at start"),
        "queue": (AT_ONCE, LOOKUP),
        "topic_endpoint": (AT_ONCE, LOOKUP),
        "find_queue": (AT_ONCE, LOOKUP),
        "delete_topic_endpoint": (WAITS, STORE + ": deletes what the endpoint holds"),
        # the plugin's hooks
        "router_for": (AT_ONCE, "returns the router"),
        "vpn_removed": (AT_ONCE, MEMORY),
        "session_closed": (AT_ONCE, MEMORY + "; flows detach"),
        "flow_detached": (AT_ONCE, MEMORY + "; the spooler commits acks later"),
        "run": (WAITS, "the spooler task"),
        "sweep_ttl": (WAITS, "the TTL sweep task"),
        "stop": (WAITS, STORE + ": commits what is pending"),
    },
    Queue: {
        "usage": (AT_ONCE, LOOKUP),
        "statistics": (AT_ONCE, LOOKUP),
        "filters": (AT_ONCE, LOOKUP),
        "refusal": (AT_ONCE, LOOKUP),
        "may_deliver_to": (AT_ONCE, LOOKUP),
        "delivers_at_once": (AT_ONCE, LOOKUP),
        "at_once_room": (AT_ONCE, LOOKUP),
        "reserve": (AT_ONCE, MEMORY),
        "unreserve": (AT_ONCE, MEMORY),
        "stored": (AT_ONCE, MEMORY),
        "give_back": (AT_ONCE, MEMORY),
        "ack_later": (AT_ONCE, MEMORY),
        "forget_held": (AT_ONCE, MEMORY),
        "take": (WAITS, STORE),
        "flush_acks": (WAITS, STORE),
        "dispose": (WAITS, STORE),
        "purge": (WAITS, STORE),
        "sweep_expired": (WAITS, STORE),
        "wait": (WAITS, "waits for a change"),
    },
    SpoolStore: {
        **{
            name: (WAITS, STORE)
            for name in (
                "open",
                "close",
                "put",
                "put_many",
                "ack",
                "put_and_ack",
                "mark_delivered",
                "read",
                "read_expired",
                "drop_endpoint",
                "check",
            )
        },
        "stats": (AT_ONCE, "counted in memory"),
        "statistics": (AT_ONCE, "counted in memory"),
        "endpoints": (AT_ONCE, "counted in memory"),
    },
    SessionAPI: {name: SESSION[name] for name in SESSION if name != "statistics"},
    Session: {
        **SESSION,
        "close": (AT_ONCE, "in process, closing waits for nothing (aclose for any session)"),
        "check_publish_acl": (AT_ONCE, LOOKUP),
        "check_subscribe_acl": (AT_ONCE, LOOKUP),
    },
    RemoteSession: {
        **SESSION,
        "flush": (WAITS, NETWORK),
        "call": (WAITS, NETWORK),
        "node_statistics": (WAITS, NETWORK),
        "statistics": (AT_ONCE, LOOKUP + ": the client's own counters"),
    },
}

#: The async protocols' special methods, the same on every class that has them.
SPECIAL = {
    "__aenter__": WAITS,
    "__aexit__": WAITS,
    "__anext__": WAITS,
    "__aiter__": AT_ONCE,
    "__enter__": AT_ONCE,
    "__exit__": AT_ONCE,
}


def public_methods(cls: type) -> dict[str, Any]:
    """The public methods of ``cls`` (inherited ones too), by name."""
    found = {}
    for name in dir(cls):
        if name.startswith("_") and name not in SPECIAL:
            continue
        member = inspect.getattr_static(cls, name)
        if isinstance(member, staticmethod | classmethod):
            member = member.__func__
        if callable(member) and not isinstance(member, type):
            found[name] = member
    return found


@pytest.mark.parametrize("cls", list(TABLE), ids=lambda cls: cls.__name__)
def test_every_public_method_is_classified_and_has_its_colour(cls: type) -> None:
    table = TABLE[cls]
    methods = public_methods(cls)
    unclassified = sorted(set(methods) - set(table) - set(SPECIAL))
    assert not unclassified, (
        f"{cls.__name__} has public methods the API rule table does not classify: "
        f"{unclassified}; add each to tests/test_api_rule.py with why it is (not) async"
    )
    gone = sorted(set(table) - set(methods))
    assert not gone, f"{cls.__name__} no longer has {gone}: update the table"
    wrong = [
        f"{name} ({'should' if table.get(name, (SPECIAL.get(name),))[0] else 'should not'}"
        f" be async: {table.get(name, (None, 'protocol'))[1]})"
        for name, method in methods.items()
        if inspect.iscoroutinefunction(method)
        != (table[name][0] if name in table else SPECIAL[name])
    ]
    assert not wrong, f"{cls.__name__} breaks the API rule: {wrong}"


@pytest.mark.parametrize(
    ("implementation", "interface"),
    [
        (QueueFlow, Flow),
        (RemoteFlow, Flow),
        (GuaranteedService, GuaranteedMessaging),
        (Session, SessionAPI),
        (RemoteSession, SessionAPI),
    ],
    ids=lambda cls: cls.__name__,
)
def test_an_implementation_has_its_interfaces_colours(
    implementation: type, interface: type
) -> None:
    for name, wanted in public_methods(interface).items():
        got = inspect.getattr_static(implementation, name)
        assert inspect.iscoroutinefunction(got) == inspect.iscoroutinefunction(wanted), name


def test_the_rule_is_written_in_the_docs() -> None:
    text = (Path(__file__).parent.parent / "docs/explanation/api-rule.rst").read_text()
    assert "async if and only if it may wait" in text
    for name in ("tests/test_api_rule.py", "receive_nowait", "confirm", "delete_queue"):
        assert name in text
    for cls, table in TABLE.items():
        for name, (_, why) in table.items():
            assert why.strip(), f"{cls.__name__}.{name} has no reason"
