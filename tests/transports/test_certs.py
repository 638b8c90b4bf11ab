"""Development certificates: their contents, real TLS handshakes, errors and the CLI."""

from __future__ import annotations

import ipaddress
import os
import socket
import ssl
import stat
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from meshbus.errors import ConfigurationError
from meshbus.transports.certs import (
    CertificatePaths,
    certificate_identity,
    make_ca,
    make_client_certificate,
    make_server_certificate,
)

# -- helpers ---------------------------------------------------------------------------------


def _load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _server_context(paths: CertificatePaths, *, client_ca: Path | None = None) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(paths.certificate, paths.private_key)
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.verify_flags |= ssl.VERIFY_X509_STRICT
        context.load_verify_locations(cafile=client_ca)
    return context


def _client_context(ca: Path, client: CertificatePaths | None = None) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies and checks the host name
    # The strict checks Python 3.13 turns on by default in create_default_context().
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    context.load_verify_locations(cafile=ca)
    if client is not None:
        context.load_cert_chain(client.certificate, client.private_key)
    return context


class _Outcome:
    def __init__(self) -> None:
        self.server_error: BaseException | None = None
        self.client_error: BaseException | None = None
        self.peer_certificate: dict[str, Any] | None = None
        self.reply = b""


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, server_hostname: str) -> _Outcome:
    """Run a TLS handshake over a socket pair, the server side in a thread.

    A server that accepts sends ``b"ok"``; the client reads it, so that a client
    certificate refused after a TLS 1.3 handshake surfaces on both sides.
    """
    outcome = _Outcome()
    server_sock, client_sock = socket.socketpair()
    server_sock.settimeout(5)
    client_sock.settimeout(5)

    def serve() -> None:
        try:
            with server.wrap_socket(server_sock, server_side=True) as tls:
                outcome.peer_certificate = tls.getpeercert()
                tls.sendall(b"ok")
        except (OSError, ssl.SSLError) as exc:
            outcome.server_error = exc
        finally:
            server_sock.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with client.wrap_socket(client_sock, server_hostname=server_hostname) as tls:
            outcome.reply = tls.recv(2)
    except (OSError, ssl.SSLError) as exc:
        outcome.client_error = exc
    finally:
        client_sock.close()
        thread.join(5)
    assert not thread.is_alive()
    return outcome


@pytest.fixture
def ca_dir(tmp_path: Path) -> Path:
    make_ca(tmp_path)
    return tmp_path


# -- the files -------------------------------------------------------------------------------


def test_make_ca_writes_a_self_signed_ca(tmp_path: Path) -> None:
    paths = make_ca(tmp_path / "new" / "certs", name="test CA", days=30)
    assert paths == CertificatePaths(
        tmp_path / "new" / "certs" / "ca.pem", tmp_path / "new" / "certs" / "ca-key.pem"
    )
    certificate = _load(paths.certificate)
    assert certificate.subject == certificate.issuer
    assert certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "test CA"
    certificate.verify_directly_issued_by(certificate)
    assert isinstance(certificate.signature_hash_algorithm, hashes.SHA256)
    public_key = certificate.public_key()
    assert isinstance(public_key, ec.EllipticCurvePublicKey)
    assert isinstance(public_key.curve, ec.SECP256R1)
    lifetime = certificate.not_valid_after_utc - datetime.now(UTC)
    assert timedelta(days=29, hours=23) < lifetime <= timedelta(days=30)

    extensions = certificate.extensions
    basic = extensions.get_extension_for_class(x509.BasicConstraints)
    assert basic.critical
    assert basic.value.ca
    usage = extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign
    assert usage.crl_sign
    ski = extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    assert ski == x509.SubjectKeyIdentifier.from_public_key(public_key)

    key = serialization.load_pem_private_key(paths.private_key.read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert key.public_key() == public_key
    if sys.platform != "win32":
        assert stat.S_IMODE(paths.private_key.stat().st_mode) == 0o600


def test_make_server_certificate_names_its_hosts(ca_dir: Path) -> None:
    paths = make_server_certificate(ca_dir)
    assert paths == CertificatePaths(ca_dir / "server.pem", ca_dir / "server-key.pem")
    ca = _load(ca_dir / "ca.pem")
    certificate = _load(paths.certificate)
    certificate.verify_directly_issued_by(ca)
    assert certificate.issuer == ca.subject
    assert isinstance(certificate.signature_hash_algorithm, hashes.SHA256)
    public_key = certificate.public_key()
    assert isinstance(public_key, ec.EllipticCurvePublicKey)
    assert isinstance(public_key.curve, ec.SECP256R1)

    extensions = certificate.extensions
    san = extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    ]
    eku = extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert not extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    aki = extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    ca_ski = ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    assert aki.key_identifier == ca_ski.digest
    # The file holds the leaf only.
    assert paths.certificate.read_bytes().count(b"BEGIN CERTIFICATE") == 1
    if sys.platform != "win32":
        assert stat.S_IMODE(paths.private_key.stat().st_mode) == 0o600


