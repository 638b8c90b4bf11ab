"""LatencyHistogram: fixed buckets, each up to and including its bound."""

from __future__ import annotations

from meshbus import LatencyHistogram


def test_each_duration_lands_in_the_first_bucket_that_holds_it() -> None:
    histogram = LatencyHistogram()
    histogram.record(0.0)
    histogram.record(0.0001)  # a bound belongs to its own bucket
    histogram.record(0.00011, count=3)
    histogram.record(10.0)
    histogram.record(11.0)
    snapshot = histogram.snapshot()
    assert list(snapshot) == list(LatencyHistogram.LABELS)
    assert (snapshot["0.0001"], snapshot["0.00025"], snapshot["10"], snapshot["+Inf"]) == (
        2,
        3,
        1,
        1,
    )
    assert histogram.total == 7 == sum(snapshot.values())


def test_histograms_add_up() -> None:
    a, b = LatencyHistogram(), LatencyHistogram()
    a.record(0.002)
    b.record(0.002, count=2)
    b.record(1.0)
    a.add(b)
    assert (a.snapshot()["0.0025"], a.snapshot()["1"], a.total) == (3, 1, 4)
