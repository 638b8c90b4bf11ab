"""Message VPNs: separate topic spaces with their own users, profiles and sessions."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import attrs

from ._links import LinkRouter
from ._messages import Envelope
from ._pipeline import Pipeline
from ._profiles import (
    AclAction,
    AclProfile,
    ClientProfile,
    ClientUsername,
    check_identity,
    hash_password,
)
from ._session import MessageHandler, Session
from ._stash import Stash
from ._stats import VpnStatistics
from ._topics import TopicLimits
from .errors import AccessDeniedError, ConfigurationError, StateError

if TYPE_CHECKING:
    from ._node import Node

__all__ = ["Vpn"]

AUTHENTICATION_SCHEMES = ("none", "basic", "client-certificate")

_INTERNAL = "internal"  # the username of the node's own sessions (open_internal_session)


class Vpn:
    """A Message VPN. Create with :meth:`meshbus.Node.create_vpn`; ``"default"`` always exists.

    Each VPN starts with a client profile, an ACL profile and a client
    username all named ``"default"`` that allow everything. With
    ``authentication="none"`` an unknown username logs in as ``"default"``;
    with ``"basic"`` only configured usernames with the right password do; with
    ``"client-certificate"`` only configured usernames whose name is the common
    name of the TLS client certificate the listener verified (remote sessions).
    """

    def __init__(
        self, node: Node, name: str, authentication: str, topic_limits: TopicLimits
    ) -> None:
        if authentication not in AUTHENTICATION_SCHEMES:
            raise ConfigurationError(
                f"VPN {name!r}: authentication must be one of {AUTHENTICATION_SCHEMES}, "
                f"got {authentication!r}"
            )
        self.node = node
        self.name = name
        self.authentication = authentication
        self.topic_limits = topic_limits
        self.stash = Stash()
        self._client_profiles = {"default": ClientProfile("default")}
        self._acl_profiles = {"default": AclProfile("default")}
        self._users = {"default": ClientUsername("default")}
        self._sessions: dict[str, Session] = {}
        self._client_ids = itertools.count(1)
        self._pending: deque[Envelope] = deque()
        self._busy = False
        self.removed = False
        self._pipeline = pipeline = Pipeline()
        #: The VPN's links to other VPNs and nodes, and the router over them.
        self.links = LinkRouter(self)
        node.plugins.vpn_created(self, pipeline)
        # After every plugin's router: links see what local routers decided (the
        # endpoints a guaranteed message was spooled to).
        pipeline.add_router(LinkRouter.ROUTER, self.links.route, enabled=False)
        self.routers = pipeline.names
        self._route = pipeline.compile()
        self._enabled_routers = pipeline.enabled_names()
        # counters carried over from closed sessions, plus the VPN's own
        self._closed_totals = [0, 0, 0, 0]  # published, delivered, discarded, denied
        self.unmatched = 0
        self.login_failures = 0

    def __repr__(self) -> str:
        return f"<Vpn {self.name!r} sessions={len(self._sessions)}>"

    # --- configuration -----------------------------------------------------------

    def add_client_profile(self, profile: ClientProfile) -> None:
        """Add or replace a client profile; open sessions keep the profile they logged in with."""
        if not isinstance(profile, ClientProfile):
            raise ConfigurationError(f"expected a ClientProfile, got {profile!r}")
        self._client_profiles[profile.name] = profile

    def add_acl_profile(self, profile: AclProfile) -> None:
        """Add or replace an ACL profile; open sessions keep the profile they logged in with."""
        if not isinstance(profile, AclProfile):
            raise ConfigurationError(f"expected an AclProfile, got {profile!r}")
        self._acl_profiles[profile.name] = profile

    def add_user(
        self,
        name: str,
        *,
        password: str | None = None,
        password_hash: str | None = None,
        client_profile: str = "default",
        acl_profile: str = "default",
        subscription_manager: bool = False,
        management: bool = False,
        enabled: bool = True,
    ) -> ClientUsername:
        """Add or replace a client username; the password is stored hashed.

        ``password`` is hashed here, on the calling thread. To keep that off the
        event loop of a running node, hash it in a worker thread and pass
        ``password_hash=await anyio.to_thread.run_sync(hash_password, password)``.
        The flags are those of :class:`~meshbus.ClientUsername`: a subscription
        manager may manage other sessions' subscriptions, a management user may
        read the statistics of the whole node.
        """
        if password is not None and password_hash is not None:
            raise ConfigurationError(f"user {name!r}: give a password or its hash, not both")
        problems = []
        if client_profile not in self._client_profiles:
            problems.append(f"unknown client profile {client_profile!r}")
        if acl_profile not in self._acl_profiles:
            problems.append(f"unknown ACL profile {acl_profile!r}")
        if problems:
            raise ConfigurationError(f"user {name!r}: " + "; ".join(problems), problems)
        user = ClientUsername(
            name=name,
            client_profile=client_profile,
            acl_profile=acl_profile,
            password_hash=hash_password(password) if password is not None else password_hash,
            subscription_manager=subscription_manager,
            management=management,
            enabled=enabled,
        )
        self._users[name] = user
        return user

    def remove_user(self, name: str) -> bool:
        """Remove a client username: it can no longer log in, while sessions open under
        it keep their login. Removing ``"default"`` puts the built-in one back.

        :returns: whether the VPN had it.
        """
        if name not in self._users:
            return False
        if name == "default":
            self._users[name] = ClientUsername("default")
        else:
            del self._users[name]
        return True

    def remove_client_profile(self, name: str) -> bool:
        """Remove a client profile (``"default"``: put the built-in one back); open
        sessions keep the profile they logged in with.

        :returns: whether the VPN had it.
        :raises ConfigurationError: a username still names it.
        """
        return self._remove_profile(self._client_profiles, name, "client", ClientProfile)

    def remove_acl_profile(self, name: str) -> bool:
        """Remove an ACL profile (``"default"``: put the built-in one back); open
        sessions keep the profile they logged in with.

        :returns: whether the VPN had it.
        :raises ConfigurationError: a username still names it.
        """
        return self._remove_profile(self._acl_profiles, name, "ACL", AclProfile)

    def _remove_profile(
        self, profiles: dict[str, Any], name: str, kind: str, built_in: type[Any]
    ) -> bool:
        if name not in profiles:
            return False
        if name == "default":
            profiles[name] = built_in("default")
            return True
        field = "client_profile" if kind == "client" else "acl_profile"
        users = sorted(u.name for u in self._users.values() if getattr(u, field) == name)
        if users:
            raise ConfigurationError(
                f"{kind} profile {name!r} is still the profile of username(s) "
                + ", ".join(repr(u) for u in users)
            )
        del profiles[name]
        return True

    @property
    def client_profiles(self) -> Mapping[str, ClientProfile]:
        """Client profiles by name (read-only view)."""
        return MappingProxyType(self._client_profiles)

    @property
    def acl_profiles(self) -> Mapping[str, AclProfile]:
        """ACL profiles by name (read-only view)."""
        return MappingProxyType(self._acl_profiles)

    @property
    def users(self) -> Mapping[str, ClientUsername]:
        """Client usernames by name (read-only view)."""
        return MappingProxyType(self._users)

    @property
    def sessions(self) -> Mapping[str, Session]:
        """Open sessions by client name (read-only view)."""
        return MappingProxyType(self._sessions)

    # --- sessions ----------------------------------------------------------------

    def open_session(
        self,
        *,
        username: str = "default",
        password: str | None = None,
        client_name: str | None = None,
        no_local: bool = False,
        on_message: MessageHandler | None = None,
        timestamps: bool = False,
        certificate_name: str | None = None,
    ) -> Session:
        """Log in and open a session at once (see :meth:`meshbus.Node.connect`).

        A login that needs a password checked cannot be done this way, since
        hashing never runs on the event loop (SPEC 6): use :meth:`login`.

        :param certificate_name: the common name of a client certificate that a
            listener verified (for ``authentication="client-certificate"``).
        :raises AuthenticationError: the login was refused (see :meth:`login`).
        :raises StateError: a password would have to be checked; the node is not
            running; the client name is in use.
        """
        client_name = self._check_can_open(username, client_name)
        try:
            verdict = self._judge(username, password, certificate_name)
            if verdict.check:
                raise StateError(
                    f"VPN {self.name!r} checks passwords in a worker thread, never on the "
                    "event loop: log in with 'await node.login(...)'"
                )
            user, acl, profile = self._authorize(verdict, username)
        except (AccessDeniedError, ConfigurationError):
            self.login_failures += 1
            raise
        return self._open(
            user, username, client_name, profile, acl, no_local, on_message, timestamps
        )

    async def login(
        self,
        *,
        username: str = "default",
        password: str | None = None,
        client_name: str | None = None,
        no_local: bool = False,
        on_message: MessageHandler | None = None,
        timestamps: bool = False,
        certificate_name: str | None = None,
        address: str | None = None,
        replace: bool = False,
    ) -> Session:
        """Log in and open a session, checking a password in a worker thread (see
        :meth:`meshbus.Node.login`).

        :param certificate_name: the common name of a client certificate that a
            listener verified (for ``authentication="client-certificate"``).
        :param address: where the client connects from, so that repeated failures
            from there are slowed down (listeners pass the peer's address).
        :param replace: close an open session of the same client name once this login
            is accepted, instead of refusing it (MQTT's session takeover).
        """
        client_name = self._check_can_open(username, client_name)
        guard = self.node.logins
        keys = guard.keys(self.name, username, address)
        try:
            turn = await guard.wait_turn(keys)
            if turn is None:
                raise guard.refuse(username, "too many failed logins, so not checked")
            verdict = self._judge(username, password, certificate_name)
            if verdict.check:
                assert password is not None  # _judge refuses a missing one without a check
                matched = await guard.verify(password, verdict.password_hash)
                if not matched and verdict.reason is None:
                    verdict = _Verdict(None, reason="wrong password")
            if verdict.reason is None:
                guard.succeeded(turn)
            user, acl, profile = self._authorize(verdict, username)
        except (AccessDeniedError, ConfigurationError):
            self.login_failures += 1
            raise
        return self._open(
            user, username, client_name, profile, acl, no_local, on_message, timestamps, replace
        )

    def open_session_for(
        self,
        username: str,
        client_name: str | None = None,
        *,
        user: ClientUsername | None = None,
    ) -> Session:
        """Open a session as ``username`` without its credentials, for a plugin that acts
        for a client who logged in earlier and is gone (an MQTT will published once
        its delay is up, or after a node restart). ``user``: what that login resolved
        the username to (a plugin's :func:`~meshbus.hookspecs.meshbus_authenticate`
        may have); without it, the username must be configured. Either way it must be
        enabled, and its ACL and client profiles apply as they are now.

        :raises AuthenticationError: no such username, or it is disabled.
        :raises AccessDeniedError: its ACL profile refuses connections now.
        :raises StateError: the node is not running; the client name is in use.
        """
        client_name = self._check_can_open(username, client_name)
        if user is None:
            user = self._users.get(username)
        if user is None and self.authentication == "none":
            user = self._users["default"]
        reason = (
            "unknown username" if user is None else None if user.enabled else "username is disabled"
        )
        user, acl, profile = self._authorize(_Verdict(user, reason=reason), username)
        return self._open(user, username, client_name, profile, acl, False, None, False)

    def _check_can_open(self, username: str, client_name: str | None) -> str:
        """Refuse what no credentials could make right; the client name to use."""
        if self.removed:
            raise StateError(f"VPN {self.name!r} was removed")
        if not self.node.running:
            raise StateError("the node is not running: use 'async with node:' first")
        check_identity("username", username)
        if client_name is None:
            # Skip names in use: a remote session keeps the name it was given across a
            # node restart, and the restarted node's counter comes to it again.
            client_name = f"{self.node.name}-{next(self._client_ids)}"
            while client_name in self._sessions:
                client_name = f"{self.node.name}-{next(self._client_ids)}"
        check_identity("client name", client_name)
        return client_name

    def _judge(
        self,
        username: str,
        password: str | None,
        certificate_name: str | None,
    ) -> _Verdict:
        """Who would log in, and what is checked first; no password is checked here."""
        hooked = self.node.plugins.authenticate(self, username, password)
        if hooked is not None:
            return _Verdict(hooked)
        known = self._users.get(username)
        if self.authentication == "none":
            user = known if known is not None else self._users["default"]
            return _Verdict(user, reason=None if user.enabled else "username is disabled")
        if self.authentication == "client-certificate":
            if certificate_name is None:
                reason = "no client certificate"
            elif known is None:
                reason = "unknown username"
            elif certificate_name != username:
                reason = f"the client certificate is for {certificate_name!r}"
            elif not known.enabled:
                reason = "username is disabled"
            else:
                return _Verdict(known)
            return _Verdict(None, reason=reason)
        # Basic: every login with a password costs one check, whoever it names.
        if password is None:
            return _Verdict(None, reason="no password given")
        if known is None:
            return _Verdict(None, check=True, reason="unknown username")
        if known.password_hash is None:
            return _Verdict(None, check=True, reason="username has no password")
        if not known.enabled:
            return _Verdict(
                None, check=True, password_hash=known.password_hash, reason="username is disabled"
            )
        return _Verdict(known, check=True, password_hash=known.password_hash)

    def _authorize(
        self, verdict: _Verdict, username: str
    ) -> tuple[ClientUsername, AclProfile, ClientProfile]:
        """Refuse a failed authentication with one answer, then apply the profiles.

        What is refused after the credentials were right says why: the client has
        shown it knows them.
        """
        if verdict.reason is not None or verdict.user is None:
            raise self.node.logins.refuse(username, verdict.reason or "refused")
        user = verdict.user
        acl = self._acl_profiles.get(user.acl_profile)
        profile = self._client_profiles.get(user.client_profile)
        if acl is None or profile is None:
            raise ConfigurationError(
                f"user {user.name!r} refers to a profile that no longer exists"
            )
        if acl.connect_default is AclAction.DENY:
            raise AccessDeniedError(username, "connect", why=f"ACL profile {acl.name!r}")
        return user, acl, profile

    def _open(
        self,
        user: ClientUsername,
        username: str,
        client_name: str,
        profile: ClientProfile,
        acl: AclProfile,
        no_local: bool,
        on_message: MessageHandler | None,
        timestamps: bool,
        replace: bool = False,
    ) -> Session:
        # Checked again after authentication: a login may have waited for a thread,
        # and only a client that proved who it is learns which names are in use.
        if self.removed:
            raise StateError(f"VPN {self.name!r} was removed")
        if not self.node.running:
            raise StateError("the node is not running: use 'async with node:' first")
        if client_name in self._sessions and replace:
            self._sessions[client_name].close()  # taken over by a client that proved who it is
        if client_name in self._sessions:
            raise StateError(f"client name {client_name!r} is already in use in VPN {self.name!r}")
        session = Session(
            self, client_name, user, username, profile, acl, no_local, on_message, timestamps
        )
        self._sessions[client_name] = session
        if session._async_handler is not None:
            self.node.task_group.start_soon(session._pump, name=f"meshbus pump {client_name}")
        self.node.plugins.session_opened(session)
        return session

    def open_internal_session(self, client_name: str) -> Session:
        """A session for the node's own work in this VPN: a link serving the flows its
        peer binds, a plugin moving messages from a queue. Nobody logs in, so nothing
        is authenticated whatever the VPN's ``authentication``, and it has the built-in
        ``"default"`` client profile and an ACL that allows everything (a configured
        ``"default"`` username or profile does not apply). Its username is
        ``"internal"``, for statistics and logs.

        Plugins must not hand such a session to a client: its rights are the node's.

        :raises StateError: the node is not running, the VPN was removed, or the client
            name is in use.
        """
        check_identity("client name", client_name)
        user = ClientUsername(_INTERNAL)
        profile, acl = ClientProfile("default"), AclProfile("default")
        return self._open(user, _INTERNAL, client_name, profile, acl, False, None, False)

    def accept_link(
        self,
        user: ClientUsername,
        kind: str,
        peer_node: str,
        peer_cluster: str | None = None,
        name: str = "",
    ) -> None:
        """Decide whether a peer authenticated as ``user`` may open a link of ``kind``
        (the peer is node ``peer_node`` of cluster ``peer_cluster`` and calls the link
        ``name``).

        The user's client profile must allow bridge connections and its ACL profile
        must allow it to connect; then plugins may refuse it
        (:func:`~meshbus.hookspecs.meshbus_accept_link`).

        :raises AccessDeniedError: refused; counted as a login failure.
        """
        try:
            profile = self._client_profiles.get(user.client_profile)
            acl = self._acl_profiles.get(user.acl_profile)
            if profile is None or acl is None:
                raise AccessDeniedError(user.name, "connect", why="its profiles no longer exist")
            if not profile.allow_bridge_connections:
                raise AccessDeniedError(
                    user.name,
                    "connect",
                    why=f"client profile {profile.name!r} does not allow bridge connections",
                )
            if acl.connect_default is AclAction.DENY:
                raise AccessDeniedError(user.name, "connect", why=f"ACL profile {acl.name!r}")
            self.node.plugins.accept_link(self, user, kind, peer_node, peer_cluster, name)
        except AccessDeniedError:
            self.login_failures += 1
            raise

    def _session_closed(self, session: Session) -> None:
        del self._sessions[session.client_name]
        totals = self._closed_totals
        totals[0] += session.published
        totals[1] += session.delivered
        totals[2] += session._egress.discarded
        totals[3] += session.denied
        self.node.plugins.session_closed(session)

    def enable_router(self, name: str, enabled: bool = True) -> None:
        """Switch a plugin's router on or off for this VPN (control plane only).

        A plugin turns its router off while it has nothing to route (no shared
        subscription, no endpoint, no link) so that publishes skip it entirely.
        """
        if self._pipeline.enable(name, enabled):
            self._route = self._pipeline.compile()
            self._enabled_routers = self._pipeline.enabled_names()

    def router_enabled(self, name: str) -> bool:
        """Whether the router called ``name`` runs for each message."""
        return self._pipeline.is_enabled(name)

    def routers_besides(self, name: str) -> bool:
        """Whether a router other than ``name`` runs for each message.

        A plugin whose own router would let a message pass may skip building and
        dispatching it when this is false: nothing else would deliver it.
        """
        enabled = self._enabled_routers
        return len(enabled) > (name in enabled)

    # --- per message --------------------------------------------------------------

    def dispatch(self, envelope: Envelope, *, count_unmatched: bool = True) -> None:
        """Route one message through every router of the VPN.

        Publishes made while routing (by inline handlers) are queued and routed
        afterwards, so every subscriber sees each publisher's messages in order.

        :param count_unmatched: count the message in ``unmatched`` when no router
            delivered it (``False`` when something else, such as a queue, already took it).
        """
        # Session.publish inlines both fenced parts for speed, filling its reused
        # envelope between them; tests/test_inline_copies.py compares them.
        # inline-source: defer begin
        if self._busy:
            self._pending.append(envelope.copy())
            return
        # inline-source: defer end
        # inline-source: route begin
        self._busy = True
        try:
            if not self._route(envelope) and count_unmatched:
                self.unmatched += 1
            if self._pending:
                self._drain()
        finally:
            self._busy = False
        # inline-source: route end

    def _drain(self) -> None:
        pending = self._pending
        route = self._route
        while pending:
            if not route(pending.popleft()):
                self.unmatched += 1

    # --- statistics ---------------------------------------------------------------

    def statistics(self) -> VpnStatistics:
        """A snapshot of this VPN's counters, closed sessions included."""
        published, delivered, discarded, denied = self._closed_totals
        for s in self._sessions.values():
            published += s.published
            delivered += s.delivered
            discarded += s._egress.discarded
            denied += s.denied
        return VpnStatistics(
            sessions=len(self._sessions),
            published=published,
            delivered=delivered,
            discarded=discarded,
            denied=denied,
            unmatched=self.unmatched,
            login_failures=self.login_failures,
        )

    def _close_all(self) -> None:
        for session in list(self._sessions.values()):
            session.close()


@attrs.frozen
class _Verdict:
    """What a login's username, password and certificate come to before a password check."""

    user: ClientUsername | None
    """Who logs in, unless something below refuses."""
    check: bool = False
    """Whether the password must match :attr:`password_hash` first."""
    password_hash: str | None = None
    """What the password is checked against; ``None``: a dummy hash (the same work)."""
    reason: str | None = None
    """Why it is refused whatever the password (for the log; the client is not told)."""