def test_server_certificate_with_custom_hosts_in_another_directory(
    ca_dir: Path, tmp_path: Path
) -> None:
    paths = make_server_certificate(
        tmp_path / "edge",
        ca_dir=ca_dir,
        name="edge",
        hosts=["bus.example.test", "*.dev.example.test", "10.1.2.3", "10.1.2.3"],
    )
    assert paths.certificate == tmp_path / "edge" / "edge.pem"
    certificate = _load(paths.certificate)
    san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["bus.example.test", "*.dev.example.test"]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.1.2.3")]


def test_make_client_certificate_carries_the_username(ca_dir: Path) -> None:
    paths = make_client_certificate(ca_dir, "alice")
    assert paths == CertificatePaths(ca_dir / "alice.pem", ca_dir / "alice-key.pem")
    certificate = _load(paths.certificate)
    certificate.verify_directly_issued_by(_load(ca_dir / "ca.pem"))
    assert certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "alice"
    eku = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    der = certificate.public_bytes(serialization.Encoding.DER)
    assert certificate_identity(der) == "alice"
    assert certificate_identity(paths.certificate.read_bytes()) == "alice"


def test_leaf_certificates_never_outlive_their_ca(tmp_path: Path) -> None:
    make_ca(tmp_path, days=10)
    ca = _load(tmp_path / "ca.pem")
    leaf = _load(make_client_certificate(tmp_path, "bob", days=365).certificate)
    assert leaf.not_valid_after_utc == ca.not_valid_after_utc


# -- real handshakes -------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "::1"])
def test_server_certificate_verifies_against_the_ca(ca_dir: Path, host: str) -> None:
    server = make_server_certificate(ca_dir)
    outcome = _handshake(_server_context(server), _client_context(ca_dir / "ca.pem"), host)
    assert outcome.client_error is None
    assert outcome.server_error is None
    assert outcome.reply == b"ok"


def test_server_certificate_does_not_match_other_hosts(ca_dir: Path) -> None:
    server = make_server_certificate(ca_dir)
    outcome = _handshake(
        _server_context(server), _client_context(ca_dir / "ca.pem"), "bus.example.test"
    )
    assert isinstance(outcome.client_error, ssl.SSLCertVerificationError)


def test_client_certificate_logs_in_as_its_username(ca_dir: Path) -> None:
    server = make_server_certificate(ca_dir)
    client = make_client_certificate(ca_dir, "alice")
    outcome = _handshake(
        _server_context(server, client_ca=ca_dir / "ca.pem"),
        _client_context(ca_dir / "ca.pem", client),
        "localhost",
    )
    assert outcome.server_error is None
    assert outcome.client_error is None
    assert outcome.reply == b"ok"
    assert outcome.peer_certificate is not None
    assert certificate_identity(outcome.peer_certificate) == "alice"


def test_server_certificate_from_another_ca_is_untrusted(tmp_path: Path) -> None:
    make_ca(tmp_path / "theirs")
    make_ca(tmp_path / "ours")
    server = make_server_certificate(tmp_path / "theirs")
    outcome = _handshake(
        _server_context(server), _client_context(tmp_path / "ours" / "ca.pem"), "localhost"
    )
    assert isinstance(outcome.client_error, ssl.SSLCertVerificationError)
    assert outcome.reply == b""


def test_client_certificate_from_another_ca_is_untrusted(tmp_path: Path) -> None:
    make_ca(tmp_path / "theirs")
    make_ca(tmp_path / "ours")
    server = make_server_certificate(tmp_path / "ours")
    intruder = make_client_certificate(tmp_path / "theirs", "mallory")
    outcome = _handshake(
        _server_context(server, client_ca=tmp_path / "ours" / "ca.pem"),
        _client_context(tmp_path / "ours" / "ca.pem", intruder),
        "localhost",
    )
    assert isinstance(outcome.server_error, ssl.SSLError)
    assert outcome.peer_certificate is None
    assert outcome.reply == b""


def test_a_client_certificate_cannot_serve(ca_dir: Path) -> None:
    # clientAuth only: a stolen client certificate does not impersonate a server.
    client = make_client_certificate(ca_dir, "localhost")
    outcome = _handshake(_server_context(client), _client_context(ca_dir / "ca.pem"), "localhost")
    assert isinstance(outcome.client_error, ssl.SSLCertVerificationError)


