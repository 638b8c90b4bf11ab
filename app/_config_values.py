"""Value checking for node configuration files (see :mod:`meshbus._config`).

What every section reader of :mod:`meshbus._config_schema` builds on:

* :class:`_ValueChecker`, which collects the problems found (``"FILE: key.path: why"``),
  expands ``${ENV:NAME}`` placeholders, converts TOML values to the types the attrs
  classes' fields name, reports unknown keys and builds attrs objects key by key;
* the helpers that word the problems (:func:`_join` writes a key path as TOML does,
  :func:`_describe`, :func:`_suggest`, :func:`_choice`, :func:`_reason`) and
  :func:`_failure`, the one :class:`~meshbus.ConfigurationError` that lists them.
"""

from __future__ import annotations

import difflib
import enum
import functools
import json
import re
import typing
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from types import UnionType
from typing import Any

import attrs

from meshbus import ConfigurationError

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+\Z")
_PLACEHOLDER = re.compile(r"\$\$\{|\$\{([^}]*)\}|\$\{")
_ENV_PLACEHOLDER = re.compile(r"ENV:([A-Za-z_][A-Za-z0-9_]*)\Z")
_TEMPLATE_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*\Z")
#: Keys whose strings are templates with ``${name}`` variables of their own: there
#: only ``${ENV:NAME}`` is an environment placeholder.
TEMPLATE_KEYS = frozenset({"destination"})
_VALIDATION_ERRORS = (ConfigurationError, TypeError, ValueError)


def _failure(source: str, problems: list[str]) -> ConfigurationError:
    count = len(problems)
    return ConfigurationError(
        f"invalid configuration {source}: {count} problem{'' if count == 1 else 's'}", problems
    )


class _Bad:
    """Stands for a value already reported as wrong (a missing environment variable)."""

    def __repr__(self) -> str:
        return "<bad value>"


_BAD = _Bad()


class _Invalid(Exception):
    """A value is wrong: ``why`` (``None`` when already reported), at ``path + suffix``."""

    def __init__(self, why: str | None, suffix: str = "") -> None:
        super().__init__(why)
        self.why = why
        self.suffix = suffix


def _key(name: str) -> str:
    """A key as TOML writes it in a dotted path: bare when it can be, else quoted."""
    return name if _BARE_KEY.match(name) else json.dumps(name, ensure_ascii=False)


def _join(path: str, key: str) -> str:
    return f"{path}.{_key(key)}" if path else _key(key)


def _describe(value: object) -> str:
    if isinstance(value, str):
        return f"string {value!r}"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, int | float):
        return f"{type(value).__name__.replace('int', 'integer')} {value!r}"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return f"a {type(value).__name__}"


