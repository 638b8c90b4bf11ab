"""The sans-IO link protocol: handshake, compression switch, roles, keepalive (SPEC 10)."""

from __future__ import annotations

import struct
import zlib
from typing import Any

import orjson
import pytest

from meshbus.errors import ProtocolError
from meshbus.transports import _events as ev
from meshbus.transports._compression import ALGORITHMS
from meshbus.transports._events import CONTROL_KINDS, decode_event
from meshbus.transports._framing import FrameDecoder, FrameKind, encode_frame
from meshbus.transports._protocol import PROTOCOL_VERSION, ConnectionState, LinkProtocol, Role
from meshbus.transports._settings import MAX_FRAME_SIZE

K = FrameKind
LIMIT = 64 * 1024

SERVER_RECEIVES = {
    K.CLOSE,
    K.PING,
    K.PONG,
    K.SUBSCRIBE,
    K.UNSUBSCRIBE,
    K.PUBLISH,
    K.PUBLISH_BATCH,
    K.SEND,
    K.BIND,
    K.UNBIND,
    K.ACK,
    K.REQUEST,
    K.ADVERTISE,
}
CLIENT_RECEIVES = {
    K.CLOSE,
    K.PING,
    K.PONG,
    K.OK,
    K.ERROR,
    K.DELIVER,
    K.DELIVER_BATCH,
    K.FLOW_DELIVER,
    K.FLOW_CLOSED,
    K.ADVERTISE,
}
ARRAY_HEADERS = {K.PUBLISH, K.DELIVER, K.FLOW_DELIVER, K.PUBLISH_BATCH, K.DELIVER_BATCH}


VALID_HEADERS: dict[FrameKind, Any] = {
    K.HELLO: {"version": 1},
    K.WELCOME: {},
    K.REFUSED: {"error": "refused", "message": "no"},
    K.CLOSE: {"reason": "bye"},
    K.PING: {},
    K.PONG: {},
    K.SUBSCRIBE: {"id": 1, "subscription": "t"},
    K.UNSUBSCRIBE: {"id": 1, "subscription": "t"},
    K.OK: {"id": 1},
    K.ERROR: {"id": 1, "error": "state", "message": "no"},
    K.SEND: {"id": 1, "topic": "t"},
    K.BIND: {"id": 1, "queue": "q"},
    K.UNBIND: {"id": 1, "flow": 1},
    K.ACK: {"flow": 1, "ids": [1]},
    K.FLOW_CLOSED: {"flow": 1, "reason": "gone"},
    K.ADVERTISE: {"v": 1, "epoch": 1, "seq": 0},
    K.REQUEST: {"id": 1, "what": "sync"},
}


def header_for(kind: FrameKind) -> Any:
    """A valid header for ``kind``."""
    if kind in ARRAY_HEADERS:
        return ["t", None, 0.0]
    return VALID_HEADERS[kind]


def frames_of(data: bytes) -> list[tuple[int, Any, bytes]]:
    """The frames in ``data`` as the protocol returns them: control frames as events."""
    return [
        (kind, decode_event(kind, header) if kind in CONTROL_KINDS else header, payload)
        for kind, header, payload in FrameDecoder(LIMIT).feed(data)
    ]


def welcome_event(**fields: Any) -> ev.Welcome:
    """The WELCOME event of a server made here (a WELCOME with these fields)."""
    wanted = {
        "client_name": None,
        "vpn": None,
        "node": None,
        "node_id": None,
        "cluster": None,
        "keepalive": 10.0,
        "keepalive_timeout": 30.0,
        "max_frame_size": LIMIT,
        "compression": None,
        "link": None,
        **fields,
    }
    return ev.Welcome(**wanted)


def pair(
    *, offer: list[str] | None = None, compression: str | None = None
) -> tuple[LinkProtocol, LinkProtocol]:
    """A client and a server, logged in; the WELCOME has been received."""
    client = LinkProtocol(Role.CLIENT, max_frame_size=LIMIT)
    server = LinkProtocol(Role.SERVER, max_frame_size=LIMIT)
    client.hello({"vpn": "default", **({"compression": offer} if offer is not None else {})})
    [(kind, _hello, _)] = server.receive_data(client.data_to_send())
    assert kind == K.HELLO
    server.accept({"client_name": "c"}, compression=compression)
    [(kind, welcome, _)] = client.receive_data(server.data_to_send())
    assert kind == K.WELCOME
    assert welcome.compression == compression
    return client, server


