"""The Spark connector (SPEC 11): meshbus streams in and out of PySpark.

Install with ``pip install 'meshbus[spark]'`` (PySpark 4 and pyarrow; Java 17 to run
Spark). Register a :class:`SparkBridge` on the node, attach it to a SparkSession,
then read and write with ``format("meshbus")`` or the bridge's shortcuts::

    bridge = SparkBridge(subscribe=["events/>"])
    async with Node(plugins=[*DEFAULT_PLUGINS, bridge]) as node:
        # Spark's calls block: run them off the node's event loop.
        spark = await anyio.to_thread.run_sync(local_spark_session)
        query = await anyio.to_thread.run_sync(
            lambda: bridge.sink_to(spark, subscribe="events/>", path="out", checkpoint="ck")
        )

The data source classes import pyspark; the bridge needs only pyarrow.
"""

from __future__ import annotations

try:
    import pyarrow  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised by tests/test_packaging.py
    raise ImportError(
        "meshbus.contrib.spark needs the spark extra: pip install 'meshbus[spark]'"
    ) from exc

from ._bridge import SparkBridge
from ._columns import arrow_schema, spark_schema
from ._errors import BridgeError, BridgeUnavailableError, OffsetsUnavailableError, SparkOptionError
from ._log import StreamLog
from ._options import ADDRESS_ENV, DEFAULT_ADDRESS
from ._session import local_spark_session

__all__ = [
    "ADDRESS_ENV",
    "DEFAULT_ADDRESS",
    "BridgeError",
    "BridgeUnavailableError",
    "OffsetsUnavailableError",
    "SparkBridge",
    "SparkOptionError",
    "StreamLog",
    "arrow_schema",
    "local_spark_session",
    "spark_schema",
]