# -- certificate_identity --------------------------------------------------------------------


def test_certificate_identity_of_getpeercert_dictionaries() -> None:
    subject = ((("organizationName", "meshbus"),), (("commonName", "bob"),))
    assert certificate_identity({"subject": subject, "version": 3}) == "bob"
    assert certificate_identity({"subject": ((("commonName", "a"), ("commonName", "b")),)}) is None
    assert certificate_identity({"subject": ((("organizationName", "meshbus"),),)}) is None
    assert certificate_identity({}) is None
    assert certificate_identity(None) is None


def test_certificate_identity_of_bytes_that_are_not_a_certificate() -> None:
    assert certificate_identity(b"") is None
    assert certificate_identity(b"\x30\x03\x02\x01\x01") is None
    assert certificate_identity(b"-----BEGIN CERTIFICATE-----\nnope\n") is None


# -- refusals --------------------------------------------------------------------------------


def test_existing_files_are_not_overwritten(ca_dir: Path) -> None:
    before = (ca_dir / "ca.pem").read_bytes()
    with pytest.raises(ConfigurationError, match=r"ca\.pem already exists.*overwrite"):
        make_ca(ca_dir)
    assert (ca_dir / "ca.pem").read_bytes() == before
    make_client_certificate(ca_dir, "alice")
    with pytest.raises(ConfigurationError, match=r"alice\.pem already exists"):
        make_client_certificate(ca_dir, "alice")
    make_server_certificate(ca_dir)
    with pytest.raises(ConfigurationError, match=r"server\.pem already exists"):
        make_server_certificate(ca_dir)


def test_overwrite_replaces_files(ca_dir: Path) -> None:
    before = (ca_dir / "ca.pem").read_bytes()
    make_ca(ca_dir, overwrite=True)
    assert (ca_dir / "ca.pem").read_bytes() != before
    first = make_client_certificate(ca_dir, "alice").certificate.read_bytes()
    assert make_client_certificate(ca_dir, "alice", overwrite=True).certificate.read_bytes() != (
        first
    )
    if sys.platform != "win32":
        assert stat.S_IMODE((ca_dir / "ca-key.pem").stat().st_mode) == 0o600


def test_a_leaf_never_replaces_the_ca_files(ca_dir: Path) -> None:
    with pytest.raises(ConfigurationError, match="file of the CA"):
        make_client_certificate(ca_dir, "ca", overwrite=True)
    _load(ca_dir / "ca.pem").verify_directly_issued_by(_load(ca_dir / "ca.pem"))


def test_missing_ca_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"ca\.pem is missing.*meshbus certs ca"):
        make_server_certificate(tmp_path)
    with pytest.raises(ConfigurationError, match=r"make_ca\(\)"):
        make_client_certificate(tmp_path, "alice", ca_dir=tmp_path / "nowhere")
    assert list(tmp_path.iterdir()) == []


def test_a_ca_key_that_does_not_match_is_refused(tmp_path: Path) -> None:
    make_ca(tmp_path / "a")
    make_ca(tmp_path / "b")
    os.replace(tmp_path / "b" / "ca-key.pem", tmp_path / "a" / "ca-key.pem")
    with pytest.raises(ConfigurationError, match="does not belong"):
        make_client_certificate(tmp_path / "a", "alice")


@pytest.mark.parametrize(
    "username",
    ["", "a/b", "..", ".hidden", "x" * 65, "tab\there", " padded", "a\\b", "c:d", "#", 42],
)
def test_invalid_usernames_are_refused(ca_dir: Path, username: Any) -> None:
    with pytest.raises(ConfigurationError, match="username"):
        make_client_certificate(ca_dir, username)


@pytest.mark.parametrize(
    "host",
    ["", "bad host", "-dash.example", "a..b", "1.2.3", "fe80::1%eth0", "bücher.example", "*"],
)
def test_invalid_hosts_are_refused(ca_dir: Path, host: str) -> None:
    with pytest.raises(ConfigurationError, match="host"):
        make_server_certificate(ca_dir, hosts=[host])


def test_invalid_options_are_refused(ca_dir: Path) -> None:
    with pytest.raises(ConfigurationError, match="at least one host"):
        make_server_certificate(ca_dir, hosts=[])
    with pytest.raises(ConfigurationError, match="days"):
        make_client_certificate(ca_dir, "alice", days=0)
    with pytest.raises(ConfigurationError, match="days"):
        make_ca(ca_dir / "other", days=True)
    with pytest.raises(ConfigurationError, match="CA name"):
        make_ca(ca_dir / "other", name="")
    assert not (ca_dir / "alice.pem").exists()