# --- handshake ------------------------------------------------------------------------------


def test_handshake_without_compression() -> None:
    client = LinkProtocol(Role.CLIENT, max_frame_size=LIMIT)
    server = LinkProtocol(Role.SERVER, max_frame_size=LIMIT)
    assert client.state is server.state is ConnectionState.HANDSHAKE
    client.hello({"vpn": "v", "username": "u", "password": "p"})
    hello_bytes = client.data_to_send()
    assert FrameDecoder(LIMIT).feed(hello_bytes) == [
        (
            K.HELLO,
            {
                "vpn": "v",
                "username": "u",
                "password": "p",
                "version": 1,
                "max_frame_size": LIMIT,
                "compression": [],
            },
            b"",
        )
    ]
    assert server.receive_data(hello_bytes) == [
        (K.HELLO, ev.Hello("v", "u", "p", None, False, False, (), LIMIT, None), b"")
    ]
    assert server.state is ConnectionState.HANDSHAKE  # until accept()
    server.accept({"client_name": "c1"}, compression=None)
    assert server.state is ConnectionState.OPEN
    assert server.compression is None
    welcome = server.data_to_send()
    assert FrameDecoder(LIMIT).feed(welcome) == [
        (K.WELCOME, {"max_frame_size": LIMIT, "client_name": "c1", "compression": None}, b"")
    ]
    assert client.receive_data(welcome) == [(K.WELCOME, welcome_event(client_name="c1"), b"")]
    assert client.state is ConnectionState.OPEN
    assert client.compression is None
    # both directions, plain frames on the wire
    client.send(K.PUBLISH, ["a/b"], b"payload")
    data = client.data_to_send()
    assert data == encode_frame(K.PUBLISH, ["a/b"], b"payload")
    assert server.receive_data(data) == [(K.PUBLISH, ["a/b"], b"payload")]
    server.send(K.DELIVER, ["a/b", "c1", 1.0], b"payload")
    assert client.receive_data(server.data_to_send()) == [
        (K.DELIVER, ["a/b", "c1", 1.0], b"payload")
    ]
    assert client.data_to_send() == server.data_to_send() == b""


@pytest.mark.parametrize("offer", [None, [], ["lz4"], ["zlib"]])
def test_the_client_offers_what_it_is_given(offer: list[str] | None) -> None:
    client = LinkProtocol(Role.CLIENT, max_frame_size=LIMIT)
    client.hello({} if offer is None else {"compression": offer})
    [(_, hello, _)] = FrameDecoder(LIMIT).feed(client.data_to_send())
    assert hello == {
        "version": PROTOCOL_VERSION,
        "max_frame_size": LIMIT,
        "compression": offer or [],
    }


