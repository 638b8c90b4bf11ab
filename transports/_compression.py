"""Stream compression for a link, negotiated at login (zlib from the standard library).

Each direction is one zlib stream for the life of the connection, flushed with
``Z_SYNC_FLUSH`` at every write, so the peer can decode all that was written
without waiting for more and the dictionary carries over between writes (small
frames compress well). zlib earns its place over third-party codecs because it
costs no dependency and its speed is not what limits a link (see bench/transport.py).

Decompression is bounded: one call never inflates more than ``max_output`` bytes
at a time, so a hostile peer cannot make the node allocate a "zip bomb".
"""

from __future__ import annotations

import zlib

from meshbus.errors import ProtocolError

__all__ = ["ALGORITHMS", "Compressor", "Decompressor"]

ALGORITHMS = ("zlib",)
"""Compression algorithms this version can speak, in order of preference."""


class Compressor:
    """Compresses what one side writes."""

    __slots__ = ("_zlib",)

    def __init__(self, level: int = 1) -> None:
        # Level 1: most of the ratio on message traffic, a fraction of the CPU of 6.
        self._zlib = zlib.compressobj(level)

    def compress(self, data: bytes) -> bytes:
        """The compressed form of ``data``, decodable on its own by the peer's stream."""
        return self._zlib.compress(data) + self._zlib.flush(zlib.Z_SYNC_FLUSH)


class Decompressor:
    """Decompresses what the peer wrote, at most ``max_output`` bytes per step."""

    __slots__ = ("_pending", "_zlib", "max_output")

    def __init__(self, max_output: int) -> None:
        self._zlib = zlib.decompressobj()
        self.max_output = max_output
        self._pending = b""

    def decompress(self, data: bytes) -> bytes:
        """Inflate ``data`` (plus what an earlier bounded step left over).

        Returns at most ``max_output`` bytes; :attr:`has_more` tells whether input
        is left to inflate. :raises ProtocolError: the data is not a zlib stream.
        """
        if self._pending:
            data = self._pending + data
        try:
            out = self._zlib.decompress(data, self.max_output)
        except zlib.error as exc:
            raise ProtocolError(f"compressed data is corrupt: {exc}") from None
        self._pending = self._zlib.unconsumed_tail
        if self._zlib.eof:
            raise ProtocolError("compressed stream ended before the connection")
        return out

    @property
    def has_more(self) -> bool:
        """Input is waiting that the last step did not inflate (output was at its bound)."""
        return bool(self._pending)
