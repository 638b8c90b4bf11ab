"""A query that cannot reach or log in to its node fails when it starts, saying why.

Spark runs here in local mode against a node in this process with a TLS listener
and a VPN that checks passwords; what matters is the message the query fails with.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from meshbus import DEFAULT_PLUGINS, Node
from meshbus.contrib.spark import SparkBridge
from meshbus.transports import ListenerSettings, TlsSettings
from meshbus.transports.certs import make_ca, make_server_certificate
from tests.processes import free_port

from .conftest import blocking

pytestmark = pytest.mark.anyio

PASSWORD = "right-password"


@asynccontextmanager
async def tls_node(folder: Path) -> AsyncIterator[tuple[SparkBridge, dict[str, str]]]:
    ca = make_ca(folder / "pki")
    server = make_server_certificate(folder / "pki")
    listener = ListenerSettings(
        port=0, tls=TlsSettings(certificate=server.certificate, private_key=server.private_key)
    )
    bridge = SparkBridge(listen=listener, vpn="plant", username="spark", password=PASSWORD)
    node = Node(plugins=[*DEFAULT_PLUGINS, bridge])
    node.create_vpn("plant", authentication="basic").add_user("spark", password=PASSWORD)
    async with node:
        options = {
            "address": bridge.address,
            "vpn": "plant",
            "username": "spark",
            "password": PASSWORD,
            "tlsCa": str(ca.certificate),
            "subscribe": "meters/>",
        }
        yield bridge, options


def start_failure(spark: Any, options: dict[str, str]) -> str:
    """Start a streaming query with ``options``; the message it failed with."""
    query = (
        spark.readStream.format("meshbus")
        .options(**options)
        .load()
        .writeStream.format("memory")
        .queryName(f"q{abs(hash(tuple(options.items())))}")
        .start()
    )
    try:
        query.awaitTermination(120)
    except Exception as exc:  # StreamingQueryException: Spark's wrapper of ours
        return str(exc)
    finally:
        query.stop()
    raise AssertionError("the query did not fail")


async def test_with_the_right_settings_a_query_reads(spark: Any, tmp_path: Path) -> None:
    async with tls_node(tmp_path) as (bridge, options):
        bridge.attach(spark)
        frame = await blocking(lambda: spark.read.format("meshbus").options(**options).load())
        assert await blocking(frame.count) == 0


async def test_a_wrong_password_fails_the_query_naming_the_login(
    spark: Any, tmp_path: Path
) -> None:
    async with tls_node(tmp_path) as (bridge, options):
        bridge.attach(spark)
        message = await blocking(lambda: start_failure(spark, {**options, "password": "wrong"}))
        assert "refused the login of 'spark' to VPN 'plant'" in message
        assert "wrong" not in message.replace("'wrong'", "")  # the password is not shown


async def test_an_untrusted_ca_fails_the_query_naming_the_certificate(
    spark: Any, tmp_path: Path
) -> None:
    other = make_ca(tmp_path / "other", name="another CA")
    async with tls_node(tmp_path) as (bridge, options):
        bridge.attach(spark)
        failing = {**options, "tlsCa": str(other.certificate)}
        message = await blocking(lambda: start_failure(spark, failing))
        assert f"cannot reach the meshbus node at {bridge.address}" in message
        assert "certificate not trusted" in message
        assert "'tlsCa'" in message


async def test_an_unreachable_address_fails_the_query_naming_it(spark: Any, tmp_path: Path) -> None:
    async with tls_node(tmp_path) as (bridge, options):
        bridge.attach(spark)
        nowhere = f"tls://127.0.0.1:{free_port()}"
        message = await blocking(lambda: start_failure(spark, {**options, "address": nowhere}))
        assert f"cannot reach the meshbus node at {nowhere}" in message
        assert "advertised" in message