def test_frames_after_the_welcome_in_the_same_chunk_without_compression() -> None:
    client = LinkProtocol(Role.CLIENT, max_frame_size=LIMIT)
    server = LinkProtocol(Role.SERVER, max_frame_size=LIMIT)
    client.hello({})
    server.receive_data(client.data_to_send())
    server.accept({}, compression=None)
    server.send(K.DELIVER, ["t", None, 0], b"1")
    server.send(K.PING, {})
    got = client.receive_data(server.data_to_send())
    assert [kind for kind, _, _ in got] == [K.WELCOME, K.DELIVER, K.PING]
    assert frames_of(client.data_to_send()) == [(K.PONG, ev.Pong(), b"")]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_handshake_with_compression_in_both_directions(algorithm: str) -> None:
    client = LinkProtocol(Role.CLIENT, max_frame_size=LIMIT)
    server = LinkProtocol(Role.SERVER, max_frame_size=LIMIT)
    client.hello({"compression": [algorithm]})
    [(_, hello, _)] = server.receive_data(client.data_to_send())
    assert hello.compression == (algorithm,)
    server.accept({"client_name": "c"}, compression=algorithm)
    assert server.compression == algorithm
    # frames queued right after accept() travel in the same write as the WELCOME
    body = b"z" * 5000
    for n in range(20):
        server.send(K.DELIVER, ["a/b", "x", n], body)
    sent = server.data_to_send()
    welcome_header = {"max_frame_size": LIMIT, "client_name": "c", "compression": algorithm}
    welcome = encode_frame(K.WELCOME, welcome_header)
    assert sent.startswith(welcome)  # the WELCOME itself is plain
    assert len(sent) < len(welcome) + 5000  # the rest is compressed
    got = client.receive_data(sent)
    while client.has_pending_input:  # inflated a bounded step at a time
        got += client.receive_data(b"")
    assert client.state is ConnectionState.OPEN
    assert client.compression == algorithm
    assert got[0] == (K.WELCOME, welcome_event(client_name="c", compression=algorithm), b"")
    assert got[1:] == [(K.DELIVER, ["a/b", "x", n], body) for n in range(20)]
    # client to server, compressed
    client.send(K.PUBLISH, ["a/b"], body)
    client.send(K.SUBSCRIBE, {"id": 1, "subscription": "a/>"})
    data = client.data_to_send()
    assert len(data) < 1000
    with pytest.raises(ProtocolError):
        FrameDecoder(LIMIT).feed(data)  # not readable as plain frames
    assert server.receive_data(data) == [
        (K.PUBLISH, ["a/b"], body),
        (K.SUBSCRIBE, ev.Subscribe(1, "a/>"), b""),
    ]
    # and back again on the same streams
    server.send(K.OK, {"id": 1})
    assert client.receive_data(server.data_to_send()) == [(K.OK, ev.Ok(1, {}), b"")]


def test_welcome_and_compressed_frames_split_at_every_byte() -> None:
    server = LinkProtocol(Role.SERVER, max_frame_size=LIMIT)
    client = LinkProtocol(Role.CLIENT, max_frame_size=LIMIT)
    client.hello({"compression": ["zlib"]})
    server.receive_data(client.data_to_send())
    server.accept({}, compression="zlib")
    server.send(K.OK, {"id": 7})
    server.send(K.DELIVER, ["t", None, 1], b"abc" * 30)
    sent = server.data_to_send()
    expected = [
        (K.WELCOME, welcome_event(compression="zlib"), b""),
        (K.OK, ev.Ok(7, {}), b""),
        (K.DELIVER, ["t", None, 1], b"abc" * 30),
    ]
    for cut in range(len(sent) + 1):
        client = LinkProtocol(Role.CLIENT, max_frame_size=LIMIT)
        client.hello({"compression": ["zlib"]})
        got = client.receive_data(sent[:cut]) + client.receive_data(sent[cut:])
        assert got == expected, cut


def test_the_server_may_decline_compression_that_was_offered() -> None:
    client, server = pair(offer=["zlib"], compression=None)
    client.send(K.PING, {})
    data = client.data_to_send()
    assert data == encode_frame(K.PING, {})
    assert server.receive_data(data) == [(K.PING, ev.Ping(), b"")]


def test_welcome_naming_an_unknown_algorithm_is_refused() -> None:
    client = LinkProtocol(Role.CLIENT, max_frame_size=LIMIT)
    client.hello({})
    with pytest.raises(ProtocolError, match="unknown compression 'brotli'"):
        client.receive_data(encode_frame(K.WELCOME, {"compression": "brotli"}))
    assert client.state is ConnectionState.CLOSED
    with pytest.raises(ProtocolError, match="unknown compression"):
        LinkProtocol(Role.SERVER, max_frame_size=LIMIT).accept({}, compression="brotli")


def test_welcome_with_a_malformed_compression_is_refused() -> None:
    client = LinkProtocol(Role.CLIENT, max_frame_size=LIMIT)
    with pytest.raises(ProtocolError, match="WELCOME names a malformed compression"):
        client.receive_data(encode_frame(K.WELCOME, {"compression": ["zlib"]}))


