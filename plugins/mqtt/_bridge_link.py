"""A bridge's link to an external MQTT broker (SPEC 7, 9, 13): the HiveMQ bridge's job.

The link is an MQTT client of the broker. It subscribes there to what the bridge
wants (its SUB mappings and subscriptions, translated to MQTT filters) and
publishes there what the VPN's link router gives it (its PUB mappings' filters):

* a direct message goes out at QoS 0; a guaranteed one waits in the bridge's own
  queue (``bridge.<name>``, subscribed to the PUB filters) and goes out at QoS 1,
  acknowledged on the queue only once the broker's PUBACK came, so nothing is lost
  while the broker is away or restarts;
* what comes in at QoS 0 is routed as a direct message; at QoS 1 or 2 it is spooled
  to every matching local endpoint before the broker is acknowledged;
* the hop count travels as the MQTT 5 user property ``hmq-bridge-hop-count`` (the
  name HiveMQ bridges use, so the two interoperate); MQTT 3.1.1 cannot carry it, and
  there a digest of each (topic, payload) sent in the last seconds catches what the
  broker sends back (MQTT 5 asks for no-local instead), counted as ``duplicate``;
* it reconnects with the bridge's backoff, tries its remotes in order, and moves back
  to a better-ordered one (fail-back) as the bridge's own links do.
"""

from __future__ import annotations

import logging
import ssl
import time
from collections import OrderedDict
from typing import Any
from urllib.parse import urlsplit

import anyio
import anyio.abc
import attrs
from anyio.streams.tls import TLSStream
from mqtt5 import PubAckPacket, PublishPacket, PubRelPacket, SubAckPacket

from meshbus import (
    ConfigurationError,
    DeliveryMode,
    Envelope,
    Link,
    LinkState,
    MeshbusError,
    Message,
    PublishRejectedError,
    Session,
    Vpn,
)
from meshbus.abc import Flow
from meshbus.transports import Backoff, TlsSettings

from ._client_codec import ClientCodec
from ._codec import MQTT_5, MQTT_311, AnyPublish, MalformedPacket, PacketReader, Publish311
from ._translate import publish_options, take_header, v5_properties

__all__ = [
    "HOP_COUNT_PROPERTY",
    "MqttBridgeOptions",
    "MqttLink",
    "MqttRemote",
    "is_mqtt_url",
    "parse_mqtt_url",
    "to_mqtt_filter",
]

log = logging.getLogger("meshbus.mqtt.bridge")

HOP_COUNT_PROPERTY = "hmq-bridge-hop-count"
"""The MQTT 5 user property a bridged message's hop count travels in."""
_ECHO_WINDOW = 30.0  # seconds a sent (topic, payload) is remembered (MQTT 3.1.1)
_ECHO_MAX = 100_000
_PERSISTENT = DeliveryMode.PERSISTENT


def parse_mqtt_url(url: str) -> tuple[bool, str, int]:
    """``mqtt://host:port`` (1883) or ``mqtts://host:port`` (8883) as (tls, host, port)."""
    parts = urlsplit(url)
    if parts.scheme not in ("mqtt", "mqtts") or not parts.hostname:
        raise ConfigurationError(f"expected mqtt://HOST:PORT or mqtts://HOST:PORT, got {url!r}")
    try:
        port = parts.port
    except ValueError:
        raise ConfigurationError(f"bad port in {url!r}") from None
    tls = parts.scheme == "mqtts"
    return tls, parts.hostname, port or (8883 if tls else 1883)


def is_mqtt_url(target: object) -> bool:
    """Whether a bridge remote names an MQTT broker."""
    url = target.url if isinstance(target, MqttRemote) else target
    return isinstance(url, str) and url.split(":", 1)[0] in ("mqtt", "mqtts")


def _url(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str):
        raise ConfigurationError(f"an MQTT remote needs a URL, not {value!r}")
    parse_mqtt_url(value)