def _suggest(word: str, choices: Collection[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _choice(value: object, choices: Collection[str]) -> str:
    listed = ", ".join(repr(c) for c in choices)
    hint = _suggest(value, choices) if isinstance(value, str) else ""
    return f"expected one of {listed}, got {_describe(value)}{hint}"


@functools.cache
def _field_types(cls: Any) -> dict[str, Any]:
    """The type of each field an attrs class takes in ``__init__``, resolved."""
    hints = typing.get_type_hints(cls)
    return {field.name: hints.get(field.name, Any) for field in attrs.fields(cls) if field.init}


def _reason(exc: BaseException, cls: Any, key: str | None) -> str:
    """An attrs validator's message without the field name it starts with (the path has it)."""
    text = str(exc)
    if key is not None:
        for prefix in (f"{cls.__name__}.{key} ", f"queue setting {key} ", f"{key} "):
            if text.startswith(prefix):
                return text[len(prefix) :]
    return text


class _ValueChecker:
    """Converts the values of a parsed document and collects every problem found."""

    def __init__(self, source: str, environ: Mapping[str, str], base_dir: Path) -> None:
        self.source = source
        self.environ = environ
        self.base_dir = base_dir
        self.problems: list[str] = []

    def report(self, path: str, why: str) -> None:
        self.problems.append(f"{self.source}: {path}: {why}" if path else f"{self.source}: {why}")

    def join(self, path: str, key: str) -> str:
        """``path.key``, with ``key`` quoted when TOML would need it."""
        return _join(path, key)

    def suggest(self, word: str, choices: Collection[str]) -> str:
        """`` (did you mean 'x'?)`` for a close choice, else nothing."""
        return _suggest(word, choices)

    # --- environment placeholders ------------------------------------------------------

    def expand(self, value: object, path: str) -> object:
        if isinstance(value, str):
            return self._expand_text(value, path) if "${" in value else value
        if isinstance(value, list):
            return [self.expand(item, f"{path}[{i}]") for i, item in enumerate(value)]
        if isinstance(value, dict):
            return {key: self.expand(item, _join(path, key)) for key, item in value.items()}
        return value

    def _expand_text(self, text: str, path: str) -> object:
        failed = False
        # A bridge mapping's destination has variables of its own (``${bridge.name}``).
        template = path.rpartition(".")[2] in TEMPLATE_KEYS

        def substitute(match: re.Match[str]) -> str:
            nonlocal failed
            token = match.group(0)
            if token == "$${":
                return "${"
            if token == "${":
                self.report(path, "'${' without a closing '}' (write $${ for a literal '${')")
            else:
                name = _ENV_PLACEHOLDER.match(match.group(1))
                if name is None and template and _TEMPLATE_VARIABLE.match(match.group(1)):
                    return token  # the template's own variable, for the plugin to fill in
                if name is None:
                    self.report(
                        path,
                        f"unknown placeholder {token!r}: write ${{ENV:NAME}} for an "
                        "environment variable, or $${ for a literal '${'",
                    )
                else:
                    value = self.environ.get(name.group(1))
                    if value is not None:
                        return value
                    self.report(path, f"environment variable {name.group(1)!r} is not set")
            failed = True
            return ""

        expanded = _PLACEHOLDER.sub(substitute, text)
        return _BAD if failed else expanded

    # --- values ------------------------------------------------------------------------

    def convert(self, value: object, hint: Any) -> Any:
        """``value`` as the type ``hint`` names; raise :class:`_Invalid` if it is not one."""
        if value is _BAD:
            raise _Invalid(None)
        if isinstance(hint, UnionType) or typing.get_origin(hint) is typing.Union:
            # TOML has no null: an optional field is given its value or left out.
            options = [arg for arg in typing.get_args(hint) if arg is not type(None)]
            if len(options) != 1:
                return value  # a union this loader does not know: the validator judges
            hint = options[0]
        if hint is bool:
            if isinstance(value, bool):
                return value
            raise _Invalid(f"expected a boolean, got {_describe(value)}")
        if hint is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            raise _Invalid(f"expected an integer, got {_describe(value)}")
        if hint is float:
            if isinstance(value, int | float) and not isinstance(value, bool):
                return value
            raise _Invalid(f"expected a number, got {_describe(value)}")
        if hint is str:
            if isinstance(value, str):
                return value
            raise _Invalid(f"expected a string, got {_describe(value)}")
        if hint is Path:
            if isinstance(value, str) and value:
                return self.base_dir / Path(value).expanduser()
            raise _Invalid(f"expected a file path (a non-empty string), got {_describe(value)}")
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            choices = [member.value for member in hint]
            if isinstance(value, str) and value in choices:
                return hint(value)
            raise _Invalid(_choice(value, choices))
        args = typing.get_args(hint)
        if typing.get_origin(hint) is tuple and len(args) == 2 and args[1] is Ellipsis:
            if not isinstance(value, list):
                raise _Invalid(f"expected an array, got {_describe(value)}")
            items = []
            for i, item in enumerate(value):
                try:
                    items.append(self.convert(item, args[0]))
                except _Invalid as exc:
                    raise _Invalid(exc.why, f"[{i}]{exc.suffix}") from None
            return tuple(items)
        return value  # a type this loader does not know: the class's validator judges it

    def value(self, raw: object, hint: Any, path: str) -> Any:
        """:meth:`convert`, reporting a problem and returning ``None`` when it fails."""
        try:
            return self.convert(raw, hint)
        except _Invalid as exc:
            if exc.why is not None:
                self.report(path + exc.suffix, exc.why)
            return None

    def table(self, raw: object, path: str) -> dict[str, Any] | None:
        if raw is _BAD:
            return None
        if not isinstance(raw, dict):
            self.report(path, f"expected a table, got {_describe(raw)}")
            return None
        return raw

    def keys(self, table: Mapping[str, Any], path: str, allowed: Collection[str]) -> bool:
        """Report every key of ``table`` not in ``allowed``; whether there was none."""
        clean = True
        for key in table:
            if key not in allowed:
                close = difflib.get_close_matches(key, list(allowed), n=1)
                if close:
                    why = f"unknown key (did you mean {close[0]!r}?)"
                else:
                    why = f"unknown key (expected one of: {', '.join(allowed)})"
                self.report(_join(path, key), why)
                clean = False
        return clean

    def named_tables(
        self,
        raw: object,
        path: str,
        build: Callable[[str, dict[str, Any], str], Any],
    ) -> tuple[Any, ...]:
        """Build one object per sub-table of ``raw`` (``[path.NAME]``), skipping bad ones."""
        if raw is None:
            return ()
        tables = self.table(raw, path)
        built = []
        for name, item in (tables or {}).items():
            item_path = _join(path, name)
            table = self.table(item, item_path)
            if table is not None:
                made = build(name, table, item_path)
                if made is not None:
                    built.append(made)
        return tuple(built)

    def attrs_value(
        self,
        cls: Any,
        table: Mapping[str, Any],
        path: str,
        *,
        name: str | None = None,
        exclude: Collection[str] = (),
        extra: Mapping[str, Any] | None = None,
        defaults: Mapping[str, Any] | None = None,
    ) -> Any:
        """Make ``cls(name, **table)`` from a table whose keys are the class's fields.

        Each key is converted and then checked by the class's own validators on its
        own, so a problem is reported at the key that has it. ``extra`` holds keys the
        caller handled (``None`` when they failed); ``defaults`` replace the class's.
        """
        handled = extra or {}
        fields = {
            key: hint
            for key, hint in _field_types(cls).items()
            if key not in exclude
            and key not in handled
            and not (name is not None and key == "name")
        }
        clean = self.keys({k: v for k, v in table.items() if k not in handled}, path, list(fields))
        clean = clean and all(v is not None for v in handled.values())
        # A known good name, so the probes below fail only for the key they test.
        head = () if name is None else ("probe",)
        kwargs: dict[str, Any] = {}
        for key, raw in table.items():
            if key not in fields:
                continue
            converted = self.value(raw, fields[key], _join(path, key))
            if converted is None or not self._probe(cls, head, key, converted, path):
                clean = False
            else:
                kwargs[key] = converted
        if name is not None:
            try:
                cls(name)
            except _VALIDATION_ERRORS as exc:
                self.report(path, _reason(exc, cls, None))
                return None
        if not clean:
            return None
        args = () if name is None else (name,)
        try:
            return cls(*args, **{**(defaults or {}), **kwargs, **handled})
        except _VALIDATION_ERRORS as exc:
            self.report(path, _reason(exc, cls, None))
            return None

    def _probe(self, cls: Any, head: tuple[str, ...], key: str, value: Any, path: str) -> bool:
        """Run the class's checks on one key; report at the item of a list that fails."""
        try:
            cls(*head, **{key: value})
        except _VALIDATION_ERRORS as exc:
            where = _join(path, key)
            found = False
            for i, item in enumerate(value if isinstance(value, tuple) else ()):
                try:
                    cls(*head, **{key: (item,)})
                except _VALIDATION_ERRORS as item_exc:
                    self.report(f"{where}[{i}]", _reason(item_exc, cls, key))
                    found = True
            if not found:
                self.report(where, _reason(exc, cls, key))
            return False
        return True