def test_a_corrupt_compressed_stream_closes_the_connection() -> None:
    _client, server = pair(offer=["zlib"], compression="zlib")
    with pytest.raises(ProtocolError, match="compressed data is corrupt"):
        server.receive_data(b"\xff" * 32)
    assert server.state is ConnectionState.CLOSED
    assert server.close_reason is not None
    assert server.close_reason.startswith("compressed data is corrupt")
    assert server.receive_data(b"anything") == []  # closed: ignored


def test_a_compressed_frame_over_the_limit_is_refused() -> None:
    client, server = pair(offer=["zlib"], compression="zlib")
    client.send(K.PUBLISH, ["t"], bytes(LIMIT))  # compresses to almost nothing
    with pytest.raises(ProtocolError, match="larger than the limit"):
        server.receive_data(client.data_to_send())


def test_one_read_of_a_compressed_frame_flood_inflates_a_bounded_amount() -> None:
    _client, server = pair(offer=["zlib"], compression="zlib")
    ping = encode_frame(K.PING, {})
    compressor = zlib.compressobj(9)
    flood = compressor.compress(ping * 100_000) + compressor.flush(zlib.Z_SYNC_FLUSH)
    assert len(flood) < 4 * 1024  # 1.1 MB of frames in one small read
    frames = server.receive_data(flood)
    assert len(frames) * len(ping) <= 4 * LIMIT
    total = len(frames)
    while server.has_pending_input:  # the rest comes out step by step, none lost
        step = server.receive_data(b"")
        assert len(step) * len(ping) <= 4 * LIMIT
        total += len(step)
    assert total == 100_000


# --- refusal and bad handshakes ---------------------------------------------------------------


def test_refusal() -> None:
    client = LinkProtocol(Role.CLIENT, max_frame_size=LIMIT)
    server = LinkProtocol(Role.SERVER, max_frame_size=LIMIT)
    client.hello({"username": "u", "password": "wrong"})
    server.receive_data(client.data_to_send())
    server.refuse("authentication", "wrong password")
    assert server.state is ConnectionState.CLOSED
    assert server.close_reason == "refused: wrong password"
    data = server.data_to_send()  # still written after the close
    assert FrameDecoder(LIMIT).feed(data) == [
        (
            K.REFUSED,
            {"error": "authentication", "message": "wrong password", "why": "wrong password"},
            b"",
        )
    ]
    refused = ev.Refused("authentication", "wrong password", "wrong password", None)
    assert client.receive_data(data) == [(K.REFUSED, refused, b"")]
    assert client.state is ConnectionState.CLOSED
    assert client.close_reason == "refused: wrong password"
    server = LinkProtocol(Role.SERVER, max_frame_size=LIMIT)
    server.refuse("authentication", "user 'u' may not connect: wrong password", "wrong password")
    [(_, refused, _)] = frames_of(server.data_to_send())
    assert refused.why == "wrong password"
    with pytest.raises(ProtocolError, match=r"connection is closed \(refused: wrong password\)"):
        client.send(K.PING, {})
    with pytest.raises(ProtocolError, match="connection is closed"):
        server.send(K.PING, {})
    assert client.receive_data(encode_frame(K.PING, {})) == []


def test_frames_after_refused_are_ignored() -> None:
    client = LinkProtocol(Role.CLIENT, max_frame_size=LIMIT)
    client.hello({})
    data = encode_frame(K.REFUSED, {"error": "refused", "message": "no"}) + b"\xff" * 20
    [(kind, _, _)] = client.receive_data(data)
    assert kind == K.REFUSED
    assert client.state is ConnectionState.CLOSED


@pytest.mark.parametrize("kind", sorted(set(FrameKind) - {K.HELLO}))
def test_the_server_expects_hello_first(kind: FrameKind) -> None:
    server = LinkProtocol(Role.SERVER, max_frame_size=LIMIT)
    with pytest.raises(ProtocolError, match=f"expected HELLO, got {kind.name}|malformed header"):
        server.receive_data(encode_frame(kind, header_for(kind)))
    assert server.state is ConnectionState.CLOSED


