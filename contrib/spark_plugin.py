"""The ``spark`` plugin of a configuration file: a standalone node that serves Spark.

It lives outside :mod:`meshbus.contrib.spark` so that loading it (``autoload``, or a
file naming it) needs no pyarrow until a ``[spark]`` table asks for a bridge; without
the ``spark`` extra that table is refused with the reason.

``plugins = [..., "spark"]`` and a ``[spark]`` table make ``meshbus run`` start a
:class:`SparkBridge` on the node. Spark's executors then connect to the node's own
``[[listeners]]`` (TLS and passwords as configured there) with the data source's
``address``, ``vpn``, ``username`` and ``password`` options::

    plugins = ["direct", "shared", "eliding", "guaranteed", "retained", "spark"]

    [[listeners]]
    host = "0.0.0.0"
    port = 55443
    tls = { certificate = "certs/server.pem", private_key = "certs/server.key" }

    [spark]
    vpn = "plant"
    username = "spark"
    password = "..."
    subscribe = ["meters/>"]     # captured from the start, as one stream
    queues = ["orders"]          # each captured as it exists
    partitions = 2
    advertise = "tls://spark-gw.example:55443"
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from meshbus import ConfigSection, hookimpl

if TYPE_CHECKING:
    from meshbus import ConfigContext, ConfigReader, ConfigSections, Node
    from meshbus.contrib.spark import SparkBridge

__all__ = ["SECTION", "SparkSettings"]


def _positive(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 1:
        raise ValueError(f"must be a positive integer, got {value}")


@attrs.frozen
class SparkSettings:
    """The ``[spark]`` table: the bridge's VPN and login, its declared streams, limits."""

    vpn: str = "default"
    username: str = "default"
    password: str | None = attrs.field(default=None, repr=False)
    subscribe: tuple[str, ...] = ()
    queues: tuple[str, ...] = ()
    partitions: int = attrs.field(default=1, validator=_positive)
    advertise: str | None = None
    queue_window: int = attrs.field(default=10_000, validator=_positive)
    max_bytes: int = attrs.field(default=256 << 20, validator=_positive)
    max_staged_bytes: int = attrs.field(default=1 << 30, validator=_positive)

    def bridge(self) -> SparkBridge:
        """The bridge these settings describe (on the node's own listeners).

        :raises ImportError: the ``spark`` extra is not installed.
        """
        from meshbus.contrib.spark import SparkBridge

        return SparkBridge(
            subscribe=self.subscribe,
            queues=self.queues,
            partitions=self.partitions,
            listen=None,
            advertise=self.advertise,
            vpn=self.vpn,
            username=self.username,
            password=self.password,
            queue_window=self.queue_window,
            max_bytes=self.max_bytes,
            max_staged_bytes=self.max_staged_bytes,
        )


def _read(
    reader: ConfigReader, raw: object, path: str, context: ConfigContext
) -> SparkSettings | None:
    table = reader.table(raw, path)
    if table is None:
        return None
    settings = reader.attrs_value(SparkSettings, table, path)
    if settings is None:
        return None
    try:
        settings.bridge()  # every check the bridge makes, reported with the file's others
    except Exception as exc:  # ConfigurationError, SparkOptionError, ImportError: all say why
        reader.report(path, str(exc))
        return None
    return settings


def _configure(node: Node, settings: SparkSettings) -> None:
    node.plugins.register(settings.bridge())


SECTION = ConfigSection(
    "spark",
    "node",
    _read,
    configure=_configure,
    summary="the Spark connector: vpn, username, password, subscribe, queues, partitions, ...",
)


@hookimpl
def meshbus_config_sections(sections: ConfigSections) -> None:
    sections.add(SECTION, plugin="spark")