@attrs.frozen
class MqttRemote:
    """An MQTT broker a bridge connects to, with login settings of its own."""

    url: str = attrs.field(validator=_url)
    """``mqtt://host:port`` or ``mqtts://host:port``."""
    username: str | None = None
    """Who to log in as (``None``: the bridge's ``username``)."""
    password: str | None = attrs.field(default=None, repr=False)
    """The password (``None``: the bridge's)."""
    tls: TlsSettings | None = None
    """What to trust and the client certificate to show (``None``: the bridge's)."""


def to_mqtt_filter(topic_filter: str) -> str:
    """A meshbus filter as the MQTT filter to subscribe to: ``*`` is ``+``, a last
    ``>`` is ``#`` (which also matches the parent level; what the meshbus filter
    does not match is dropped as it comes in). A prefix wildcard (``ab*``) has no
    MQTT form: :class:`ConfigurationError`."""
    levels = topic_filter.split("/")
    out = []
    for i, level in enumerate(levels):
        if level == "*":
            out.append("+")
        elif level == ">" and i == len(levels) - 1:
            out.append("#")
        elif level.endswith("*") or "+" in level or "#" in level:
            raise ConfigurationError(f"filter {topic_filter!r} has no MQTT form (level {level!r})")
        else:
            out.append(level)
    return "/".join(out)