@pytest.mark.parametrize("kind", sorted(set(FrameKind) - {K.WELCOME, K.REFUSED}))
def test_the_client_expects_welcome_or_refused_first(kind: FrameKind) -> None:
    client = LinkProtocol(Role.CLIENT, max_frame_size=LIMIT)
    client.hello({})
    with pytest.raises(
        ProtocolError, match=f"expected WELCOME or REFUSED, got {kind.name}|malformed header"
    ):
        client.receive_data(encode_frame(kind, header_for(kind)))
    assert client.state is ConnectionState.CLOSED


@pytest.mark.parametrize("version", [None, 0, 2, "1", 1.5, 1.0, True, [1]])
def test_a_version_the_server_does_not_speak_is_refused(version: Any) -> None:
    server = LinkProtocol(Role.SERVER, max_frame_size=LIMIT)
    hello = {} if version is None else {"version": version}
    with pytest.raises(ProtocolError, match=r"protocol version .* is not supported"):
        server.receive_data(encode_frame(K.HELLO, hello))


@pytest.mark.parametrize("offer", ["zlib", {"zlib": 1}, 1, None])
def test_a_compression_offer_that_is_not_a_list_is_refused(offer: Any) -> None:
    server = LinkProtocol(Role.SERVER, max_frame_size=LIMIT)
    with pytest.raises(ProtocolError, match="compression offer must be a list"):
        server.receive_data(encode_frame(K.HELLO, {"version": 1, "compression": offer}))


@pytest.mark.parametrize("kind", [K.HELLO, K.WELCOME, K.REFUSED])
@pytest.mark.parametrize("header", [[], ["version", 1], 1, "x", None, True])
def test_a_handshake_frame_needs_an_object_header(kind: FrameKind, header: Any) -> None:
    role = Role.SERVER if kind == K.HELLO else Role.CLIENT
    protocol = LinkProtocol(role, max_frame_size=LIMIT)
    with pytest.raises(ProtocolError, match=f"{kind.name} frame has a malformed header"):
        protocol.receive_data(encode_frame(kind, header))
    assert protocol.state is ConnectionState.CLOSED


def test_client_frames_in_the_same_chunk_as_hello_are_refused() -> None:
    client = LinkProtocol(Role.CLIENT, max_frame_size=LIMIT)
    client.hello({})
    data = client.data_to_send() + encode_frame(K.SUBSCRIBE, {"id": 1, "subscription": "a"})
    server = LinkProtocol(Role.SERVER, max_frame_size=LIMIT)
    with pytest.raises(ProtocolError, match="client sent frames before its login was answered"):
        server.receive_data(data)
    # even a partial frame after the HELLO
    server = LinkProtocol(Role.SERVER, max_frame_size=LIMIT)
    client = LinkProtocol(Role.CLIENT, max_frame_size=LIMIT)
    client.hello({})
    with pytest.raises(ProtocolError, match="before its login was answered"):
        server.receive_data(client.data_to_send() + b"\x00")


def test_each_side_learns_the_largest_frame_its_peer_reads() -> None:
    client = LinkProtocol(Role.CLIENT, max_frame_size=3 * LIMIT)
    server = LinkProtocol(Role.SERVER, max_frame_size=2 * LIMIT)
    assert client.peer_max_frame_size == server.peer_max_frame_size == MAX_FRAME_SIZE
    client.hello({})
    server.receive_data(client.data_to_send())
    assert server.peer_max_frame_size == 3 * LIMIT
    server.accept({}, compression=None)
    client.receive_data(server.data_to_send())
    assert client.peer_max_frame_size == 2 * LIMIT
    # A peer that does not say reads what meshbus read before it said.
    server = LinkProtocol(Role.SERVER, max_frame_size=LIMIT)
    server.receive_data(encode_frame(K.HELLO, {"version": 1}))
    assert server.peer_max_frame_size == MAX_FRAME_SIZE


