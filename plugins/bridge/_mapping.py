"""Topic mapping for bridges (SPEC 7): which topics cross, and under what name.

A bridge carries messages in two directions, and each direction has its own list of
:class:`TopicMapping`: ``PUB`` mappings pick local messages to send to the remote VPN,
``SUB`` mappings pick what the remote VPN sends here. A mapping has a ``filter``,
``excludes`` (plain filters whose topics do not cross), and a ``destination``
template that names the topic on the other side:

* ``{n}`` is level *n* of the topic (counted from 1), and may sit inside a level
  with text around it (``dev-{2}``);
* ``{n-m}`` is levels *n* to *m*, ``{n-#}`` level *n* to the end, ``{#}`` the whole
  topic; each of these fills whole levels of the destination, so nothing may be
  written next to it in the same level;
* ``${name}`` is a variable: ``${bridge.name}`` and whatever the bridge configures;
* anything else is text.

Everything is checked when the mapper is made, and every problem is listed in one
:class:`~meshbus.errors.ConfigurationError`: a template that reaches past a filter of
fixed length, ``{n-m}`` with *n* > *m*, an unknown variable, text next to a
placeholder of several levels, a brace that opens no placeholder. The only thing
left for run time is a topic shorter than a template asks for under a ``>`` filter;
such a message does not cross and is counted (:data:`TOO_SHORT`).

The first mapping whose filter matches a topic decides. Results are remembered per
topic, so a stream of messages on few topics maps each topic once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import attrs

from meshbus import (
    ConfigurationError,
    InvalidTopicError,
    SubscriptionIndex,
    TopicLimits,
    filter_matches,
    parse_subscription,
)

__all__ = [
    "EXCLUDED",
    "NO_MATCH",
    "TOO_SHORT",
    "Mapped",
    "TopicMapper",
    "TopicMapping",
    "directions",
]

Mode = Literal["PUB", "SUB"]
_DEFAULT_LIMITS = TopicLimits()


def listed(value: Iterable[Any], what: str) -> tuple[Any, ...]:
    """``value`` as a tuple; a string (which would become one entry per character) or
    a non-iterable is refused, naming ``what``."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise ValueError(f"{what} must be a list, got {value!r}")
    return tuple(value)


def _excludes(value: Iterable[str]) -> tuple[str, ...]:
    return listed(value, "excludes")


@attrs.frozen
class TopicMapping:
    """One rule of a bridge's topic mapping (SPEC 7)."""

    filter: str
    """The topics the rule takes (a meshbus filter: ``*``, ``ab*``, ``>``)."""
    mode: Mode = "SUB"
    """``"SUB"``: from the remote VPN to this one; ``"PUB"``: from this VPN to the remote."""
    excludes: tuple[str, ...] = attrs.field(default=(), converter=_excludes)
    """Plain filters: topics they match do not cross (counted as ``excluded``)."""
    destination: str | None = None
    """The template of the topic on the other side; ``None`` keeps the topic."""
    preserve_retained: bool = False
    """Whether a retained message stays retained on the other side."""


@attrs.frozen
class Mapped:
    """Where a topic goes: its name on the other side, and whether it stays retained."""

    topic: str
    preserve_retained: bool


