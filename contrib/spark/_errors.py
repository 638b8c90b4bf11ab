"""Errors of the Spark connector; each is also the meshbus error it is a kind of."""

from __future__ import annotations

from meshbus.errors import ConfigurationError, MeshbusError, TransportError

__all__ = ["BridgeError", "BridgeUnavailableError", "OffsetsUnavailableError", "SparkOptionError"]


class SparkOptionError(ConfigurationError):
    """An option of ``format("meshbus")`` is unknown, misspelt, of the wrong type or
    combined with one it excludes. Spark shows it when the query starts.

    :ivar option: the option's name as documented (``maxOffsetsPerTrigger``).
    """

    def __init__(self, option: str, why: str) -> None:
        super().__init__(f"option {option!r}: {why}")
        self.option = option
        self.why = why


class BridgeError(MeshbusError):
    """The Spark bridge refused a request (the message says why)."""


class BridgeUnavailableError(BridgeError, TransportError):
    """No Spark bridge answers at the address the data source was given."""


class OffsetsUnavailableError(BridgeError):
    """A read asked for offsets the bridge no longer (or not yet) holds.

    Offsets below the earliest retained one were released: every consumer of the
    stream committed past them, or the stream's size limit dropped them.
    """