@pytest.mark.parametrize("size", [0, -1, 1.5, "big", None, True])
@pytest.mark.parametrize("kind", [K.HELLO, K.WELCOME])
def test_a_malformed_max_frame_size_is_refused(kind: FrameKind, size: Any) -> None:
    role = Role.SERVER if kind == K.HELLO else Role.CLIENT
    protocol = LinkProtocol(role, max_frame_size=LIMIT)
    if role is Role.CLIENT:
        protocol.hello({})
    with pytest.raises(ProtocolError, match=f"{kind.name} max_frame_size must be a positive"):
        protocol.receive_data(encode_frame(kind, {"version": 1, "max_frame_size": size}))
    assert protocol.state is ConnectionState.CLOSED


@pytest.mark.parametrize("role", [Role.SERVER, Role.CLIENT])
def test_before_login_only_a_frame_of_the_handshake_size_is_read(role: Role) -> None:
    protocol = LinkProtocol(role, max_frame_size=16 * LIMIT, handshake_frame_size=2048)
    if role is Role.CLIENT:
        protocol.hello({})
    kind = K.HELLO if role is Role.SERVER else K.WELCOME
    with pytest.raises(ProtocolError, match="frame of 2049 bytes is larger than the limit of 2048"):
        protocol.receive_data(struct.pack("!IBI", 2049, kind, 10))  # the prefix is enough
    assert protocol.state is ConnectionState.CLOSED
    assert protocol.close_reason is not None
    assert protocol.close_reason.endswith(" before login")
    # after the handshake, frames up to max_frame_size
    server = LinkProtocol(Role.SERVER, max_frame_size=16 * LIMIT, handshake_frame_size=2048)
    client = LinkProtocol(Role.CLIENT, max_frame_size=16 * LIMIT, handshake_frame_size=2048)
    client.hello({})
    server.receive_data(client.data_to_send())
    server.accept({}, compression=None)
    client.receive_data(server.data_to_send())
    body = bytes(8 * LIMIT)
    client.send(K.PUBLISH, ["t"], body)
    server.send(K.DELIVER, ["t", None, 0], body)
    assert server.receive_data(client.data_to_send()) == [(K.PUBLISH, ["t"], body)]
    assert client.receive_data(server.data_to_send()) == [(K.DELIVER, ["t", None, 0], body)]


def test_client_frames_after_hello_before_welcome_are_refused() -> None:
    client = LinkProtocol(Role.CLIENT, max_frame_size=LIMIT)
    client.hello({})
    server = LinkProtocol(Role.SERVER, max_frame_size=LIMIT)
    server.receive_data(client.data_to_send())
    with pytest.raises(ProtocolError, match="expected HELLO, got SUBSCRIBE"):
        server.receive_data(encode_frame(K.SUBSCRIBE, {"id": 1, "subscription": "t"}))


def test_handshake_calls_belong_to_one_side_and_to_the_handshake() -> None:
    client = LinkProtocol(Role.CLIENT, max_frame_size=LIMIT)
    server = LinkProtocol(Role.SERVER, max_frame_size=LIMIT)
    with pytest.raises(ProtocolError, match=r"hello\(\) is for the client"):
        server.hello({})
    with pytest.raises(ProtocolError, match=r"accept\(\) is for the server"):
        client.accept({}, compression=None)
    with pytest.raises(ProtocolError, match=r"refuse\(\) is for the server"):
        client.refuse("x", "y")
    client, server = pair()
    with pytest.raises(ProtocolError, match=r"accept\(\) is for the server during the handshake"):
        server.accept({}, compression=None)
    with pytest.raises(ProtocolError, match=r"hello\(\)"):
        client.hello({})


# --- frames once open -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(FrameKind))
def test_what_a_server_accepts(kind: FrameKind) -> None:
    _, server = pair()
    data = encode_frame(kind, header_for(kind))
    if kind in SERVER_RECEIVES:
        assert server.receive_data(data) == frames_of(data)
    else:
        with pytest.raises(ProtocolError, match=f"^{kind.name} frames are not accepted here$"):
            server.receive_data(data)
        assert server.state is ConnectionState.CLOSED


