"""``meshbus sub -F`` and ``meshbus pub``'s payloads, in-process: bytes in, bytes out.

Each output format is a function of the message, checked here on payloads that are
not UTF-8, are UTF-8 and are empty; ``pub``'s input and argument checks run before
it connects, so they are checked against an address nobody listens on. (The same
paths across real processes are in ``tests/test_cli_clients.py``.)
"""

from __future__ import annotations

import base64
import io
import os
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest

from meshbus import DeliveryMode, Message
from meshbus.app._cli import main
from meshbus.app._clients import FORMATS, _payloads

NOT_UTF8 = b"\x00\xff\xfe"  # the example
LATIN1 = "café".encode("latin-1")
UTF8 = "café ☕\nline 2".encode()
NOWHERE = ["--url", "tcp://127.0.0.1:1"]  # refused before connecting, or it would fail


def message(payload: bytes) -> Message:
    return Message("plant/boiler", payload, sender="gauge", timestamp=12.5, headers={"unit": "bar"})


def shown(form: str, payload: bytes) -> bytes:
    out = io.BytesIO()
    FORMATS[form](message(payload), out)
    return out.getvalue()


@pytest.mark.parametrize("payload", [NOT_UTF8, LATIN1, UTF8, b""])
def test_raw_hex_and_base64_keep_every_byte(payload: bytes) -> None:
    assert shown("raw", payload) == payload  # nothing added, not even a newline
    assert shown("hex", payload) == b"plant/boiler " + payload.hex().encode() + b"\n"
    assert shown("base64", payload) == b"plant/boiler " + base64.b64encode(payload) + b"\n"


def test_text_shows_bytes_that_are_not_utf8_as_escapes_never_replaced() -> None:
    assert shown("text", NOT_UTF8) == b"plant/boiler \x00\\xff\\xfe\n"
    assert shown("text", LATIN1) == b"plant/boiler caf\\xe9\n"
    assert shown("text", UTF8) == b"plant/boiler " + UTF8 + b"\n"  # UTF-8 whatever the locale
    assert shown("text", b"") == b"plant/boiler \n"
    assert "\ufffd".encode() not in shown("text", NOT_UTF8 + LATIN1)


@pytest.mark.parametrize(
    ("payload", "written", "encoding"),
    [
        (NOT_UTF8, base64.b64encode(NOT_UTF8).decode(), "base64"),
        (LATIN1, base64.b64encode(LATIN1).decode(), "base64"),
        (UTF8, UTF8.decode(), "utf-8"),
        (b"", "", "utf-8"),
    ],
)
def test_json_writes_text_when_it_is_utf8_and_base64_saying_so_when_not(
    payload: bytes, written: str, encoding: str
) -> None:
    line = shown("json", payload)
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1  # one object per line
    assert orjson.loads(line) == {
        "topic": "plant/boiler",
        "payload": written,
        "payload_encoding": encoding,
        "sender": "gauge",
        "timestamp": 12.5,
        "headers": {"unit": "bar"},
        "delivery_mode": DeliveryMode.DIRECT.value,
        "retained": False,
        "expires_at": None,
    }


def pub_args(**given: object) -> SimpleNamespace:
    args = {"message": None, "file": None, "lines": False, "count": 1}
    return SimpleNamespace(**{**args, **given})


def test_pub_takes_an_argument_that_is_not_utf8_as_its_bytes() -> None:
    # What Python makes of an argv entry that is not UTF-8: surrogate escapes.
    argument = os.fsdecode(LATIN1)
    assert _payloads(pub_args(message=argument)) == [LATIN1]
    assert _payloads(pub_args(message="hé", count=2)) == ["hé".encode()] * 2


def test_pub_reads_a_file_or_stdin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "payload.bin"
    path.write_bytes(NOT_UTF8 + b"\n" + LATIN1)
    assert _payloads(pub_args(file=str(path))) == [NOT_UTF8 + b"\n" + LATIN1]
    assert _payloads(pub_args(file=str(path), lines=True)) == [NOT_UTF8, LATIN1]
    for given in ({"message": "-"}, {"file": "-"}, {}):
        monkeypatch.setattr("sys.stdin", SimpleNamespace(buffer=io.BytesIO(UTF8)))
        assert _payloads(pub_args(**given)) == [UTF8], given


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["-f", "{missing}", "t"], "cannot read {missing}: No such file or directory"),
        (["-f", "{folder}", "t"], "cannot read {folder}: Is a directory"),
        (["-f", "{missing}", "t", "hi"], "give a MESSAGE or --file, not both"),
        (["-l", "t", "hi"], "--lines reads standard input or --file, not a MESSAGE"),
        ([b"t/\xff", "hi"], "TOPIC is not UTF-8 text: b't/\\xff'"),
        (["--header", b"k=\xff", "t", "hi"], "--header is not UTF-8 text: b'k=\\xff'"),
        (["--vpn", b"\xe9", "t", "hi"], "--vpn is not UTF-8 text: b'\\xe9'"),
    ],
)
def test_pub_refuses_what_it_cannot_send_in_one_line_and_exits_1(
    args: list[str | bytes], error: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    where = {"missing": tmp_path / "missing.bin", "folder": tmp_path}
    argv = [
        os.fsdecode(a) if isinstance(a, bytes) else a.format(**where)  # as the OS gives them
        for a in args
    ]
    assert main(["pub", *NOWHERE, *argv]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"meshbus pub: error: {error.format(**where)}\n"


def test_sub_refuses_a_filter_that_is_not_utf8(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sub", *NOWHERE, os.fsdecode(b"plant/\xff")]) == 1
    assert (
        capsys.readouterr().err == "meshbus sub: error: FILTER is not UTF-8 text: b'plant/\\xff'\n"
    )
