"""Frames and stream compression, sans-IO: round trips and every rejection (SPEC 10)."""

from __future__ import annotations

import itertools
import struct
import zlib
from typing import Any

import lz4.frame
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshbus.errors import ProtocolError
from meshbus.transports._compression import ALGORITHMS, Compressor, Decompressor
from meshbus.transports._framing import (
    HEADER_DEPTH_LIMIT,
    HEADER_LIMIT,
    FrameDecoder,
    FrameKind,
    encode_frame,
)

PREFIX = struct.Struct("!IBI")  # length | kind | header length


def raw_frame(kind: int, head: bytes, payload: bytes = b"", *, length: int | None = None) -> bytes:
    """A frame with a header given as bytes (so it can be invalid), and maybe a false length."""
    if length is None:
        length = 5 + len(head) + len(payload)
    return PREFIX.pack(length, kind, len(head)) + head + payload


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at ``cuts`` (any positions, any order, repeats allowed)."""
    points = sorted({0, len(data), *(min(c, len(data)) for c in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(codec="utf-8"), max_size=20),
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.dictionaries(st.text(st.characters(codec="utf-8"), max_size=10), inner, max_size=5)
    ),
    max_leaves=20,
)
frames = st.lists(
    st.tuples(st.sampled_from(FrameKind), json_values, st.binary(max_size=300)), max_size=8
)


# --- encoding and decoding ------------------------------------------------------------------


def test_a_frame_is_length_kind_header_length_header_payload() -> None:
    frame = encode_frame(FrameKind.PUBLISH, ["a/b"], b"xyz")
    head = b'["a/b"]'
    assert frame == struct.pack("!IBI", 5 + len(head) + 3, 20, len(head)) + head + b"xyz"
    assert FrameDecoder(1024).feed(frame) == [(FrameKind.PUBLISH, ["a/b"], b"xyz")]


@settings(max_examples=200, deadline=None)
@given(frames=frames, cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=12))
def test_frames_round_trip_whatever_the_chunking(
    frames: list[tuple[FrameKind, Any, bytes]], cuts: list[int]
) -> None:
    data = b"".join(encode_frame(kind, header, payload) for kind, header, payload in frames)
    decoder = FrameDecoder(max_frame_size=1024 * 1024)
    got = []
    for chunk in split(data, cuts):
        got += decoder.feed(chunk)
    assert got == frames
    assert decoder.buffered == 0


@settings(max_examples=100, deadline=None)
@given(frames=frames, data=st.data())
def test_frames_round_trip_one_byte_at_a_time_and_with_a_limit(
    frames: list[tuple[FrameKind, Any, bytes]], data: st.DataObject
) -> None:
    encoded = b"".join(encode_frame(*frame) for frame in frames)
    decoder = FrameDecoder(max_frame_size=1024 * 1024)
    got = []
    for i in range(len(encoded)):
        got += decoder.feed(encoded[i : i + 1])
    assert got == frames
    limit = data.draw(st.integers(min_value=1, max_value=3), label="limit")
    decoder = FrameDecoder(max_frame_size=1024 * 1024)
    got = decoder.feed(encoded, limit=limit)
    while len(got) < len(frames):
        more = decoder.feed(b"", limit=limit)
        assert 1 <= len(more) <= limit  # never more than asked, never stuck
        got += more
    assert got == frames
    assert decoder.feed(b"", limit=limit) == []


def test_limit_leaves_the_rest_buffered() -> None:
    three = b"".join(encode_frame(FrameKind.PING, {"n": n}) for n in range(3))
    decoder = FrameDecoder(1024)
    assert decoder.feed(three, limit=1) == [(FrameKind.PING, {"n": 0}, b"")]
    assert decoder.buffered == len(three) * 2 // 3
    assert decoder.feed(b"", limit=5) == [(5, {"n": 1}, b""), (5, {"n": 2}, b"")]
    assert decoder.buffered == 0
    # limit=0 means no limit
    assert len(decoder.feed(three, limit=0)) == 3


def test_a_partial_frame_waits_for_the_rest() -> None:
    frame = encode_frame(FrameKind.OK, {"id": 1}, b"payload")
    decoder = FrameDecoder(1024)
    assert decoder.feed(frame[:-1]) == []
    assert decoder.buffered == len(frame) - 1
    assert decoder.feed(frame[-1:] + frame[:3]) == [(FrameKind.OK, {"id": 1}, b"payload")]
    assert decoder.buffered == 3


def test_take_buffer_empties_the_decoder() -> None:
    decoder = FrameDecoder(1024)
    decoder.feed(b"\x00\x00")
    assert decoder.take_buffer() == b"\x00\x00"
    assert decoder.buffered == 0
    assert decoder.take_buffer() == b""


def test_a_frame_of_exactly_the_limit_is_accepted() -> None:
    frame = encode_frame(FrameKind.DELIVER, ["t", None, 0], b"x" * 100)
    decoder = FrameDecoder(max_frame_size=len(frame) - 4)
    assert decoder.feed(frame) == [(FrameKind.DELIVER, ["t", None, 0], b"x" * 100)]
    with pytest.raises(ProtocolError, match="larger than the limit"):
        FrameDecoder(max_frame_size=len(frame) - 5).feed(frame)


def test_the_empty_payload_and_every_kind_decode() -> None:
    decoder = FrameDecoder(64)
    for kind in FrameKind:
        assert decoder.feed(encode_frame(kind, {})) == [(kind, {}, b"")]


# --- rejections -----------------------------------------------------------------------------


def test_an_oversized_length_is_refused_from_the_prefix_alone() -> None:
    # A 2 GB frame: only its 9-byte prefix is sent, and that is enough to refuse it.
    decoder = FrameDecoder(max_frame_size=32 * 1024 * 1024)
    prefix = PREFIX.pack(2 * 1024**3, FrameKind.PUBLISH, 10)
    assert decoder.feed(prefix[:8]) == []  # not yet a whole prefix
    with pytest.raises(
        ProtocolError, match=r"frame of 2147483648 bytes is larger than the limit of 33554432"
    ):
        decoder.feed(prefix[8:])
    assert decoder.buffered == 9  # nothing of the body was waited for


def test_the_largest_u32_length_is_refused() -> None:
    with pytest.raises(ProtocolError, match="larger than the limit"):
        FrameDecoder(1024).feed(b"\xff" * 9)


@pytest.mark.parametrize("length", [0, 1, 4])
def test_a_length_shorter_than_the_header_fields_is_refused(length: int) -> None:
    with pytest.raises(ProtocolError, match=f"frame length {length} is shorter than a frame"):
        FrameDecoder(1024).feed(PREFIX.pack(length, FrameKind.PING, 0))


@pytest.mark.parametrize("kind", [0, 7, 9, 14, 35, 41, 49, 51, 255])
def test_an_unknown_kind_is_refused(kind: int) -> None:
    assert kind not in set(FrameKind)
    with pytest.raises(ProtocolError, match=f"unknown frame kind {kind}$"):
        FrameDecoder(1024).feed(raw_frame(kind, b"{}"))


def test_a_header_longer_than_its_frame_is_refused_before_buffering() -> None:
    decoder = FrameDecoder(1024)
    prefix = PREFIX.pack(10, FrameKind.PING, 6)  # room for a 5-byte header only
    with pytest.raises(ProtocolError, match="header length 6 does not fit a frame of 10 bytes"):
        decoder.feed(prefix)
    # the largest header that fits is fine
    assert FrameDecoder(1024).feed(raw_frame(FrameKind.PING, b"{   }")) == [(5, {}, b"")]


def test_a_header_over_header_limit_is_refused_whatever_the_frame_limit() -> None:
    decoder = FrameDecoder(max_frame_size=4 * HEADER_LIMIT)
    prefix = PREFIX.pack(2 * HEADER_LIMIT, FrameKind.SUBSCRIBE, HEADER_LIMIT + 1)
    with pytest.raises(ProtocolError, match=f"header length {HEADER_LIMIT + 1} does not fit"):
        decoder.feed(prefix)
    # exactly HEADER_LIMIT is allowed
    head = b"[" + b" " * (HEADER_LIMIT - 2) + b"]"
    frame = raw_frame(FrameKind.PUBLISH, head, b"body")
    assert FrameDecoder(4 * HEADER_LIMIT).feed(frame) == [(FrameKind.PUBLISH, [], b"body")]


@pytest.mark.parametrize(
    "head",
    [b"", b"{", b"{'a': 1}", b"[1,]", b"nul", b'"\xff"', b"NaN", b"1e999", b"{} {}", b"\x00"],
)
def test_a_header_that_is_not_json_is_refused(head: bytes) -> None:
    with pytest.raises(ProtocolError, match="frame header is not valid JSON"):
        FrameDecoder(1024).feed(raw_frame(FrameKind.SUBSCRIBE, head))


def test_a_header_nested_too_deep_to_re_encode_is_refused() -> None:
    # orjson reads 1024 levels but writes only 254: a header the node could not
    # forward (re-encode) must be refused where it enters.
    depth = HEADER_DEPTH_LIMIT
    ok = b"[" * depth + b"]" * depth
    assert FrameDecoder(4096).feed(raw_frame(FrameKind.PING, ok))[0][0] == FrameKind.PING
    for head in (
        b"[" * (depth + 1) + b"]" * (depth + 1),
        b'{"a":' * (depth + 1) + b"1" + b"}" * (depth + 1),
        b'["t",{"h":{"k":' + b"[" * depth + b"]" * depth + b"}}]",
    ):
        with pytest.raises(ProtocolError, match="nested deeper than"):
            FrameDecoder(8192).feed(raw_frame(FrameKind.PUBLISH, head))
    # brackets inside strings do not count
    many = orjson.dumps(["[" * 1000, "{" * 1000])
    assert FrameDecoder(8192).feed(raw_frame(FrameKind.PUBLISH, many))[0][1][0] == "[" * 1000
    # wide is fine, only deep is refused
    wide = orjson.dumps([[[1]] for _ in range(1000)])
    assert len(FrameDecoder(1 << 20).feed(raw_frame(FrameKind.PUBLISH, wide))[0][1]) == 1000


def test_decoding_stops_at_the_first_bad_frame() -> None:
    good = encode_frame(FrameKind.PING, {})
    decoder = FrameDecoder(1024)
    with pytest.raises(ProtocolError, match="unknown frame kind 99"):
        decoder.feed(good + raw_frame(99, b"{}") + good)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.binary(max_size=200)
    | st.builds(
        lambda frames, i, b: frames[:i] + b + frames[i:],
        st.lists(st.sampled_from([encode_frame(k, {"x": [1]}, b"p") for k in FrameKind]))
        .map(b"".join)
        .filter(bool),
        st.integers(min_value=0, max_value=200),
        st.binary(min_size=1, max_size=12),
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=300), max_size=5),
)
def test_arbitrary_bytes_give_frames_or_a_protocol_error(data: bytes, cuts: list[int]) -> None:
    decoder = FrameDecoder(max_frame_size=512)
    try:
        for chunk in split(data, cuts):
            for kind, header, payload in decoder.feed(chunk):
                assert kind in set(FrameKind)
                assert isinstance(payload, bytes)
                orjson.dumps(header)  # whatever came out can be written again
    except ProtocolError:
        pass
    assert decoder.buffered <= len(data)


def test_accept_limits_the_kinds_and_the_header_shapes() -> None:
    accept = {int(FrameKind.PING): dict, int(FrameKind.PUBLISH): list}
    ok = encode_frame(FrameKind.PING, {}) + encode_frame(FrameKind.PUBLISH, ["t"], b"x")
    assert FrameDecoder(1024, accept).feed(ok) == [(5, {}, b""), (20, ["t"], b"x")]
    with pytest.raises(ProtocolError, match=r"^DELIVER frames are not accepted here$"):
        FrameDecoder(1024, accept).feed(encode_frame(FrameKind.DELIVER, ["t", None, 0]))
    with pytest.raises(ProtocolError, match=r"^unknown frame kind 99$"):
        FrameDecoder(1024, accept).feed(raw_frame(99, b"{}"))
    with pytest.raises(ProtocolError, match=r"^PING frame has a malformed header$"):
        FrameDecoder(1024, accept).feed(encode_frame(FrameKind.PING, []))
    with pytest.raises(ProtocolError, match=r"^PUBLISH frame has a malformed header$"):
        FrameDecoder(1024, accept).feed(encode_frame(FrameKind.PUBLISH, {"t": 1}))
    # the kind is refused from the prefix, before the frame's bytes arrive
    with pytest.raises(ProtocolError, match="not accepted here"):
        FrameDecoder(1024, accept).feed(PREFIX.pack(500, FrameKind.SEND, 2))


# --- compression ----------------------------------------------------------------------------


def inflate_all(decompressor: Decompressor, data: bytes) -> bytes:
    out = [decompressor.decompress(data)]
    while decompressor.has_more:
        out.append(decompressor.decompress(b""))
    assert all(len(piece) <= decompressor.max_output for piece in out)
    return b"".join(out)


def test_lz4_is_preferred_and_zlib_kept_for_older_peers() -> None:
    assert ALGORITHMS == ("lz4", "zlib")


def test_an_unknown_algorithm_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="unknown compression 'brotli'"):
        Compressor("brotli")
    with pytest.raises(ProtocolError, match="unknown compression 'brotli'"):
        Decompressor(1024, "brotli")


algorithms = pytest.mark.parametrize("algorithm", ALGORITHMS)


@algorithms
@settings(max_examples=200, deadline=None)
@given(
    writes=st.lists(
        st.binary(max_size=3000) | st.builds(bytes, st.integers(0, 20000)), max_size=10
    ),
    max_output=st.sampled_from([1, 7, 512, 4096, 1 << 20]),
)
def test_writes_sharing_one_stream_each_decode_at_once(
    algorithm: str, writes: list[bytes], max_output: int
) -> None:
    compressor = Compressor(algorithm)
    decompressor = Decompressor(max_output, algorithm)
    for data in writes:
        assert inflate_all(decompressor, compressor.compress(data)) == data
        assert not decompressor.has_more


@algorithms
def test_the_dictionary_carries_over_between_writes(algorithm: str) -> None:
    compressor = Compressor(algorithm)
    decompressor = Decompressor(1 << 20, algorithm)
    message = encode_frame(FrameKind.DELIVER, ["orders/eu/new", "client-1", 1.5], b"q" * 50)
    first = compressor.compress(message)
    second = compressor.compress(message)
    assert len(second) < len(first)
    assert inflate_all(decompressor, first) == message
    assert inflate_all(decompressor, second) == message


@algorithms
def test_compressed_bytes_split_anywhere_decode(algorithm: str) -> None:
    compressor = Compressor(algorithm)
    data = b"".join(encode_frame(FrameKind.PING, {"n": n}) for n in range(50))
    compressed = compressor.compress(data)
    for cut in range(0, len(compressed) + 1, 7):
        decompressor = Decompressor(64, algorithm)
        got = inflate_all(decompressor, compressed[:cut]) + inflate_all(
            decompressor, compressed[cut:]
        )
        assert got == data


@pytest.mark.parametrize(
    "data",
    [b"not zlib at all", b"\x78\x9c\xff\xff\xff\xff", b"\x00" * 20],
)
@algorithms
def test_corrupt_data_is_a_protocol_error(algorithm: str, data: bytes) -> None:
    with pytest.raises(ProtocolError, match="compressed data is corrupt"):
        # (padded: an LZ4 decoder waits for a whole frame header before it judges one)
        inflate_all(Decompressor(1024, algorithm), data + b"\xff" * 8)


@algorithms
def test_corruption_later_in_the_stream_is_a_protocol_error(algorithm: str) -> None:
    compressor = Compressor(algorithm)
    decompressor = Decompressor(1024, algorithm)
    assert inflate_all(decompressor, compressor.compress(b"hello")) == b"hello"
    bad = bytearray(compressor.compress(b"world" * 100))
    bad[1] ^= 0xFF
    bad[2] ^= 0xFF
    with pytest.raises(ProtocolError, match="compressed data is corrupt"):
        inflate_all(decompressor, bytes(bad) + b"\xff" * 8)


@algorithms
def test_a_finished_stream_is_a_protocol_error(algorithm: str) -> None:
    # The stream claims to be over: zlib's Z_FINISH, LZ4's end mark.
    finished = (zlib.compress if algorithm == "zlib" else lz4.frame.compress)(b"the end")
    with pytest.raises(ProtocolError, match="compressed stream ended before the connection"):
        Decompressor(1024, algorithm).decompress(finished)


@algorithms
def test_a_decompression_bomb_inflates_at_most_max_output_per_step(algorithm: str) -> None:
    size = 50 * 1024 * 1024
    bomb = Compressor(algorithm).compress(bytes(size))
    assert len(bomb) < size // 100
    decompressor = Decompressor(1024 * 1024, algorithm)
    total = steps = 0
    out = decompressor.decompress(bomb)
    while True:
        steps += 1
        assert len(out) <= 1024 * 1024
        assert out.count(0) == len(out)
        total += len(out)
        if not decompressor.has_more:
            break
        out = decompressor.decompress(b"")
    assert total == size
    assert steps >= 50
    # what is left over is the compressed input, never inflated output
    assert decompressor.decompress(b"") == b""