@pytest.mark.parametrize("kind", list(FrameKind))
def test_what_a_client_accepts(kind: FrameKind) -> None:
    client, _ = pair()
    data = encode_frame(kind, header_for(kind))
    if kind in CLIENT_RECEIVES:
        assert client.receive_data(data) == frames_of(data)
    else:
        with pytest.raises(ProtocolError, match=f"^{kind.name} frames are not accepted here$"):
            client.receive_data(data)
        assert client.state is ConnectionState.CLOSED


@pytest.mark.parametrize("kind", sorted(SERVER_RECEIVES))
def test_server_frames_need_headers_of_the_right_shape(kind: FrameKind) -> None:
    right: Any = ["t"] if kind in ARRAY_HEADERS else header_for(kind)
    for header in (right, {"id": 1} if kind in ARRAY_HEADERS else ["t"], 1, "s", None, 1.5):
        client, server = pair(offer=["zlib"], compression="zlib")
        client.send(kind, header)
        data = client.data_to_send()
        if header is right:
            assert server.receive_data(data) == frames_of(encode_frame(kind, header))
        else:
            with pytest.raises(ProtocolError, match=f"{kind.name} frame has a malformed header"):
                server.receive_data(data)


@pytest.mark.parametrize("kind", sorted(CLIENT_RECEIVES))
def test_client_frames_need_headers_of_the_right_shape(kind: FrameKind) -> None:
    client, _ = pair()
    wrong: Any = {"id": 1} if kind in ARRAY_HEADERS else ["id", 1]
    with pytest.raises(ProtocolError, match=f"{kind.name} frame has a malformed header"):
        client.receive_data(encode_frame(kind, wrong))


def test_a_bad_frame_after_good_ones_in_one_read_is_still_an_error() -> None:
    _, server = pair()
    data = encode_frame(K.PING, {}) + encode_frame(K.DELIVER, ["t", None, 0])
    with pytest.raises(ProtocolError, match="DELIVER frames are not accepted here"):
        server.receive_data(data)
    assert server.state is ConnectionState.CLOSED
    with pytest.raises(ProtocolError):
        server.send(K.PONG, {})


@pytest.mark.parametrize("role", list(Role))
def test_ping_is_answered_with_pong(role: Role) -> None:
    client, server = pair()
    me, peer = (client, server) if role is Role.CLIENT else (server, client)
    peer.send(K.PING, {})
    peer.send(K.PING, {"n": 2})
    assert me.receive_data(peer.data_to_send(), now=5.0) == [
        (K.PING, ev.Ping(), b""),
        (K.PING, ev.Ping(), b""),
    ]
    assert frames_of(me.data_to_send()) == [(K.PONG, ev.Pong(), b""), (K.PONG, ev.Pong(), b"")]
    # a PONG is not answered
    assert me.receive_data(encode_frame(K.PONG, {})) == [(K.PONG, ev.Pong(), b"")]
    assert me.data_to_send() == b""


def test_ping_is_answered_on_a_compressed_link() -> None:
    client, server = pair(offer=["zlib"], compression="zlib")
    client.send(K.PING, {})
    assert server.receive_data(client.data_to_send()) == [(K.PING, ev.Ping(), b"")]
    assert client.receive_data(server.data_to_send()) == [(K.PONG, ev.Pong(), b"")]


@pytest.mark.parametrize(
    ("reason", "expected"), [("bye", "peer closed: bye"), (5, "peer closed: ?"), (None, "?")]
)
def test_close_from_the_peer(reason: Any, expected: str) -> None:
    _client, server = pair()
    header = {} if reason is None else {"reason": reason}
    event = ev.Close(reason if isinstance(reason, str) else "?")
    assert server.receive_data(encode_frame(K.CLOSE, header)) == [(K.CLOSE, event, b"")]
    assert server.state is ConnectionState.CLOSED
    assert server.close_reason is not None
    assert server.close_reason.endswith(expected)
    assert server.receive_data(encode_frame(K.PING, {})) == []
    with pytest.raises(ProtocolError, match="connection is closed"):
        server.send(K.OK, {"id": 1})