def _qos(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value not in (0, 1) or isinstance(value, bool):
        raise ConfigurationError(f"{attribute.name} must be 0 or 1, got {value!r}")


def _level(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value not in (MQTT_311, MQTT_5) or isinstance(value, bool):
        raise ConfigurationError(f"protocol must be 4 (MQTT 3.1.1) or 5, got {value!r}")


def _positive(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{attribute.name} must be a positive integer, got {value!r}")


@attrs.frozen
class MqttBridgeOptions:
    """How a bridge speaks to an MQTT broker (``mqtt = {...}`` in a bridge's table)."""

    protocol: int = attrs.field(default=MQTT_5, validator=_level)
    """4 (MQTT 3.1.1) or 5; hop counts travel only on 5."""
    client_id: str | None = None
    """The bridge's client id at the broker (default ``meshbus-<node>-<bridge>``)."""
    qos: int = attrs.field(default=1, validator=_qos)
    """The QoS of its subscriptions at the broker (and of what it sends there
    guaranteed); 0 makes everything that comes in a direct message."""
    keepalive: int = attrs.field(default=60, validator=_positive)
    """Seconds between the pings that keep the connection checked."""
    session_expiry: int = attrs.field(default=3600, validator=_positive)
    """How long the broker keeps the bridge's session (and QoS 1 messages for it)
    while the bridge is away (MQTT 5; a 3.1.1 session lasts until cleaned)."""


class _Refused(Exception):
    """The broker refused the bridge's login."""


_FAILURES = (
    OSError,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.EndOfStream,
    ssl.SSLError,
    TimeoutError,
    MalformedPacket,
    _Refused,
)


class MqttLink(Link):
    """A bridge's link to an MQTT broker (made by :func:`~meshbus.plugins.bridge.open_bridge`
    for ``mqtt://`` and ``mqtts://`` remotes)."""

    def __init__(
        self,
        vpn: Vpn,
        name: str,
        remotes: list[MqttRemote],
        *,
        client_id: str,
        protocol: int = MQTT_5,
        qos: int = 1,
        keepalive: int = 60,
        session_expiry: int = 3600,
        username: str | None = None,
        password: str | None = None,
        tls: TlsSettings | None = None,
        backoff: Backoff | None = None,
        fail_back: float | None = 30.0,
        dedup: bool = True,
        queue: str | None = None,
        window: int = 100,
        drain_timeout: float = 5.0,
    ) -> None:
        # The store's name of the queue: the router sends no direct copy of what it holds.
        endpoint = None if queue is None else f"{vpn.name}/{queue}"
        super().__init__(vpn, name, "mqtt", dedup=dedup, endpoint=endpoint)
        if protocol not in (MQTT_5, MQTT_311):
            raise ConfigurationError(f"MQTT protocol level must be 4 or 5, got {protocol!r}")
        self.remotes = remotes
        self.client_id = client_id
        self.protocol = protocol
        self.qos = qos
        self.keepalive = keepalive
        self.session_expiry = session_expiry
        self.username = username
        self.password = password
        self.tls = tls
        self.backoff = backoff or Backoff(1.0, 120.0, 0.2)
        self.fail_back = fail_back
        self.queue = queue
        self.window = window
        #: Seconds (on the node's clock) a stop gives the connection to write what the
        #: link had taken and a DISCONNECT before it is cut.
        self.drain_timeout = drain_timeout
        self._closing = False  # stopping: what waits goes out, then DISCONNECT
        self._drained = anyio.Event()
        self._ended: anyio.Event | None = None  # set when run() returns
        self._wants: dict[str, str] = {}  # meshbus filter -> the MQTT filter subscribed to
        self._codec: ClientCodec | None = None
        self._stream: anyio.abc.ByteStream | None = None
        self._out: list[bytes] = []
        self._wake = anyio.Event()
        self._inflight: dict[int, Message] = {}
        self._next_id = 0
        self._sent: OrderedDict[int, float] = OrderedDict()  # (topic, payload) digests
        self._scope: anyio.CancelScope | None = None
        self._stopped = False
        self._at = 0  # the remote in use (index; -1: go back to the first)
        self._up_since: float | None = None
        self._flow: Flow | None = None
        self.remote_url = ""

    # --- what the bridge asks -----------------------------------------------------------

    @property
    def wants(self) -> tuple[str, ...]:
        return tuple(self._wants)

    def want(self, topic_filter: str) -> None:
        """Subscribe at the broker to ``topic_filter`` (now, when connected, and at each
        connection)."""
        if topic_filter in self._wants:
            return
        self._wants[topic_filter] = mqtt = to_mqtt_filter(topic_filter)
        if self._codec is not None:
            self._queue_out(self._codec.subscribe(self._packet_id(), [(mqtt, self.qos)]))

    def unwant(self, topic_filter: str) -> None:
        mqtt = self._wants.pop(topic_filter, None)
        if mqtt is not None and self._codec is not None and mqtt not in self._wants.values():
            self._queue_out(self._codec.unsubscribe(self._packet_id(), [mqtt]))

    # --- out ----------------------------------------------------------------------------

    def send(self, envelope: Envelope) -> bool:
        codec = self._codec
        if codec is None:
            return False
        message = envelope.message
        self._queue_out(self._publish(codec, message, envelope.hop_count, 0, None))
        return True

    def _publish(
        self, codec: ClientCodec, message: Message, hops: int, qos: int, packet_id: int | None
    ) -> bytes:
        properties = None
        if codec.v5:
            properties = _properties(message, hops, self.vpn.node.clock.time())
        else:
            self._remember(message.topic, message.payload)
        return codec.publish(
            message.topic,
            message.payload,
            qos,
            packet_id,
            message.options.retain,
            message.redelivered and qos > 0,
            properties,
        )

    def _remember(self, topic: str, payload: bytes) -> None:
        sent = self._sent
        sent[hash((topic, payload))] = time.monotonic() + _ECHO_WINDOW
        if len(sent) > _ECHO_MAX:
            sent.popitem(last=False)

    def _echo(self, topic: str, payload: bytes) -> bool:
        """Whether the broker sent back what this link sent it (MQTT 3.1.1)."""
        if not self._sent:
            return False
        key = hash((topic, payload))
        deadline = self._sent.pop(key, None)
        return deadline is not None and deadline >= time.monotonic()

    def _queue_out(self, data: bytes) -> None:
        if self._closing:  # the DISCONNECT is queued: nothing goes after it
            return
        self._out.append(data)
        self._wake.set()

    def _packet_id(self) -> int:
        while True:
            self._next_id = self._next_id % 65535 + 1
            if self._next_id not in self._inflight:
                return self._next_id

    # --- running ------------------------------------------------------------------------

    async def run(self) -> None:
        """Connect, serve, reconnect with backoff, until :meth:`stop`. The delay starts
        again from the shortest once a connection stayed up for a minute (SPEC 7)."""
        clock = self.vpn.node.clock
        backoff = self.backoff.fresh()
        self._ended = ended = anyio.Event()
        try:
            with anyio.CancelScope() as scope:
                self._scope = scope
                while not self._stopped:
                    remote = self.remotes[self._at % len(self.remotes)]
                    self._up_since = None
                    try:
                        await self._serve(remote)
                    except _FAILURES as exc:
                        reason = f"{remote.url}: {str(exc) or type(exc).__name__}"
                        if self._up_since is None:
                            self.connect_failures += 1
                            self.reason = reason
                            self.set_state(LinkState.BACKOFF, reason)
                        else:
                            self._down(reason)
                    if self._up_since is not None and clock.monotonic() - self._up_since > 60:
                        backoff.reset()
                    if self._at < 0:  # failing back: the first remote, at once
                        self._at = 0
                        continue
                    self._at = (
                        (self._at + 1) % len(self.remotes) if self._up_since is None else self._at
                    )
                    await clock.sleep_until(clock.monotonic() + backoff.next_delay())
        finally:
            ended.set()

    def stop(self, reason: str = "stopped") -> None:
        """Close the link for good: what it had taken for the broker is written, then a
        DISCONNECT, and the connection closes (cut after :attr:`drain_timeout`)."""
        self._stopped = True
        codec = self._codec
        if self._closing:
            pass  # stopped already: the connection is writing what waits
        elif codec is not None and self._stream is not None and self.drain_timeout > 0:
            self._out.append(codec.goodbye())
            self._closing = True
            self._drained = anyio.Event()
            self._wake.set()
            self.vpn.node.task_group.start_soon(self._drain)
        elif self._scope is not None:
            self._scope.cancel()
        if self.attached:
            if self._codec is not None:
                self._down(reason)
            self.set_state(LinkState.DISABLED, reason)

    async def aclose(self, reason: str = "stopped") -> None:
        """:meth:`stop` the link, and return once its connection has closed."""
        self.stop(reason)
        if self._ended is not None:
            await self._ended.wait()

    async def _drain(self) -> None:
        with self.vpn.node.clock.move_on_after(self.drain_timeout):
            await self._drained.wait()
        if self._scope is not None:
            self._scope.cancel()

    def _down(self, reason: str) -> None:
        self._codec = None
        for message in self._inflight.values():
            self.settled(message)  # the flow gives it back to the queue
        self._inflight.clear()
        if self.state not in (LinkState.BACKOFF, LinkState.DISABLED):
            self.closed(reason)

    async def _serve(self, remote: MqttRemote) -> None:
        tls, host, port = parse_mqtt_url(remote.url)
        clock = self.vpn.node.clock
        self.set_state(LinkState.CONNECTING)
        with clock.fail_after(10):
            stream: anyio.abc.ByteStream = await anyio.connect_tcp(host, port)
            if tls:
                settings = remote.tls or self.tls or TlsSettings()
                stream = await TLSStream.wrap(
                    stream,
                    hostname=settings.server_hostname or host,
                    ssl_context=settings.client_context(),
                    standard_compatible=False,
                )
        async with stream:
            codec = ClientCodec(self.protocol)
            reader = PacketReader(256 * 1024 * 1024)
            await stream.send(
                codec.connect(
                    self.client_id,
                    clean_start=False,
                    keep_alive=self.keepalive,
                    username=remote.username or self.username,
                    password=remote.password or self.password,
                    session_expiry=self.session_expiry,
                    receive_max=self.window,
                )
            )
            with clock.fail_after(10):
                connack = await _next(stream, reader, codec)
            if not hasattr(connack, "session_present") or int(connack.reason_code) != 0:
                raise _Refused(
                    f"the broker refused the login: {getattr(connack, 'reason_code', connack)!r}"
                )
            self.remote_url = remote.url
            self._up_since = clock.monotonic()
            self._stream = stream
            self._codec = codec
            self._out = []
            self.opened(f"mqtt:{host}:{port}")
            if self._wants:
                filters = list(dict.fromkeys(self._wants.values()))
                await stream.send(
                    codec.subscribe(self._packet_id(), [(f, self.qos) for f in filters])
                )
            self.set_state(LinkState.IN_SYNC)
            try:
                failure: list[BaseException] = []
                async with anyio.create_task_group() as tg:

                    async def guarded(part: Any, *args: Any) -> None:
                        # The first part to end ends the others; what ended it is
                        # raised once they have all stopped (not as an exception group).
                        try:
                            await part(*args)
                        except _FAILURES as exc:
                            failure.append(exc)
                        tg.cancel_scope.cancel()

                    tg.start_soon(guarded, self._writer, stream)
                    tg.start_soon(guarded, self._pinger, codec)
                    if self.queue is not None:
                        tg.start_soon(guarded, self._pump, codec)
                    if self.fail_back is not None and self._at > 0:
                        tg.start_soon(guarded, self._fail_back, tg.cancel_scope)
                    await guarded(self._reader, stream, reader, codec)
                if failure:
                    raise failure[0]
            finally:
                self._stream = None
                if self._codec is codec:
                    self._down(f"{remote.url}: connection closed")
        raise anyio.EndOfStream("the broker closed the connection")

    async def _writer(self, stream: anyio.abc.ByteStream) -> None:
        while True:
            if not self._out:
                self._wake = anyio.Event()
                await self._wake.wait()
                continue
            data, self._out = b"".join(self._out), []
            await stream.send(data)
            if self._closing and not self._out:
                self._drained.set()  # the DISCONNECT is written: the connection may close

    async def _pinger(self, codec: ClientCodec) -> None:
        clock = self.vpn.node.clock
        while True:
            await clock.sleep_until(clock.monotonic() + self.keepalive / 2)
            self._queue_out(codec.pingreq())

    async def _fail_back(self, scope: anyio.CancelScope) -> None:
        """Leave this remote for the first one once it accepts connections again."""
        assert self.fail_back is not None
        clock = self.vpn.node.clock
        _, host, port = parse_mqtt_url(self.remotes[0].url)
        while True:
            await clock.sleep_until(clock.monotonic() + self.fail_back)
            try:
                with clock.fail_after(5):
                    probe = await anyio.connect_tcp(host, port)
                await probe.aclose()
            except (OSError, TimeoutError):
                continue
            self._at = -1  # run() moves on to the first
            scope.cancel()
            return

    async def _reader(
        self, stream: anyio.abc.ByteStream, reader: PacketReader, codec: ClientCodec
    ) -> None:
        clock = self.vpn.node.clock
        while True:
            with clock.fail_after(self.keepalive * 1.5):
                data = await stream.receive(65536)
            for raw in reader.feed(data):
                packet = codec.read_server(raw)
                if isinstance(packet, PublishPacket | Publish311):
                    await self._incoming(packet, codec)
                elif isinstance(packet, PubAckPacket):
                    message = self._inflight.pop(packet.packet_id, None)
                    if message is not None and self._flow is not None:
                        self._flow.ack(message)
                        self.settled(message)
                elif isinstance(packet, PubRelPacket):
                    self._queue_out(codec.ack(7, packet.packet_id))
                elif isinstance(packet, SubAckPacket):
                    failed = [c for c in packet.reason_codes if int(c) >= 0x80]
                    if failed:
                        self.reason = f"the broker refused {len(failed)} subscription(s)"
                        log.warning("MQTT bridge %s: %s", self.name, self.reason)

    async def _incoming(self, packet: AnyPublish, codec: ClientCodec) -> None:
        topic, payload = packet.topic, packet.payload
        qos = int(packet.qos)
        if not codec.v5 and self._echo(topic, payload):
            self.count_drop("duplicate")
        elif not self._wanted(topic):
            self.count_drop("not_subscribed")  # '#' also matched the parent level
        else:
            message = self._message(packet, codec)
            if qos == 0:
                self.receive(message)
            else:
                await self._spool(message)
        if qos:
            self._queue_out(codec.ack(4 if qos == 1 else 5, packet.packet_id or 0))

    def _wanted(self, topic: str) -> bool:
        from meshbus import filter_matches

        return any(filter_matches(f, topic) for f in self._wants)

    def _message(self, packet: AnyPublish, codec: ClientCodec) -> Message:
        hops = 0
        options: dict[str, Any] = {}
        if codec.v5:
            options = publish_options(packet)
            headers = options.get("headers")
            if headers and HOP_COUNT_PROPERTY in headers:
                text = take_header(headers, HOP_COUNT_PROPERTY)
                hops = int(text) if isinstance(text, str) and text.isdigit() else 0
                if not headers:
                    del options["headers"]
        ttl = packet.message_expiry_interval if codec.v5 else None
        now = self.vpn.node.clock.time()
        return Message(
            packet.topic,
            packet.payload,
            _PERSISTENT if packet.qos else DeliveryMode.DIRECT,
            options.get("headers", {}),
            reply_to=options.get("reply_to"),
            correlation_id=options.get("correlation_id"),
            timestamp=now,
            hop_count=hops,
            expires_at=now + ttl if ttl else None,
            retain=packet.retain,
            # DUP: the broker saw no PUBACK for it, so it may be here already (see
            # meshbus.plugins.guaranteed._link_ingress: a second copy keeps the flag).
            redelivered=bool(packet.qos) and packet.duplicate,
        )

    async def _spool(self, message: Message) -> None:
        """Spool a QoS 1/2 message before the broker is acknowledged; one an endpoint
        refuses is tried again every second (holding up this connection's reading)."""
        clock = self.vpn.node.clock
        while True:
            try:
                await self.receive_guaranteed(message)
                return
            except PublishRejectedError as exc:
                self.reason = f"a message from the broker was refused here: {exc}"
                await clock.sleep_until(clock.monotonic() + 1.0)

    async def _pump(self, codec: ClientCodec) -> None:
        """The bridge's queue to the broker at QoS 1, a window at a time."""
        assert self.queue is not None
        # The node's own session, whatever the VPN's authentication.
        session: Session = self.vpn.open_internal_session("pump:" + self.name.replace("/", ":"))
        try:
            flow = await session.bind(self.queue, window=self.window)
            self._flow = flow
            async for message in flow:
                out = self.outgoing(message)
                if out is None:
                    flow.ack(message)
                    continue
                packet_id = self._packet_id()
                self._inflight[packet_id] = message
                self._queue_out(self._publish(codec, out, out.hop_count, 1, packet_id))
        except MeshbusError as exc:
            log.warning("MQTT bridge %s: its queue's flow ended: %s", self.name, exc)
        finally:
            self._flow = None
            session.close()


async def _next(stream: anyio.abc.ByteStream, reader: PacketReader, codec: ClientCodec) -> Any:
    while True:
        packets = reader.feed(await stream.receive(65536))
        if packets:
            return codec.read_server(packets[0])


def _properties(message: Message, hops: int, now: float) -> dict[str, Any] | None:
    """A bridged message's MQTT 5 properties: as for a client, and its hop count."""
    return v5_properties(message, now, ((HOP_COUNT_PROPERTY, str(hops)),) if hops else ())
