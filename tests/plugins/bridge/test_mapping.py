"""Topic mapping of bridges (SPEC 7): HiveMQ-style templates, checked at config time."""

from __future__ import annotations

import pytest

from meshbus import TopicLimits
from meshbus.errors import ConfigurationError
from meshbus.plugins.bridge import (
    EXCLUDED,
    NO_MATCH,
    TOO_SHORT,
    Mapped,
    TopicMapper,
    TopicMapping,
    directions,
)

TOPIC = "site/cell/department/machine"


def mapped(destination: str, topic: str = TOPIC, filter: str = "*/*/*/*", **variables: str) -> str:
    mapper = TopicMapper([TopicMapping(filter, destination=destination)], variables)
    result = mapper.map(topic)
    assert isinstance(result, Mapped), result
    return result.topic


# The results users porting HiveMQ bridge configs get there, exactly.
@pytest.mark.parametrize(
    ("destination", "expected"),
    [
        ("prefix/{2}/NEU/{4}/allData/{3}", "prefix/cell/NEU/machine/allData/department"),
        (
            "prefix/{2-3}/NEU/{1-2}/{4-4}/allData/{1-4}",
            "prefix/cell/department/NEU/site/cell/machine/allData/site/cell/department/machine",
        ),
        (
            "prefix/{2-#}/NEU/{4-#}/allData/{1-#}",
            "prefix/cell/department/machine/NEU/machine/allData/site/cell/department/machine",
        ),
        ("prefix/{#}/data", "prefix/site/cell/department/machine/data"),
        ("prefix/{1-3}/allData", "prefix/site/cell/department/allData"),
        ("{1}/A/{2}/B", "site/A/cell/B"),
        ("{#}/{1-3}", "site/cell/department/machine/site/cell/department"),
        ("remote/Data", "remote/Data"),
        ("{ 2 - 3 }/x", "cell/department/x"),  # spaces inside braces, as people write them
        ("dev-{4}-{1}/{2}", "dev-machine-site/cell"),  # one level, with text around it
    ],
)
def test_hivemq_templates_map_exactly(destination: str, expected: str) -> None:
    assert mapped(destination) == expected


def test_variables_fill_in_the_bridge_name_and_configured_values() -> None:
    assert (
        mapped("replacement/${bridge.name}/of/level", **{"bridge.name": "test-bridge"})
        == "replacement/test-bridge/of/level"
    )
    assert mapped("${site}-{2}/{#}", site="s1", topic="a/b", filter="a/>") == "s1-b/a/b"


def test_without_a_destination_the_topic_is_kept() -> None:
    mapper = TopicMapper([TopicMapping("a/>")])
    assert mapper.map("a/b/c") == Mapped("a/b/c", False)


def test_the_first_matching_mapping_decides() -> None:
    mapper = TopicMapper(
        [
            TopicMapping("a/b", destination="first", preserve_retained=True),
            TopicMapping("a/>", destination="second/{2}"),
        ]
    )
    assert mapper.map("a/b") == Mapped("first", True)
    assert mapper.map("a/c") == Mapped("second/c", False)
    assert mapper.map("b/c") is NO_MATCH
    assert mapper.filters == ("a/b", "a/>")


def test_excludes_stop_topics_of_the_mapping_that_decides() -> None:
    mapper = TopicMapper(
        [
            TopicMapping("clients/*/*", excludes=["clients/client2/status", "clients/*/debug"]),
            TopicMapping("clients/>", destination="other/{#}"),
        ]
    )
    assert mapper.map("clients/client1/status") == Mapped("clients/client1/status", False)
    assert mapper.map("clients/client2/status") is EXCLUDED
    assert mapper.map("clients/client1/debug") is EXCLUDED  # not the second mapping's
    assert mapper.map("clients/a/b/c") == Mapped("other/clients/a/b/c", False)
    assert EXCLUDED.reason == "excluded"


def test_a_topic_too_short_for_the_template_under_a_multi_level_filter_does_not_cross() -> None:
    mapper = TopicMapper([TopicMapping("a/>", destination="x/{4}")])
    assert mapper.map("a/b/c/d") == Mapped("x/d", False)
    assert mapper.map("a/b") is TOO_SHORT
    assert TOO_SHORT.reason == "topic_too_short"


