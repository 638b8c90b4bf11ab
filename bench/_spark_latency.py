"""bench/spark.py's latency phase: how long a published message takes to be visible to a
running streaming query."""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from _spark_common import (
    LATENCY_INTERVAL,
    LATENCY_TARGET_MS,
    PAYLOAD_SIZE,
    TOPICS,
    TRIGGER,
    CheckFailed,
    Report,
    blocking,
    bridged_node,
    progress_recorder,
    say,
    wait_until,
)


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def latency_payload(seq: int) -> bytes:
    return json.dumps({"seq": seq, "t": time.time()}).encode().ljust(PAYLOAD_SIZE)


async def latency_phase(spark: Any, args: argparse.Namespace, work: Path, report: Report) -> None:
    label = "spark latency publish -> visible"
    samples = args.samples
    recorder = progress_recorder()
    out, ck = work / "latency-out", work / "latency-ck"
    async with bridged_node(subscribe=["events/>"]) as (node, bridge):
        app = node.connect(client_name="app", timestamps=True)
        await blocking(lambda: (bridge.attach(spark), spark.streams.addListener(recorder)))
        query = None
        try:
            t_start = time.perf_counter()
            query = await blocking(
                lambda: bridge.sink_to(
                    spark, subscribe="events/>", path=str(out), checkpoint=str(ck), trigger=TRIGGER
                )
            )
            query_id = str(query.id)
            app.publish("events/warmup", latency_payload(-1))
            await wait_until(lambda: recorder.reached(query_id) >= 1, 180, "warm-up message")
            warm = time.perf_counter() - t_start
            await anyio.sleep(3 * 0.5)  # three empty triggers
            first = bridge.stream(subscribe=["events/>"]).next_offset
            t0 = anyio.current_time()
            for i in range(samples):
                await anyio.sleep(max(0.0, t0 + i * LATENCY_INTERVAL - anyio.current_time()))
                app.publish(f"events/{i % TOPICS}", latency_payload(i))
            last = first + samples
            await wait_until(lambda: recorder.reached(query_id) >= last, 60, "the last sample")
        except Exception as exc:
            report.failed(label, exc)
            return
        finally:
            if query is not None:
                await blocking(query.stop)
            await blocking(lambda: spark.streams.removeListener(recorder))

    try:
        rows = await blocking(
            lambda: spark.read.parquet(str(out)).select("value", "offset").collect()
        )
        seen: dict[int, tuple[int, float]] = {}
        for row in rows:
            body = json.loads(bytes(row.value).rstrip())
            if body["seq"] in seen:
                raise CheckFailed(f"sample {body['seq']} is in the Parquet output twice")
            seen[body["seq"]] = (int(row.offset), float(body["t"]))
        missing = [i for i in [-1, *range(samples)] if i not in seen]
        if missing or len(seen) != samples + 1:
            raise CheckFailed(
                f"{len(missing)} of {samples + 1} messages missing from the Parquet output"
            )
        latencies = []
        for i in range(samples):
            offset, published = seen[i]
            visible = recorder.visible_at(query_id, offset)
            if visible is None:
                raise CheckFailed(f"sample {i} (offset {offset}) never reported committed")
            latencies.append((visible - published) * 1000)
    except Exception as exc:
        report.failed(label, exc)
        return
    batches = [e for e in recorder.events if e[1] == query_id and e[3] > 0 and e[2] > first]
    took = [ms for qid, rows, ms in recorder.durations if qid == query_id and rows > 0]
    took = took[1:] or took  # the warm-up message's batch first
    p50, p90 = percentile(latencies, 50), percentile(latencies, 90)
    verdict = "PASS" if p50 <= LATENCY_TARGET_MS else "MISS"
    say(
        f"{label}: p50 {p50:,.0f} ms p90 {p90:,.0f} ms max {max(latencies):,.0f} ms "
        f"(target p50 <= {LATENCY_TARGET_MS:,.0f} ms) {verdict} (sink_to trigger "
        f"{TRIGGER} -> Parquet; {samples} messages, 1 per {LATENCY_INTERVAL * 1000:.0f} ms, in "
        f"{len(batches)} micro-batches of median {percentile(took, 50):,.0f} ms; visible = this "
        f"process's StreamingQueryListener got the progress event of the batch; all {samples} "
        f"in the Parquet output once; query start -> warm-up message visible {warm:.1f} s, "
        "not counted)"
    )
