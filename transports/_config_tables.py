"""Reading the TLS and backoff tables of a configuration file, for any plugin whose
table makes connections (bridges, dynamic routing)."""

from __future__ import annotations

from collections.abc import Callable

from meshbus import ConfigReader, ConfigurationError

from ._backoff import Backoff
from ._settings import TlsSettings

__all__ = ["read_backoff_table", "read_listener_tls_table", "read_tls_table"]

_TLS_FILES = ("ca", "certificate", "private_key")
_CLIENT_ONLY = ("server_hostname", "check_hostname")


def read_listener_tls_table(reader: ConfigReader, raw: object, where: str) -> TlsSettings | None:
    """A ``tls`` table of a listener: its certificate and key (required), and the CA
    that client certificates must be signed by (required with
    ``require_client_certificate``); files checked, and loaded once."""
    table = reader.table(raw, where)
    if table is None:
        return None
    missing = [key for key in ("certificate", "private_key") if key not in table]
    if table.get("require_client_certificate") is True and "ca" not in table:
        missing.append("ca")
    for key in missing:
        why = " (require_client_certificate = true)" if key == "ca" else ""
        reader.report(where, f"missing required key {key!r}{why}")
    settings = reader.attrs_value(TlsSettings, table, where, exclude=_CLIENT_ONLY)
    if settings is None:
        return None
    usable = not missing and _files_exist(reader, settings, where)
    if usable:  # every file is there: check that they hold a certificate and its key
        try:
            settings.server_context()
        except ConfigurationError as exc:
            reader.report(where, str(exc))
            return None
    return settings if usable else None


def _files_exist(reader: ConfigReader, settings: TlsSettings, where: str) -> bool:
    usable = True
    for key in _TLS_FILES:
        file = getattr(settings, key)
        if file is not None and not file.is_file():
            what = "not a file" if file.exists() else "no such file"
            reader.report(reader.join(where, key), f"{what}: {file}")
            usable = False
    return usable


def read_tls_table(reader: ConfigReader, raw: object, where: str) -> TlsSettings | None:
    """A ``tls`` table of a dialling side: what it trusts and the certificate it shows
    (files checked, and loaded once to see that they hold what they should)."""
    table = reader.table(raw, where)
    if table is None:
        return None
    settings = reader.attrs_value(
        TlsSettings, table, where, exclude=("require_client_certificate",)
    )
    if settings is None:
        return None
    usable = _files_exist(reader, settings, where)
    if usable:
        try:
            settings.client_context()  # the files hold what they should
        except ConfigurationError as exc:
            reader.report(where, str(exc))
            return None
    return settings if usable else None


def read_backoff_table(reader: ConfigReader, raw: object, where: str) -> Backoff | None:
    """A ``backoff`` table: ``initial`` and ``maximum`` seconds, ``jitter``."""
    table = reader.table(raw, where)
    if table is None:
        return None
    if not reader.keys(table, where, ("initial", "maximum", "jitter")):
        return None
    values = {}
    checks: tuple[tuple[str, float, Callable[[float], bool], str], ...] = (
        ("initial", 1.0, lambda v: v > 0, "a positive number of seconds"),
        ("maximum", 120.0, lambda v: v > 0, "a positive number of seconds"),
        ("jitter", 0.2, lambda v: 0 <= v < 1, "a fraction from 0 up to 1"),
    )
    for key, default, check, why in checks:
        at = reader.join(where, key)
        value = reader.value(table.get(key, default), float, at)
        if value is not None and not check(value):
            reader.report(at, f"must be {why}, got {value!r}")
            value = None
        values[key] = value
    if None in values.values():
        return None
    if values["maximum"] < values["initial"]:
        reader.report(reader.join(where, "maximum"), "must not be below 'initial'")
        return None
    return Backoff(values["initial"], values["maximum"], values["jitter"])
