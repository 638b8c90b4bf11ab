"""Codec: decoding data-frame headers, today's orjson + hand checks against msgspec.

Run: ``.venv/bin/python bench/codec.py [--quick] [-v]`` (needs ``pip install msgspec``).
One line per figure: nanoseconds per message, the median of interleaved repeats.

What a data frame costs to decode on the receiving side is the header's JSON parse
plus the codec's checks (the payload is sliced, never copied or parsed):

* ``orjson+checks``: what meshbus does, :func:`orjson.loads` of the header bytes (as
  :class:`~meshbus.transports._framing.FrameDecoder` does for every frame) and then
  the codec's decoder (``decode_publish``, ``decode_publish_batch``,
  ``decode_deliver_batch``), which checks every field by hand;
* ``msgspec``: :class:`msgspec.json.Decoder` straight from the header bytes into
  ``array_like`` Structs with the same constraints (``strict``, ``Meta(ge=0)`` sizes,
  an ``UNSET`` trailing options item so ``[topic]`` and ``[topic, {}]`` stay apart,
  ``forbid_unknown_fields`` so an extra trailing item is refused as today),
  plus the checks msgspec cannot express (sizes adding up to the payload, the nesting
  of option values), building the same objects. This is the most a typed decoder can
  give: it needs the frame decoder to hand the codec header bytes, not parsed JSON;
* ``convert``: :func:`msgspec.convert` of the already-parsed header into the same
  Structs, the only way to use msgspec inside the codec as its API stands (the codec
  receives what ``FrameDecoder`` parsed). The orjson parse is counted here too.

Workloads, each asserted to decode to the same result both ways before timing:

* ``decode publish``: a plain PUBLISH header, ``["building/lobby/temperature"]``;
* ``decode publish+options``: ``[topic, {"h": {...3 headers}, "r": ..., "c": ...}]``;
* ``decode publish_batch 100``: PUBLISH_BATCH of 100 plain entries ``[topic, 100]``;
* ``decode deliver_batch 100``: DELIVER_BATCH of 100 ``[topic, sender, timestamp, 100]``,
  to :class:`~meshbus.Message` objects.

The machine is shared: each repeat times a fixed number of messages per decoder with
the thread's CPU time, decoders interleaved in rotating order; ``-v`` prints every
repeat's figures to show the spread.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Annotated, Any

import msgspec
import orjson
from _harness import clock, payloads, verdict
from msgspec import UNSET, Meta, Struct, UnsetType

from meshbus import Message
from meshbus._messages import DEFAULT_OPTIONS
from meshbus.errors import ProtocolError
from meshbus.transports._codec import (
    _check_nesting,
    decode_deliver_batch,
    decode_publish,
    decode_publish_batch,
    encode_deliver_batch,
    encode_publish,
    encode_publish_batch,
)

TOPIC = "building/lobby/temperature"
TARGET = 1.3  # what a typed decoder must win by on the hot decoders to be worth adopting

Size = Annotated[int, Meta(ge=0)]


class Publish(Struct, array_like=True, forbid_unknown_fields=True):
    topic: str
    options: UnsetType | dict[str, Any] = UNSET


class PublishItem(Struct, array_like=True, forbid_unknown_fields=True):
    topic: str
    size: Size
    options: UnsetType | dict[str, Any] | None = UNSET  # today's decoder takes null too


class DeliverItem(Struct, array_like=True, forbid_unknown_fields=True):
    topic: str
    sender: str | None
    timestamp: int | float | None
    size: Size
    options: UnsetType | dict[str, Any] = UNSET  # as today: options_from_wire checks these


_publish = msgspec.json.Decoder(Publish).decode
_publish_batch = msgspec.json.Decoder(list[PublishItem]).decode
_deliver_batch = msgspec.json.Decoder(list[DeliverItem]).decode
_convert = msgspec.convert
_loads = orjson.loads
_new = object.__new__


def ms_publish(item: Publish) -> tuple[str, dict[str, Any] | None]:
    options = item.options
    return item.topic, (None if options is UNSET else options)  # type: ignore[return-value]


def ms_publish_batch(items: list[PublishItem], payload: bytes) -> list[Any]:
    entries: list[Any] = []
    offset = 0
    total = len(payload)
    for item in items:
        end = offset + item.size
        if end > total:
            raise ProtocolError("PUBLISH_BATCH sizes exceed the payload")
        options = item.options
        if options is UNSET:
            options = None
        elif options is not None:
            for value in options.values():  # type: ignore[union-attr]
                if type(value) is dict or type(value) is list:
                    _check_nesting(value)
        entries.append((item.topic, payload[offset:end], options))
        offset = end
    if offset != total:
        raise ProtocolError("PUBLISH_BATCH sizes do not add up to the payload")
    return entries


def ms_deliver_batch(items: list[DeliverItem], payload: bytes) -> list[Message]:
    messages: list[Message] = []
    append = messages.append
    offset = 0
    total = len(payload)
    for item in items:
        if item.options is not UNSET:
            raise NotImplementedError("the bench's workload has no options")
        size = item.size
        end = offset + size
        if end > total:
            raise ProtocolError("DELIVER_BATCH entry has a bad size")
        message = _new(Message)
        message.topic = item.topic  # type: ignore[misc]
        message.payload = payload[offset:end]  # type: ignore[misc]
        message.sender = item.sender  # type: ignore[misc]
        message.timestamp = item.timestamp  # type: ignore[misc]
        message.options = DEFAULT_OPTIONS  # type: ignore[misc]
        message.origin = None  # type: ignore[misc]
        message.hop_count = 0  # type: ignore[misc]
        message.size = size  # type: ignore[misc]
        append(message)
        offset = end
    if offset != total:
        raise ProtocolError("DELIVER_BATCH sizes do not add up to the payload")
    return messages


BAD_PUBLISH = (
    [],
    ["t", {}, {}],
    [1],
    [None],
    [["t"]],
    [True, {}],
    ["t", None],
    ["t", []],
    ["t", "h"],
)
BAD_PUBLISH_BATCH = (
    [["t"]],
    [["t", 0, None, 1]],
    ["t"],
    [{"t": 0}],
    [[1, 0]],
    [["t", "0"]],
    [["t", True]],
    [["t", -1]],
    [["t", 1.0]],
    [["t", 0, []]],
)
BAD_DELIVER_BATCH = (
    ["t"],
    [{"t": 1}],
    [["t", None, 1.0]],
    [["t", None, 1.0, 0, {}, 0]],
    [["t", None, 1.0, "0"]],
    [["t", None, 1.0, True]],
    [["t", None, 1.0, -1]],
    [[1, None, 1.0, 0]],
    [["t", 1, 1.0, 0]],
    [["t", None, "1", 0]],
    [["t", None, False, 0]],
    [["t", None, 1.0, 0, None]],
)


def refused_both_ways() -> None:
    """The msgspec decoders refuse what the codec refuses (the codec's own test tables,
    less the size sums and the options checks, which stay by hand either way)."""
    tables: list[tuple[Any, Callable[[Any], Any], Callable[[bytes], Any]]] = [
        (BAD_PUBLISH, decode_publish, _publish),
        (BAD_PUBLISH_BATCH, decode_publish_batch, _publish_batch),
        (BAD_DELIVER_BATCH, decode_deliver_batch, _deliver_batch),
    ]
    for table, today, typed in tables:
        for header in table:
            for payload in (b"", b"x"):  # refused whatever the payload, not for its size
                args = (header,) if today is decode_publish else (header, payload)
                try:
                    today(*args)
                except ProtocolError:
                    continue
                raise AssertionError(f"{header!r} accepted today")
            try:
                typed(orjson.dumps(header))
            except msgspec.ValidationError:
                continue
            raise AssertionError(f"{header!r} accepted by msgspec")


def split(frame: bytes) -> tuple[bytes, bytes]:
    """The header bytes and the payload of one encoded frame."""
    head_length = int.from_bytes(frame[5:9], "big")
    return frame[9 : 9 + head_length], frame[9 + head_length :]


Case = tuple[str, int, dict[str, Callable[[], Any]]]


def cases(quick: bool) -> list[Case]:
    """Each workload: its name, messages per repeat, and a decoder loop per name."""
    singles = 2_000 if quick else 20_000
    batches = singles // 100
    data = payloads(100)

    plain_heads = [split(encode_publish(f"{TOPIC}/{i % 100}", data[0]))[0] for i in range(100)]
    rich_heads = [
        split(
            encode_publish(
                f"{TOPIC}/{i % 100}",
                data[0],
                headers={"unit": "C", "seq": i, "site": "north"},
                reply_to=f"_inbox/c1/{i}",
                correlation_id=f"req-{i}",
            )
        )[0]
        for i in range(100)
    ]
    pb_head, pb_payload = split(
        encode_publish_batch([(f"{TOPIC}/{i}", p, None) for i, p in enumerate(data)])
    )
    batch = [
        Message(f"{TOPIC}/{i}", p, sender="c1", timestamp=1.7e9 + i) for i, p in enumerate(data)
    ]
    db_head, db_payload = split(encode_deliver_batch(batch))

    refused_both_ways()
    for head in plain_heads + rich_heads:  # the same result both ways, before timing
        assert decode_publish(_loads(head)) == ms_publish(_publish(head))
        assert ms_publish(_convert(_loads(head), Publish)) == decode_publish(_loads(head))
    assert decode_publish_batch(_loads(pb_head), pb_payload) == ms_publish_batch(
        _publish_batch(pb_head), pb_payload
    )
    assert decode_deliver_batch(_loads(db_head), db_payload) == batch
    assert ms_deliver_batch(_deliver_batch(db_head), db_payload) == batch

    def singles_of(heads: list[bytes]) -> dict[str, Callable[[], Any]]:
        rounds = singles // len(heads)

        def today() -> None:
            for _ in range(rounds):
                for head in heads:
                    decode_publish(_loads(head))

        def typed() -> None:
            for _ in range(rounds):
                for head in heads:
                    ms_publish(_publish(head))

        def converted() -> None:
            for _ in range(rounds):
                for head in heads:
                    ms_publish(_convert(_loads(head), Publish))

        return {"orjson+checks": today, "msgspec": typed, "convert": converted}

    def pb_today() -> None:
        for _ in range(batches):
            decode_publish_batch(_loads(pb_head), pb_payload)

    def pb_typed() -> None:
        for _ in range(batches):
            ms_publish_batch(_publish_batch(pb_head), pb_payload)

    def pb_converted() -> None:
        for _ in range(batches):
            ms_publish_batch(_convert(_loads(pb_head), list[PublishItem]), pb_payload)

    def db_today() -> None:
        for _ in range(batches):
            decode_deliver_batch(_loads(db_head), db_payload)

    def db_typed() -> None:
        for _ in range(batches):
            ms_deliver_batch(_deliver_batch(db_head), db_payload)

    def db_converted() -> None:
        for _ in range(batches):
            ms_deliver_batch(_convert(_loads(db_head), list[DeliverItem]), db_payload)

    return [
        ("decode publish", singles, singles_of(plain_heads)),
        ("decode publish+options", singles, singles_of(rich_heads)),
        (
            "decode publish_batch 100",
            batches * 100,
            {"orjson+checks": pb_today, "msgspec": pb_typed, "convert": pb_converted},
        ),
        (
            "decode deliver_batch 100",
            batches * 100,
            {"orjson+checks": db_today, "msgspec": db_typed, "convert": db_converted},
        ),
    ]


def median_ns(
    impls: dict[str, Callable[[], Any]], messages: int, repeats: int, verbose: bool
) -> dict[str, float]:
    """Median ns per message of each decoder loop, interleaved in rotating order."""
    names = list(impls)
    for name in names:  # warm-up, not recorded
        impls[name]()
    seen: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            start = clock()
            impls[name]()
            seen[name].append((clock() - start) * 1e9 / messages)
    if verbose:
        for name in names:
            print(f"    {name}: " + " ".join(f"{v:.0f}" for v in seen[name]))
    return {name: statistics.median(values) for name, values in seen.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="10x fewer messages, 5 repeats")
    parser.add_argument("--repeats", type=int, default=0, help="default 15, quick 5")
    parser.add_argument("-v", action="store_true", help="also every repeat's figures")
    args = parser.parse_args()
    repeats = args.repeats or (5 if args.quick else 15)
    print(f"codec: msgspec {msgspec.__version__}, orjson {orjson.__version__}, median of {repeats}")
    for name, messages, impls in cases(args.quick):
        ns = median_ns(impls, messages, repeats, args.v)
        today, typed, converted = ns["orjson+checks"], ns["msgspec"], ns["convert"]
        ratio = today / typed
        print(
            f"codec {name}: orjson+checks {today:.0f} ns, msgspec {typed:.0f} ns = {ratio:.2f}x"
            f" (convert of the parsed header {converted:.0f} ns = {today / converted:.2f}x)"
            f"  [{verdict(ratio >= TARGET)} >= {TARGET}x]",
            flush=True,
        )


if __name__ == "__main__":
    main()
