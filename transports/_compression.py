"""Stream compression for a link, negotiated at login: LZ4, or zlib.

Each direction is one compressed stream for the life of the connection, flushed at
every write (a write is a batch of frames: see :mod:`._connection`), so the peer can
decode all that was written without waiting for more, and what was written before
serves as the dictionary of what follows (small frames compress well).

* ``lz4`` (the ``lz4`` package, a binding of the reference library): one LZ4 frame
  of linked 64 KiB blocks for the connection, each write flushed as its own blocks.
  It compresses message traffic about ten times faster than zlib's fastest level,
  for a somewhat larger output, so compression no longer limits a fast link.
* ``zlib`` (the standard library) at level 1, ``Z_SYNC_FLUSH`` at every write: the
  smaller output for slow links, and what nodes before lz4 speak.

A client offers every algorithm it has, a node picks the first of :data:`ALGORITHMS`
in that offer, so two new sides speak lz4 and a new side with an old one zlib.

Decompression is bounded: one call never inflates more than ``max_output`` bytes
at a time, so a hostile peer cannot make the node allocate a "zip bomb".
"""

from __future__ import annotations

import zlib

from meshbus.errors import ProtocolError

try:
    import lz4.frame as lz4_frame
except ImportError:  # pragma: no cover - a dependency; zlib alone still works
    lz4_frame = None

__all__ = ["ALGORITHMS", "Compressor", "Decompressor"]

ALGORITHMS: tuple[str, ...] = ("lz4", "zlib") if lz4_frame is not None else ("zlib",)
"""Compression algorithms this version can speak, in order of preference."""


class Compressor:
    """Compresses what one side writes, with ``algorithm`` (one of :data:`ALGORITHMS`)."""

    __slots__ = ("_header", "_lz4", "_zlib", "compress")

    def __init__(self, algorithm: str = "zlib", level: int = 1) -> None:
        if algorithm == "lz4" and lz4_frame is not None:
            self._lz4 = lz4_frame.LZ4FrameCompressor(
                block_size=lz4_frame.BLOCKSIZE_MAX64KB,
                block_linked=True,  # each block may refer to the ones before
                compression_level=0,  # LZ4's fast mode
                content_checksum=False,  # TCP and TLS check the bytes already
                auto_flush=True,  # every call returns all it was given, compressed
            )
            self._header = self._lz4.begin()
            self.compress = self._compress_lz4
        elif algorithm == "zlib":
            # Level 1: most of the ratio on message traffic, a fraction of the CPU of 6.
            self._zlib = zlib.compressobj(level)
            self.compress = self._compress_zlib
        else:
            raise ProtocolError(f"unknown compression {algorithm!r}")

    def _compress_zlib(self, data: bytes) -> bytes:
        """The compressed form of ``data``, decodable on its own by the peer's stream."""
        return self._zlib.compress(data) + self._zlib.flush(zlib.Z_SYNC_FLUSH)

    def _compress_lz4(self, data: bytes) -> bytes:
        out: bytes = self._lz4.compress(data)
        if self._header:  # the frame's header goes with the first write
            out, self._header = self._header + out, b""
        return out


class Decompressor:
    """Decompresses what the peer wrote, at most ``max_output`` bytes per step."""

    __slots__ = ("_lz4", "_pending", "_zlib", "decompress", "max_output")

    def __init__(self, max_output: int, algorithm: str = "zlib") -> None:
        self.max_output = max_output
        self._pending = b""
        if algorithm == "lz4" and lz4_frame is not None:
            self._lz4 = lz4_frame.LZ4FrameDecompressor()
            self.decompress = self._decompress_lz4
        elif algorithm == "zlib":
            self._zlib = zlib.decompressobj()
            self.decompress = self._decompress_zlib
        else:
            raise ProtocolError(f"unknown compression {algorithm!r}")

    def _decompress_zlib(self, data: bytes) -> bytes:
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

    def _decompress_lz4(self, data: bytes) -> bytes:
        # The binding keeps the input it has not inflated yet. Its ``needs_input`` does
        # not say whether output is left (it is True then too), so a step that filled
        # ``max_output`` is taken to leave some: the next, with no new data, tells.
        decompressor = self._lz4
        try:
            out: bytes = decompressor.decompress(data, self.max_output)
        except RuntimeError as exc:
            raise ProtocolError(f"compressed data is corrupt: {exc}") from None
        if decompressor.eof:
            raise ProtocolError("compressed stream ended before the connection")
        self._pending = b"more" if len(out) >= self.max_output else b""
        return out

    @property
    def has_more(self) -> bool:
        """Input is waiting that the last step did not inflate (output was at its bound)."""
        return bool(self._pending)
