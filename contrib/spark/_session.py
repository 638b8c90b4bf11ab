"""A local SparkSession tuned for an app that embeds meshbus (and for its tests).

The defaults of a local session are made for a shell: a web UI, a progress bar,
200 shuffle partitions and INFO logs. These settings roughly halve the cost of the
small micro-batches a message pipeline runs, and keep the console quiet.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["local_spark_session"]

_QUIET_LOG4J = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.spark.name = org.apache.spark
logger.spark.level = error
logger.hadoop.name = org.apache.hadoop
logger.hadoop.level = error
"""


def local_spark_session(
    *,
    cores: int = 2,
    app_name: str = "meshbus",
    driver_memory: str = "1g",
    conf: Mapping[str, str] | None = None,
    master: str | None = None,
) -> SparkSession:
    """Start (or return) a local SparkSession on loopback with small-batch settings.

    Worker processes run this interpreter (``PYSPARK_PYTHON``), so they import the
    same meshbus. ``conf`` entries override the defaults. ``master`` defaults to
    ``local[cores]``; ``local-cluster[2,1,1024]`` runs two executor JVMs with their
    own Python workers, as a cluster would.
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    log4j = Path(tempfile.gettempdir()) / "meshbus-spark-log4j2.properties"
    if not log4j.exists():
        log4j.write_text(_QUIET_LOG4J)
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.shuffle.partitions": str(cores),
        "spark.default.parallelism": str(cores),
        "spark.sql.adaptive.enabled": "false",
        "spark.sql.catalogImplementation": "in-memory",
        "spark.driver.memory": driver_memory,
        "spark.sql.streaming.stopTimeout": "10s",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.extraJavaOptions": (
            f"-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Dlog4j2.configurationFile=file:{log4j}"
        ),
    }
    if importlib.util.find_spec("pandas") is None:
        # Arrow-optimised Python UDFs need pandas, which the spark extra does not pull in.
        settings["spark.sql.execution.pythonUDF.arrow.enabled"] = "false"
    settings.update(conf or {})
    builder = SparkSession.builder.master(master or f"local[{cores}]").appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
