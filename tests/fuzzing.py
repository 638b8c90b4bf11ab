"""Byte-level fuzzing helpers shared by the session and link-mode fuzz suites."""

from __future__ import annotations

from hypothesis import strategies as st


def nested_json(kinds: list[bool], inner: bytes) -> bytes:
    """JSON text nesting ``inner`` in arrays (True) and objects (False), outermost first.
    Made as text: orjson refuses to write more than 254 levels, but reads 1024."""
    opening = b"".join(b"[" if is_array else b'{"k":' for is_array in kinds)
    closing = b"".join(b"]" if is_array else b"}" for is_array in reversed(kinds))
    return opening + inner + closing


def mutate(data: bytes, draw: st.DrawFn) -> bytes:
    """``data`` with one to three flips, insertions, deletions or a truncation."""
    out = bytearray(data)
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "set"]))
        at = draw(st.integers(min_value=0, max_value=max(len(out) - 1, 0)))
        if op == "flip" and out:
            out[at] ^= 1 << draw(st.integers(min_value=0, max_value=7))
        elif op == "set" and out:
            out[at] = draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF, ord("["), ord('"')]))
        elif op == "insert":
            out[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del out[at : at + draw(st.integers(min_value=1, max_value=8))]
        else:
            del out[at:]
    return bytes(out)
