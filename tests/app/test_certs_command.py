"""The ``meshbus certs`` command (the library it drives is tested in tests/transports)."""

from __future__ import annotations

import argparse
import ipaddress
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from meshbus.app._certs import add_parser, run
from meshbus.transports.certs import MISSING_CRYPTOGRAPHY


def _load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


# -- the command -----------------------------------------------------------------------------


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="meshbus")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["certs", *argv])


def test_certs_all_makes_everything(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = tmp_path / "meshbus-certs"
    args = _parse("all", "--dir", str(directory), "--client", "alice", "--client", "bob")
    assert run(args) == 0
    names = ["ca", "ca-key", "server", "server-key", "alice", "alice-key", "bob", "bob-key"]
    assert sorted(p.name for p in directory.iterdir()) == sorted(f"{n}.pem" for n in names)
    out = capsys.readouterr().out.splitlines()
    assert out == [f"wrote {directory / f'{n}.pem'}" for n in names]
    ca = _load(directory / "ca.pem")
    for name in ("server", "alice", "bob"):
        _load(directory / f"{name}.pem").verify_directly_issued_by(ca)


def test_certs_actions_one_by_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = str(tmp_path)
    assert run(_parse("ca", "--dir", directory)) == 0
    assert run(_parse("server", "--dir", directory, "--name", "edge", "--host", "10.0.0.7")) == 0
    assert run(_parse("client", "carol", "--dir", directory, "--days", "7")) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"wrote {tmp_path / name}"
        for name in (
            "ca.pem",
            "ca-key.pem",
            "edge.pem",
            "edge-key.pem",
            "carol.pem",
            "carol-key.pem",
        )
    ]
    san = _load(tmp_path / "edge.pem").extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    assert san.value.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.7")]


def test_certs_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    args = _parse("all")
    assert args.dir == Path("meshbus-certs")
    assert not args.overwrite
    assert run(args) == 0
    assert (tmp_path / "meshbus-certs" / "server-key.pem").is_file()


def test_certs_errors_go_to_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = str(tmp_path)
    assert run(_parse("client", "alice", "--dir", directory)) == 2
    err = capsys.readouterr().err
    assert err.startswith("meshbus certs: error: no CA in")
    assert "meshbus certs ca" in err

    assert run(_parse("ca", "--dir", directory)) == 0
    capsys.readouterr()
    # `all` checks every file before writing any: nothing is half made.
    assert run(_parse("all", "--dir", directory, "--client", "alice")) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "ca.pem already exists" in captured.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca-key.pem", "ca.pem"]

    assert run(_parse("all", "--dir", directory, "--client", "alice", "--overwrite")) == 0
    assert (tmp_path / "alice.pem").is_file()

    assert run(_parse("all", "--dir", directory, "--overwrite", "--client", "server")) == 2
    assert "two files would be written" in capsys.readouterr().err


# -- without the certs extra -----------------------------------------------------------------


def test_without_cryptography_the_command_names_the_extra(tmp_path: Path) -> None:
    # A plain install has no cryptography (it is the certs extra): the CLI still starts,
    # and `meshbus certs` says what to install instead of failing with a traceback.
    script = (
        "import sys\n"
        "sys.modules['cryptography'] = None  # as if it were not installed\n"
        "from meshbus.app._cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    directory = tmp_path / "certs"
    result = subprocess.run(
        [sys.executable, "-c", script, "certs", "all", "--dir", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"meshbus certs: error: {MISSING_CRYPTOGRAPHY}\n"
    assert "pip install 'meshbus[certs]'" in result.stderr
    assert not directory.exists()