def test_results_are_remembered_per_topic_and_the_memory_is_bounded() -> None:
    mapper = TopicMapper([TopicMapping(">", destination="x/{#}")])
    mapper.CACHE_SIZE = 8
    for i in range(20):
        assert mapper.map(f"t/{i}") == Mapped(f"x/t/{i}", False)
    assert len(mapper._cache) <= 8


# HiveMQ logs a warning for these and publishes to a truncated topic; here they are
# configuration errors.
@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        (TopicMapping("*/*", destination="x/{3}"), "reaches level 3, but the filter '*/*'"),
        (TopicMapping("a/b", destination="{1-3}"), "reaches level 3"),
        (TopicMapping("*/*", destination="{3-#}"), "reaches level 3"),
        (TopicMapping("*/*/*", destination="{3-2}"), r"\{3-2\} runs backwards \(3 > 2\)"),
        (TopicMapping("*/*", destination="{0}"), "counts levels from 1"),
        (TopicMapping("*/*", destination="${nope}/x"), r"unknown variable \$\{nope\}"),
        (TopicMapping("*/*", destination="pre{#}"), r"\{#\} stands for whole levels"),
        (TopicMapping("*/*", destination="{1-2}post"), "stands for whole levels"),
        (TopicMapping("*/*", destination="{x}"), r"\{x\} is no placeholder"),
        (TopicMapping("*/*", destination="a/{1"), "opens or closes no placeholder"),
        (TopicMapping("*/*", destination="a/1}"), "opens or closes no placeholder"),
        (TopicMapping("a/\x00"), "topic mapping 1"),  # filters are checked (NUL)
        (TopicMapping("#share/g/a"), "no '#share/'"),
        (TopicMapping("a/>", excludes=["{1}/x"]), "excludes are plain filters"),
        (TopicMapping("a/>", mode="BOTH"), "mode must be 'PUB' or 'SUB'"),  # type: ignore[arg-type]
    ],
)
def test_bad_mappings_are_refused_at_config_time(mapping: TopicMapping, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        TopicMapper([mapping], {"bridge.name": "b"})


def test_every_problem_of_every_mapping_is_listed_at_once() -> None:
    with pytest.raises(ConfigurationError) as caught:
        TopicMapper(
            [
                TopicMapping("*/*", destination="{3}/${who}"),
                TopicMapping("a/>"),
                TopicMapping("*", destination="{2-1}"),
            ]
        )
    text = str(caught.value)
    assert "topic mapping 1 ('*/*'): destination: {3} reaches level 3" in text
    assert "topic mapping 1 ('*/*'): destination: unknown variable ${who}" in text
    assert "topic mapping 3 ('*'): destination: {2-1} runs backwards" in text
    assert "mapping 2" not in text


def test_filters_are_held_to_the_vpn_topic_limits() -> None:
    with pytest.raises(ConfigurationError, match="topic mapping 1"):
        TopicMapper([TopicMapping("a/b/c/d")], limits=TopicLimits(max_levels=3))


def test_a_bridge_s_two_directions_number_its_mappings_as_it_lists_them() -> None:
    mappings = [
        TopicMapping("a/>", mode="PUB", destination="x/{#}"),
        TopicMapping("*/*", mode="SUB", destination="{3}"),
        TopicMapping("c/>", mode="ANY"),  # type: ignore[arg-type]
    ]
    with pytest.raises(ConfigurationError) as caught:
        directions(mappings, {})
    assert caught.value.problems == [
        "topic mapping 3 ('c/>'): mode must be 'PUB' or 'SUB', not 'ANY'",
        "topic mapping 2 ('*/*'): destination: {3} reaches level 3, but the filter '*/*' "
        "takes topics of 2 levels",
    ]
    pub, sub = directions(mappings[:1], {}, subscriptions=["s/>"])
    assert (pub.filters, sub.filters) == (("a/>",), ("s/>",))