class _Outcome:
    """A topic that does not cross, and why (the reason it is counted under)."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"<{self.reason}>"


NO_MATCH = _Outcome("no_mapping")
"""No mapping of the direction takes the topic."""
EXCLUDED = _Outcome("excluded")
"""The first mapping that takes it excludes it."""
TOO_SHORT = _Outcome("topic_too_short")
"""The topic has fewer levels than the destination template asks for."""

# Placeholders: {n}, {n-m}, {n-#}, {#} (spaces allowed inside, as people write them);
# variables: ${name}.
_TOKEN = re.compile(r"\$\{([^{}]*)\}|\{([^{}]*)\}")
_LEVEL = re.compile(r"\s*(\d+)\s*$")
_RANGE = re.compile(r"\s*(\d+)\s*-\s*(\d+|#)\s*$")
_WHOLE = re.compile(r"\s*#\s*$")

# A compiled level is a tuple of parts; a part is a str (text), an int (one level,
# 0-based), or a slice (several levels, each its own level of the result).
_Part = str | int | slice


class _Template:
    """A destination template, compiled: ``render`` gives the topic, or ``None`` when
    the topic is too short for it."""

    __slots__ = ("levels", "needs")

    def __init__(self, levels: list[tuple[_Part, ...]], needs: int) -> None:
        self.levels = levels
        self.needs = needs  # levels a topic must have

    def render(self, topic: str) -> str | None:
        levels = topic.split("/")
        if len(levels) < self.needs:
            return None
        out: list[str] = []
        for parts in self.levels:
            if len(parts) == 1 and type(parts[0]) is slice:
                out.extend(levels[parts[0]])
            else:
                out.append(
                    "".join(p if type(p) is str else levels[p] for p in parts)  # type: ignore[index]
                )
        return "/".join(out)


def _compile_template(
    template: str, filter: str, variables: Mapping[str, str], errors: list[str], where: str
) -> _Template | None:
    """Compile ``template`` for topics of ``filter``; add what is wrong to ``errors``."""
    filter_levels = filter.split("/")
    fixed = filter_levels[-1] != ">"  # a filter without '>' takes topics of its length only
    length = len(filter_levels)
    found = len(errors)
    needs = 0
    compiled: list[tuple[_Part, ...]] = []

    def check_index(n: int, what: str) -> bool:
        if n < 1:
            errors.append(f"{where}: {what} counts levels from 1")
            return False
        if fixed and n > length:
            errors.append(
                f"{where}: {what} reaches level {n}, but the filter {filter!r} takes "
                f"topics of {length} level{'s' if length != 1 else ''}"
            )
            return False
        return True

    for level in template.split("/"):
        parts: list[_Part] = []
        multi: str | None = None
        at = 0
        for token in _TOKEN.finditer(level):
            if token.start() > at:
                parts.append(level[at : token.start()])
            at = token.end()
            variable, placeholder = token.group(1), token.group(2)
            if variable is not None:
                if variable not in variables:
                    known = ", ".join(f"${{{v}}}" for v in sorted(variables)) or "none"
                    errors.append(f"{where}: unknown variable ${{{variable}}} (known: {known})")
                else:
                    parts.append(variables[variable])
                continue
            if _WHOLE.match(placeholder):
                multi = token.group(0)
                parts.append(slice(0, None))
            elif m := _LEVEL.match(placeholder):
                n = int(m.group(1))
                if check_index(n, token.group(0)):
                    parts.append(n - 1)
                    needs = max(needs, n)
            elif m := _RANGE.match(placeholder):
                multi = token.group(0)
                first = int(m.group(1))
                if m.group(2) == "#":
                    if check_index(first, token.group(0)):
                        parts.append(slice(first - 1, None))
                        needs = max(needs, first)
                else:
                    last = int(m.group(2))
                    if first > last:
                        errors.append(
                            f"{where}: {token.group(0)} runs backwards ({first} > {last})"
                        )
                    elif check_index(first, token.group(0)) and check_index(last, token.group(0)):
                        parts.append(slice(first - 1, last))
                        needs = max(needs, last)
            else:
                errors.append(f"{where}: {token.group(0)} is no placeholder")
        if at < len(level):
            parts.append(level[at:])
        for part in parts:
            if type(part) is str and ("{" in part or "}" in part):
                errors.append(
                    f"{where}: a brace in {level!r} opens or closes no placeholder "
                    "({n}, {n-m}, {n-#}, {#}, ${variable})"
                )
                break
        if multi is not None and len(parts) > 1:
            errors.append(
                f"{where}: {multi} stands for whole levels, so nothing may be written "
                f"next to it in the level {level!r}"
            )
        # Adjacent text parts come from variables: join them.
        merged: list[_Part] = []
        for part in parts:
            if merged and type(part) is str and type(merged[-1]) is str:
                merged[-1] = merged[-1] + part
            else:
                merged.append(part)
        compiled.append(tuple(merged) or ("",))
    if len(errors) > found:
        return None
    return _Template(compiled, needs)


class _Rule:
    __slots__ = ("excludes", "filter", "preserve_retained", "template")

    def __init__(
        self,
        filter: str,
        excludes: tuple[str, ...],
        template: _Template | None,
        preserve_retained: bool,
    ) -> None:
        self.filter = filter
        self.excludes = excludes
        self.template = template
        self.preserve_retained = preserve_retained


class TopicMapper:
    """The mappings of one direction of a bridge, compiled.

    :param mappings: the rules, in order (the first that takes a topic decides).
    :param variables: values of ``${name}`` (``bridge.name`` and the bridge's own).
    :param limits: the topic limits filters are checked against.
    :raises ConfigurationError: listing every problem of every mapping.
    """

    CACHE_SIZE = 4096

    def __init__(
        self,
        mappings: Iterable[TopicMapping],
        variables: Mapping[str, str] | None = None,
        *,
        limits: TopicLimits = _DEFAULT_LIMITS,
        numbers: Iterable[int] | None = None,
    ) -> None:
        variables = dict(variables or {})
        errors: list[str] = []
        self.mappings = tuple(mappings)
        self._rules: list[_Rule] = []
        self._index: SubscriptionIndex[int] = SubscriptionIndex()
        if numbers is None:
            numbers = range(1, len(self.mappings) + 1)
        for number, mapping in zip(numbers, self.mappings, strict=True):
            where = f"topic mapping {number} ({mapping.filter!r})"
            rule = self._compile(mapping, variables, limits, errors, where)
            if rule is not None:
                self._index.add(rule.filter, len(self._rules))
                self._rules.append(rule)
        if errors:
            raise ConfigurationError(_listed(errors), errors)
        self._cache: dict[str, Mapped | _Outcome] = {}
        #: Every rule keeps the topic and excludes nothing (plain subscriptions): then
        #: :meth:`map` changes nothing of a message that is not retained.
        self.keeps_topics = all(r.template is None and not r.excludes for r in self._rules)

    @staticmethod
    def _compile(
        mapping: TopicMapping,
        variables: Mapping[str, str],
        limits: TopicLimits,
        errors: list[str],
        where: str,
    ) -> _Rule | None:
        found = len(errors)
        if mapping.mode not in ("PUB", "SUB"):
            errors.append(f"{where}: mode must be 'PUB' or 'SUB', not {mapping.mode!r}")
        try:
            parsed = parse_subscription(mapping.filter, limits)
            if parsed.is_shared or parsed.no_export:
                errors.append(f"{where}: a mapping's filter takes no '#share/' or '#noexport/'")
        except InvalidTopicError as exc:
            errors.append(f"{where}: {exc}")
        excludes = []
        for exclude in mapping.excludes:
            if _TOKEN.search(exclude):
                errors.append(
                    f"{where}: excludes are plain filters ({exclude!r} has a placeholder; "
                    "write '*' for any one level and '>' for the rest)"
                )
                continue
            try:
                parse_subscription(exclude, limits)
                excludes.append(exclude)
            except InvalidTopicError as exc:
                errors.append(f"{where}: exclude {exc}")
        template = None
        if mapping.destination is not None and len(errors) == found:
            template = _compile_template(
                mapping.destination, mapping.filter, variables, errors, f"{where}: destination"
            )
        if len(errors) > found:
            return None
        return _Rule(mapping.filter, tuple(excludes), template, mapping.preserve_retained)

    def __bool__(self) -> bool:
        return bool(self._rules)

    @property
    def filters(self) -> tuple[str, ...]:
        """The mappings' filters, in order (what the direction subscribes to)."""
        return tuple(rule.filter for rule in self._rules)

    def map(self, topic: str) -> Mapped | _Outcome:
        """Where ``topic`` goes: a :class:`Mapped`, or :data:`NO_MATCH`,
        :data:`EXCLUDED` or :data:`TOO_SHORT`."""
        cache = self._cache
        result = cache.get(topic)
        if result is None:
            result = self._map(topic)
            if len(cache) >= self.CACHE_SIZE:
                cache.clear()
            cache[topic] = result
        return result

    def _map(self, topic: str) -> Mapped | _Outcome:
        matches = self._index.match(topic)
        if not matches:
            return NO_MATCH
        rule = self._rules[min(matches)]
        for exclude in rule.excludes:
            if filter_matches(exclude, topic):
                return EXCLUDED
        if rule.template is None:
            return Mapped(topic, rule.preserve_retained)
        mapped = rule.template.render(topic)
        if mapped is None:
            return TOO_SHORT
        return Mapped(mapped, rule.preserve_retained)


def _listed(problems: list[str]) -> str:
    return "bad topic mapping:" + "".join(f"\n  - {p}" for p in problems)


def directions(
    mappings: Sequence[TopicMapping],
    variables: Mapping[str, str],
    *,
    subscriptions: Iterable[str] = (),
    limits: TopicLimits = _DEFAULT_LIMITS,
) -> tuple[TopicMapper, TopicMapper]:
    """A bridge's PUB and SUB mappers, with its plain ``subscriptions`` last in SUB
    (topics kept). Mappings are numbered by their place in ``mappings``.

    :raises ConfigurationError: listing every problem of both directions.
    """
    problems = [
        f"topic mapping {i} ({m.filter!r}): mode must be 'PUB' or 'SUB', not {m.mode!r}"
        for i, m in enumerate(mappings, 1)
        if m.mode not in ("PUB", "SUB")
    ]
    mappers = []
    for mode in ("PUB", "SUB"):
        chosen = [(i, m) for i, m in enumerate(mappings, 1) if m.mode == mode]
        if mode == "SUB":
            after = len(mappings) + 1
            chosen += [(after + i, TopicMapping(f)) for i, f in enumerate(subscriptions)]
        try:
            mappers.append(
                TopicMapper(
                    [m for _, m in chosen],
                    variables,
                    limits=limits,
                    numbers=[i for i, _ in chosen],
                )
            )
        except ConfigurationError as exc:
            problems.extend(exc.problems)
    if problems:
        raise ConfigurationError(_listed(problems), problems)
    return mappers[0], mappers[1]
