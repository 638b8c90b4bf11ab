"""The client roles of the other brokers, for bench/_peers.py's role processes: nats-py
clients, paho-mqtt clients (against mosquitto or amqtt), and the amqtt broker itself.

They keep the protocol of every role (see bench/_peers.py): ``READY``, then one
``RESULT {json}`` line on stdout.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable
from typing import Any

from _peers import (
    HOST,
    READY_TIMEOUT,
    REPLY_TIMEOUT,
    PeerError,
    Tally,
    clock,
    host_port,
    payloads,
    publisher_finished_flag,
    rtt_result,
    say,
    say_result,
    should_stop,
)

# --- NATS roles (nats-py, asyncio) ------------------------------------------------------------


async def _nats_connect(url: str) -> Any:
    import nats

    return await nats.connect(
        servers=[url], allow_reconnect=False, connect_timeout=READY_TIMEOUT, name="bench"
    )


async def nats_sub(url: str, messages: int) -> None:
    import anyio

    finished = publisher_finished_flag()
    nc = await _nats_connect(url)
    tally = Tally()

    async def on_message(msg: Any) -> None:
        now = clock()
        if tally.n == 0:
            tally.first = now
        tally.last = now
        tally.n += 1

    try:
        await nc.subscribe("bench.>", cb=on_message)
        await nc.flush()  # PING/PONG: the server has processed the SUB
        say("READY")
        watch = [0.0, clock()]
        while not should_stop(tally, messages, finished, watch):
            await anyio.sleep(0.01)
        tally.report(messages)
    finally:
        await nc.close()


async def nats_pub(url: str, messages: int) -> None:
    data = payloads(messages)
    nc = await _nats_connect(url)
    try:
        publish = nc.publish
        t0 = clock()
        for p in data:
            await publish("bench.x", p)
        await nc.flush()
        t1 = clock()
        say_result(start=t0, end=t1, sent=messages)
    finally:
        await nc.close()


async def nats_responder(url: str) -> None:
    import anyio

    nc = await _nats_connect(url)

    async def on_request(msg: Any) -> None:
        await nc.publish(msg.reply, msg.data)

    try:
        await nc.subscribe("bench.req", cb=on_request)
        await nc.flush()
        say("READY")
        await anyio.sleep_forever()  # until the orchestrator terminates it
    finally:
        await nc.close()


async def nats_requester(url: str, requests: int, warmup: int) -> None:
    data = payloads(requests + warmup)
    nc = await _nats_connect(url)
    try:
        sub = await nc.subscribe("bench.rep.1")
        await nc.flush()
        say("READY")
        samples = []
        for i, p in enumerate(data):
            t0 = clock()
            await nc.publish("bench.req", p, reply="bench.rep.1")
            reply = await sub.next_msg(timeout=REPLY_TIMEOUT)
            t1 = clock()
            if reply.data != p:
                raise PeerError(f"reply {i} does not echo the request")
            if i >= warmup:
                samples.append(t1 - t0)
        rtt_result(samples)
    finally:
        await nc.close()


# --- MQTT roles (paho-mqtt v2 API, QoS 0, single-threaded manual loop) ----------------------


def _paho_client(url: str, name: str) -> Any:
    """A paho client connected to ``url`` with TCP_NODELAY on its socket, after CONNACK."""
    import paho.mqtt.client as mqtt

    client = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2,
        client_id=f"bench-{name}-{os.getpid()}",
        protocol=mqtt.MQTTv311,
    )
    state: dict[str, Any] = {}

    def on_connect(client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        client.socket().setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        state["reason"] = reason

    client.on_connect = on_connect
    host, port = host_port(url)
    client.connect(host, port, keepalive=60)
    _paho_until(client, lambda: "reason" in state, READY_TIMEOUT, "CONNACK")
    if state["reason"].is_failure:
        raise PeerError(f"MQTT connect refused: {state['reason']}")
    return client


def _paho_until(client: Any, done: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = clock() + timeout
    while not done():
        rc = client.loop(timeout=0.05)
        if rc:
            raise PeerError(f"MQTT connection failed while waiting for {what}: rc={rc}")
        if clock() > deadline:
            raise PeerError(f"no {what} after {timeout:.0f} s")


def _paho_subscribe(client: Any, topic: str) -> None:
    acked: list[object] = []
    client.on_subscribe = lambda *args: acked.append(args)
    client.subscribe(topic, qos=0)
    _paho_until(client, lambda: bool(acked), READY_TIMEOUT, "SUBACK")


def mqtt_sub(url: str, messages: int) -> None:
    finished = publisher_finished_flag()
    client = _paho_client(url, "sub")
    tally = Tally()

    def on_message(client: Any, userdata: Any, msg: Any) -> None:
        now = clock()
        if tally.n == 0:
            tally.first = now
        tally.last = now
        tally.n += 1

    client.on_message = on_message
    try:
        _paho_subscribe(client, "bench/#")
        say("READY")
        watch = [0.0, clock()]
        loop = client.loop
        while not should_stop(tally, messages, finished, watch):
            if loop(timeout=0.05):
                raise PeerError("MQTT connection lost")
        tally.report(messages)
    finally:
        client.disconnect()


def mqtt_pub(url: str, messages: int) -> None:
    data = payloads(messages)
    client = _paho_client(url, "pub")
    try:
        publish = client.publish
        deadline = clock() + 600
        t0 = clock()
        for i, p in enumerate(data):
            publish("bench/x", p, qos=0)  # written at once while the socket takes it
            if i % 1000 == 999:  # service the connection; wait while the socket is full
                client.loop(timeout=0)
                while client.want_write() and clock() < deadline:
                    client.loop(timeout=0.01)
        while client.want_write() and clock() < deadline:
            client.loop(timeout=0.01)
        t1 = clock()
        if client.want_write():
            raise PeerError("could not write everything within the time limit")
        say_result(start=t0, end=t1, sent=messages)
    finally:
        client.disconnect()


def mqtt_responder(url: str) -> None:
    client = _paho_client(url, "responder")

    def on_message(client: Any, userdata: Any, msg: Any) -> None:
        client.publish("bench/rep/1", msg.payload, qos=0)

    client.on_message = on_message
    try:
        _paho_subscribe(client, "bench/req")
        say("READY")
        while not client.loop(timeout=1.0):  # until the orchestrator terminates it
            pass
    finally:
        client.disconnect()


def mqtt_requester(url: str, requests: int, warmup: int) -> None:
    data = payloads(requests + warmup)
    client = _paho_client(url, "requester")
    replies: list[bytes] = []
    client.on_message = lambda client, userdata, msg: replies.append(msg.payload)
    try:
        _paho_subscribe(client, "bench/rep/1")
        say("READY")
        samples = []
        for i, p in enumerate(data):
            t0 = clock()
            client.publish("bench/req", p, qos=0)
            _paho_until(client, lambda: bool(replies), REPLY_TIMEOUT, f"reply {i}")
            t1 = clock()
            if replies.pop() != p:
                raise PeerError(f"reply {i} does not echo the request")
            if i >= warmup:
                samples.append(t1 - t0)
        rtt_result(samples)
    finally:
        client.disconnect()


async def amqtt_broker_role(port: int) -> None:
    import anyio
    from amqtt.broker import Broker

    config = {
        "listeners": {"default": {"type": "tcp", "bind": f"{HOST}:{port}"}},
        # Only what a broker needs; the default set adds packet/event loggers and $SYS.
        "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
    }
    broker = Broker(config)
    await broker.start()
    say("READY")
    try:
        await anyio.sleep_forever()  # until the orchestrator terminates it
    finally:
        with contextlib.suppress(Exception):
            await broker.shutdown()