def test_close_sends_close_when_open_only() -> None:
    client, server = pair(offer=["zlib"], compression="zlib")
    client.close("done")
    assert client.state is ConnectionState.CLOSED
    assert client.close_reason == "done"
    assert server.receive_data(client.data_to_send()) == [(K.CLOSE, ev.Close("done"), b"")]
    assert server.close_reason == "peer closed: done"
    client.close("again")  # idempotent: the first reason stays
    assert client.close_reason == "done"
    assert client.data_to_send() == b""
    # during the handshake there is nothing to tell
    early = LinkProtocol(Role.CLIENT, max_frame_size=LIMIT)
    early.close("never mind")
    assert early.data_to_send() == b""
    assert early.close_reason == "never mind"


def test_data_frames_can_be_queued_raw() -> None:
    client, server = pair(offer=["zlib"], compression="zlib")
    frame = encode_frame(K.DELIVER, ["t", "s", 1], b"x")
    server.send_raw(frame)
    server.out.extend(frame)
    assert client.receive_data(server.data_to_send()) == [(K.DELIVER, ["t", "s", 1], b"x")] * 2


# --- bookkeeping ------------------------------------------------------------------------------


def test_keepalive_bookkeeping() -> None:
    client = LinkProtocol(Role.CLIENT, max_frame_size=LIMIT)
    server = LinkProtocol(Role.SERVER, max_frame_size=LIMIT)
    assert not server.ping_due(1000.0, 10.0)  # never during the handshake
    client.hello({})
    server.receive_data(client.data_to_send(now=100.0), now=100.0)
    assert server.last_received == 100.0
    server.accept({}, compression=None)
    client.receive_data(server.data_to_send(now=101.0), now=101.0)
    assert server.last_sent == 101.0
    assert not server.ping_due(110.9, 10.0)
    assert server.ping_due(111.0, 10.0)
    assert not server.peer_silent(129.9, 30.0)
    assert server.peer_silent(130.0, 30.0)
    client.send(K.PING, {})
    server.receive_data(client.data_to_send(now=120.0), now=120.0)
    assert not server.peer_silent(149.0, 30.0)
    assert server.peer_silent(150.0, 30.0)
    # answering the ping counts as sending
    server.data_to_send(now=121.0)
    assert server.last_sent == 121.0
    assert not server.ping_due(130.0, 10.0)
    # an empty write does not
    assert server.data_to_send(now=200.0) == b""
    assert server.last_sent == 121.0
    assert server.ping_due(200.0, 10.0)
    server.close("x")
    assert not server.ping_due(500.0, 10.0)


def test_byte_counters_count_what_crossed_the_wire() -> None:
    client = LinkProtocol(Role.CLIENT, max_frame_size=LIMIT)
    server = LinkProtocol(Role.SERVER, max_frame_size=LIMIT)
    client.hello({"compression": ["zlib"]})
    hello = client.data_to_send()
    for i in range(len(hello)):  # a byte at a time
        server.receive_data(hello[i : i + 1])
    assert client.bytes_sent == server.bytes_received == len(hello)
    server.accept({"n": "x" * 100}, compression="zlib")
    welcome = server.data_to_send(now=3.0)  # the WELCOME alone
    assert server.bytes_sent == len(welcome)
    assert server.last_sent == 3.0
    client.receive_data(welcome)
    assert client.bytes_received == len(welcome)
    server.send(K.DELIVER, ["t", None, 0], bytes(10_000))
    data = server.data_to_send()
    client.receive_data(data)
    assert server.bytes_sent == client.bytes_received == len(welcome) + len(data)
    assert len(data) < 1000  # compressed bytes are what is counted


def test_headers_written_are_orjson() -> None:
    client, server = pair()
    header = {"id": 3, "subscription": "ä/ö", "n": [1, 2.5, None, True]}
    client.send(K.SUBSCRIBE, header)
    data = client.data_to_send()
    assert orjson.dumps(header) in data
    assert FrameDecoder(LIMIT).feed(data) == [(K.SUBSCRIBE, header, b"")]
    assert server.receive_data(data) == [(K.SUBSCRIBE, ev.Subscribe(3, "ä/ö"), b"")]
