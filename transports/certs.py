"""Development certificates: a private CA, server certificates and client certificates.

These are for trying TLS listeners and client-certificate logins on a laptop or a
test network, not for production (use your organisation's PKI there). Every key is
an EC P-256 key, every signature SHA-256, and no key file is encrypted, so each
``*-key.pem`` file is written readable by its owner only (mode ``0o600``).

A directory made by ``meshbus certs all`` (or :func:`make_ca`,
:func:`make_server_certificate` and :func:`make_client_certificate`) holds::

    ca.pem             the CA certificate: what both sides trust
    ca-key.pem         the CA key: keep it to make more certificates
    server.pem         the server certificate (names the hosts it serves)
    server-key.pem
    alice.pem          a client certificate whose common name is the username
    alice-key.pem

A server that requires client certificates trusts ``ca.pem`` and maps each verified
peer to a username with :func:`certificate_identity`.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from meshbus.errors import ConfigurationError

# TLS itself needs only the standard library's ssl: this module, and the ``meshbus
# certs`` command on it, are the only users of cryptography, which the ``certs`` extra
# brings. The module imports without it so that its names (and the command's help)
# stay available; making a certificate then says what to install.
try:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
except ModuleNotFoundError as exc:
    if exc.name is None or exc.name.partition(".")[0] != "cryptography":
        raise
    _HAS_CRYPTOGRAPHY = False
else:
    _HAS_CRYPTOGRAPHY = True

__all__ = [
    "CA_CERTIFICATE",
    "CA_PRIVATE_KEY",
    "DEFAULT_DIRECTORY",
    "DEFAULT_HOSTS",
    "CERTS_ACTIONS",
    "MISSING_CRYPTOGRAPHY",
    "CertificatePaths",
    "certificate_identity",
    "make_ca",
    "make_certificates",
    "make_client_certificate",
    "make_server_certificate",
]

CA_CERTIFICATE = "ca.pem"
"""File name of the CA certificate in a certificate directory."""
CA_PRIVATE_KEY = "ca-key.pem"
"""File name of the CA private key in a certificate directory."""
DEFAULT_DIRECTORY = "meshbus-certs"
"""Where ``meshbus certs`` writes when ``--dir`` is not given (relative to the current folder)."""
DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")
"""The names a server certificate carries when no hosts are given: this machine only."""

_MAX_DAYS = 36500
_CLOCK_SKEW = timedelta(hours=1)
"""Certificates start this long before they are made, so a peer whose clock is a
little behind still accepts them."""
_MAX_COMMON_NAME = 64  # ub-common-name in RFC 5280
_FILE_STEM_FORBIDDEN = frozenset('/\\:*?"<>|#')
_DNS_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?\Z")

if TYPE_CHECKING or _HAS_CRYPTOGRAPHY:
    _IssuerKey = (
        rsa.RSAPrivateKey
        | dsa.DSAPrivateKey
        | ec.EllipticCurvePrivateKey
        | ed25519.Ed25519PrivateKey
        | ed448.Ed448PrivateKey
    )

MISSING_CRYPTOGRAPHY = (
    "making certificates needs the cryptography package, which the certs extra "
    "brings: pip install 'meshbus[certs]'"
)
"""The message of the :class:`~meshbus.errors.ConfigurationError` raised by the
functions here that make or parse certificates when cryptography is not installed."""


def _require_cryptography() -> None:
    if not _HAS_CRYPTOGRAPHY:
        raise ConfigurationError(MISSING_CRYPTOGRAPHY)


@attrs.frozen
class CertificatePaths:
    """Where one certificate and its private key were written."""

    certificate: Path
    """PEM file of the certificate."""
    private_key: Path
    """PEM file of the unencrypted private key (mode ``0o600``)."""


# -- validation ------------------------------------------------------------------------------


def _days(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _MAX_DAYS:
        raise ConfigurationError(f"days must be an integer from 1 to {_MAX_DAYS}, got {value!r}")
    return value


def _common_name(kind: str, value: object) -> str:
    if not isinstance(value, str) or not value or len(value) > _MAX_COMMON_NAME:
        raise ConfigurationError(
            f"{kind} must be a non-empty str of at most {_MAX_COMMON_NAME} characters "
            f"(the limit of a certificate's common name), got {value!r}"
        )
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ConfigurationError(f"{kind} {value!r} may not contain control characters")
    return value


def _file_stem(kind: str, value: object) -> str:
    """Validate a username or server name, which names both a certificate and its files."""
    name = _common_name(kind, value)
    bad = _FILE_STEM_FORBIDDEN.intersection(name)
    if bad:
        raise ConfigurationError(
            f"{kind} {name!r} may not contain {', '.join(sorted(repr(c) for c in bad))}"
            " (it names the certificate files)"
        )
    if name.startswith(".") or name != name.strip():
        raise ConfigurationError(
            f"{kind} {name!r} may not start with '.' or start or end with white space"
            " (it names the certificate files)"
        )
    return name


def _general_name(host: object) -> x509.GeneralName:
    """A subjectAltName entry for one host: an IP address or a DNS name."""
    if not isinstance(host, str) or not host:
        raise ConfigurationError(f"a host must be a non-empty str, got {host!r}")
    if "%" in host:
        raise ConfigurationError(f"host {host!r}: scoped IPv6 addresses cannot be certified")
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        pass
    problem = None
    if not host.isascii():
        problem = "write an internationalised name in its ASCII 'xn--' form"
    elif len(host) > 253:
        problem = "a host name has at most 253 characters"
    else:
        labels = host.split(".")
        if labels[0] == "*" and len(labels) > 2:
            labels = labels[1:]  # a wildcard certificate, e.g. *.dev.example
        if not all(_DNS_LABEL.match(label) for label in labels):
            problem = "it is neither an IP address nor a host name"
        elif labels[-1].isdigit():
            problem = "it is not a valid IP address"
    if problem is not None:
        raise ConfigurationError(f"host {host!r} cannot be certified: {problem}")
    return x509.DNSName(host)


def _alternative_names(hosts: Iterable[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in (hosts,) if isinstance(hosts, str) else hosts:
        name = _general_name(host)
        if name not in names:
            names.append(name)
    if not names:
        raise ConfigurationError("a server certificate needs at least one host")
    return names


# -- files -----------------------------------------------------------------------------------


def _check_free(paths: Iterable[Path], overwrite: bool) -> None:
    if overwrite:
        return
    for path in paths:
        if path.exists():
            raise ConfigurationError(
                f"{path} already exists; pass overwrite=True (--overwrite) to replace it"
            )


def _write(path: Path, data: bytes, *, mode: int, overwrite: bool) -> None:
    """Write a new file, created with ``mode`` (as far as the umask allows).

    An existing file is removed first when ``overwrite`` is true, so the new one never
    inherits a wider mode or follows a symbolic link left in its place.
    """
    try:
        if overwrite and (path.exists() or path.is_symlink()):
            path.unlink()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), mode)
        with os.fdopen(fd, "wb") as file:
            file.write(data)
    except FileExistsError:
        raise ConfigurationError(
            f"{path} already exists; pass overwrite=True (--overwrite) to replace it"
        ) from None
    except OSError as exc:
        raise ConfigurationError(f"cannot write {path}: {exc.strerror or exc}") from exc


def _directory(directory: str | os.PathLike[str]) -> Path:
    path = Path(directory)
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigurationError(f"cannot make directory {path}: {exc.strerror or exc}") from exc
    return path


def _save(
    paths: CertificatePaths,
    certificate: x509.Certificate,
    key: ec.EllipticCurvePrivateKey,
    overwrite: bool,
) -> None:
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    # The key first: a certificate on disk without its key would be useless.
    _write(paths.private_key, key_pem, mode=0o600, overwrite=overwrite)
    _write(
        paths.certificate,
        certificate.public_bytes(serialization.Encoding.PEM),
        mode=0o644,
        overwrite=overwrite,
    )


# -- certificates ----------------------------------------------------------------------------


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _signature_hash(key: _IssuerKey) -> hashes.SHA256 | None:
    # Ed25519 and Ed448 sign without a separate hash.
    if isinstance(key, ed25519.Ed25519PrivateKey | ed448.Ed448PrivateKey):
        return None
    return hashes.SHA256()


def _key_usage(*, digital_signature: bool = False, ca: bool = False) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=digital_signature,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


@attrs.frozen
class _Authority:
    certificate: x509.Certificate
    key: _IssuerKey
    directory: Path

    @property
    def paths(self) -> CertificatePaths:
        return CertificatePaths(self.directory / CA_CERTIFICATE, self.directory / CA_PRIVATE_KEY)


def _load_authority(ca_dir: Path) -> _Authority:
    cert_path, key_path = ca_dir / CA_CERTIFICATE, ca_dir / CA_PRIVATE_KEY
    for path in (cert_path, key_path):
        if not path.is_file():
            raise ConfigurationError(
                f"no CA in {ca_dir}: {path} is missing; make one first with "
                f"make_ca() or `meshbus certs ca --dir {ca_dir}`"
            )
    try:
        certificate = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"cannot read the CA certificate {cert_path}: {exc}") from exc
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except TypeError as exc:
        raise ConfigurationError(
            f"the CA key {key_path} is encrypted; only unencrypted keys are supported"
        ) from exc
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"cannot read the CA key {key_path}: {exc}") from exc
    if not isinstance(key, _IssuerKey):
        raise ConfigurationError(f"the CA key {key_path} cannot sign certificates")
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(serialization.Encoding.DER, spki) != (
        certificate.public_key().public_bytes(serialization.Encoding.DER, spki)
    ):
        raise ConfigurationError(f"the CA key {key_path} does not belong to {cert_path}")
    try:
        is_ca = certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        raise ConfigurationError(f"{cert_path} is not a CA certificate")
    if certificate.not_valid_after_utc <= datetime.now(UTC):
        raise ConfigurationError(
            f"the CA certificate {cert_path} expired on {certificate.not_valid_after_utc:%Y-%m-%d};"
            " make a new CA (overwrite=True) and new certificates with it"
        )
    return _Authority(certificate, key, ca_dir)


def _issue(
    authority: _Authority,
    paths: CertificatePaths,
    *,
    common_name: str,
    usage: x509.ObjectIdentifier,
    alternative_names: list[x509.GeneralName] | None,
    days: int,
    overwrite: bool,
) -> CertificatePaths:
    """Sign and save a leaf certificate for a new key."""
    taken = {p.resolve() for p in (authority.paths.certificate, authority.paths.private_key)}
    for path in (paths.certificate, paths.private_key):
        if path.resolve() in taken:
            raise ConfigurationError(
                f"{common_name!r} would write {path}, which is a file of the CA; pick another name"
            )
    _check_free((paths.certificate, paths.private_key), overwrite)
    key = _new_key()
    now = datetime.now(UTC)
    ca_certificate = authority.certificate
    try:
        ca_ski = ca_certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
        aki = x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski.value)
    except x509.ExtensionNotFound:
        aki = x509.AuthorityKeyIdentifier.from_issuer_public_key(authority.key.public_key())
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        # A certificate cannot be trusted longer than the CA that signed it.
        .not_valid_after(min(now + timedelta(days=days), ca_certificate.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(digital_signature=True), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(aki, critical=False)
    )
    if alternative_names is not None:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(alternative_names), critical=False
        )
    certificate = builder.sign(authority.key, _signature_hash(authority.key))
    _save(paths, certificate, key, overwrite)
    return paths


def make_ca(
    directory: str | os.PathLike[str],
    *,
    name: str = "meshbus development CA",
    days: int = 365,
    overwrite: bool = False,
) -> CertificatePaths:
    """Make a certificate authority for development: ``ca.pem`` and ``ca-key.pem``.

    The CA is self-signed and may sign leaf certificates only (path length 0).
    Make its server and client certificates with :func:`make_server_certificate`
    and :func:`make_client_certificate`; both sides of a link trust ``ca.pem``.

    :param directory: where to write; made (mode ``0o700``) when missing.
    :param name: the common name of the CA.
    :param days: how long the CA is valid.
    :param overwrite: replace existing files instead of refusing. Certificates
        signed by a replaced CA are no longer trusted by peers given the new one.
    :returns: the paths of ``ca.pem`` and ``ca-key.pem``.
    :raises ConfigurationError: cryptography is not installed (the ``certs``
        extra); a file exists (and not ``overwrite``), an option is
        invalid, or a file cannot be written.
    """
    _require_cryptography()
    common_name = _common_name("CA name", name)
    lifetime = _days(days)
    folder = Path(directory)
    paths = CertificatePaths(folder / CA_CERTIFICATE, folder / CA_PRIVATE_KEY)
    _check_free((paths.certificate, paths.private_key), overwrite)
    _directory(folder)
    key = _new_key()
    subject = _name(common_name)
    now = datetime.now(UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(now + timedelta(days=lifetime))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(digital_signature=True, ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    _save(paths, certificate, key, overwrite)
    return paths


def make_server_certificate(
    directory: str | os.PathLike[str],
    *,
    ca_dir: str | os.PathLike[str] | None = None,
    name: str = "server",
    hosts: Iterable[str] = DEFAULT_HOSTS,
    days: int = 365,
    overwrite: bool = False,
) -> CertificatePaths:
    """Make a server certificate signed by the CA in ``ca_dir``: ``{name}.pem`` and
    ``{name}-key.pem``.

    The certificate file holds the server's certificate only, not the CA's: clients
    are given ``ca.pem`` to trust, so the server need not send it. The certificate is
    for TLS servers only (extended key usage ``serverAuth``).

    :param directory: where to write; made (mode ``0o700``) when missing.
    :param ca_dir: where ``ca.pem`` and ``ca-key.pem`` are (default: ``directory``).
    :param name: the common name of the certificate and the stem of its file names.
    :param hosts: every name clients may use to reach the server: host names (a
        leading ``*.`` makes a wildcard) and IPv4 or IPv6 addresses. They become the
        certificate's subject alternative names, which is what clients check.
    :param days: how long the certificate is valid (never beyond the CA's expiry).
    :param overwrite: replace existing files instead of refusing.
    :returns: the paths of the certificate and its private key.
    :raises ConfigurationError: cryptography is not installed (the ``certs``
        extra); there is no usable CA in ``ca_dir`` (make one with
        :func:`make_ca` or ``meshbus certs ca``), a file exists (and not
        ``overwrite``), a name, host or option is invalid, or a file cannot be written.
    """
    _require_cryptography()
    stem = _file_stem("server name", name)
    alternative_names = _alternative_names(hosts)
    return _issue_named(
        directory, ca_dir, stem, ExtendedKeyUsageOID.SERVER_AUTH, alternative_names, days, overwrite
    )


def make_client_certificate(
    directory: str | os.PathLike[str],
    username: str,
    *,
    ca_dir: str | os.PathLike[str] | None = None,
    days: int = 365,
    overwrite: bool = False,
) -> CertificatePaths:
    """Make a client certificate for ``username``, signed by the CA in ``ca_dir``:
    ``{username}.pem`` and ``{username}-key.pem``.

    The username is the certificate's common name, which a server reads back with
    :func:`certificate_identity` to log the client in. The certificate is for TLS
    clients only (extended key usage ``clientAuth``).

    :param directory: where to write; made (mode ``0o700``) when missing.
    :param username: the client username; at most 64 characters, and usable as a file
        name (no ``/ \\ : * ? " < > | #``, control characters or leading ``.``).
    :param ca_dir: where ``ca.pem`` and ``ca-key.pem`` are (default: ``directory``).
    :param days: how long the certificate is valid (never beyond the CA's expiry).
    :param overwrite: replace existing files instead of refusing.
    :returns: the paths of the certificate and its private key.
    :raises ConfigurationError: cryptography is not installed (the ``certs``
        extra); there is no usable CA in ``ca_dir`` (make one with
        :func:`make_ca` or ``meshbus certs ca``), a file exists (and not
        ``overwrite``), the username or an option is invalid, or a file cannot be written.
    """
    _require_cryptography()
    stem = _file_stem("username", username)
    return _issue_named(
        directory, ca_dir, stem, ExtendedKeyUsageOID.CLIENT_AUTH, None, days, overwrite
    )


def _issue_named(
    directory: str | os.PathLike[str],
    ca_dir: str | os.PathLike[str] | None,
    stem: str,
    usage: x509.ObjectIdentifier,
    alternative_names: list[x509.GeneralName] | None,
    days: int,
    overwrite: bool,
) -> CertificatePaths:
    """Issue ``{stem}.pem``/``{stem}-key.pem`` in ``directory``, signed by the CA there
    (or in ``ca_dir``), with ``stem`` as the common name."""
    lifetime = _days(days)
    folder = Path(directory)
    authority = _load_authority(folder if ca_dir is None else Path(ca_dir))
    _directory(folder)
    return _issue(
        authority,
        CertificatePaths(folder / f"{stem}.pem", folder / f"{stem}-key.pem"),
        common_name=stem,
        usage=usage,
        alternative_names=alternative_names,
        days=lifetime,
        overwrite=overwrite,
    )


def certificate_identity(
    certificate: Mapping[str, object] | bytes | bytearray | memoryview | None,
) -> str | None:
    """The subject common name of a peer's certificate: how a server maps a verified
    client certificate to a username.

    Only use it on a connection whose peer certificate was verified (a context with
    ``verify_mode`` :data:`ssl.CERT_REQUIRED`, or :data:`ssl.CERT_OPTIONAL` and a
    non-empty dictionary): ``getpeercert(binary_form=True)`` returns the certificate
    even when nothing verified it.

    :param certificate: what :meth:`ssl.SSLSocket.getpeercert` returns (a dictionary
        with ``"subject"``, an empty dictionary, or ``None``), or the certificate as DER
        bytes (``getpeercert(binary_form=True)``) or PEM bytes.
    :returns: the common name; ``None`` when there is no certificate, the bytes are
        not a certificate, or the subject has no common name or more than one (an
        ambiguous identity is no identity).
    :raises ConfigurationError: ``certificate`` is bytes and cryptography, which parses
        them, is not installed (the ``certs`` extra).
    """
    if certificate is None:
        return None
    names: list[str] = []
    if isinstance(certificate, Mapping):
        subject = certificate.get("subject", ())
        if not isinstance(subject, tuple | list):
            return None
        for rdn in subject:
            for pair in rdn if isinstance(rdn, tuple | list) else ():
                if isinstance(pair, tuple | list) and len(pair) == 2 and pair[0] == "commonName":
                    names.append(str(pair[1]))
    else:
        _require_cryptography()
        data = bytes(certificate)
        try:
            if data.lstrip().startswith(b"-----BEGIN"):
                parsed = x509.load_pem_x509_certificate(data)
            else:
                parsed = x509.load_der_x509_certificate(data)
            attributes = parsed.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        except ValueError:
            return None
        for attribute in attributes:
            value = attribute.value
            names.append(value if isinstance(value, str) else value.decode("utf-8", "replace"))
    return names[0] if len(names) == 1 else None


# -- a whole directory at once (what ``meshbus certs`` does) -------------------------------

CERTS_ACTIONS = ("all", "ca", "server", "client")
"""What :func:`make_certificates` can make: everything, or one kind."""


def make_certificates(
    directory: str | os.PathLike[str],
    action: str = "all",
    *,
    name: str = "server",
    hosts: Iterable[str] | None = None,
    usernames: Iterable[str] = (),
    days: int = 365,
    overwrite: bool = False,
) -> list[CertificatePaths]:
    """Make what ``meshbus certs ACTION`` makes, checking every name, host and file first,
    so a refusal leaves nothing half made.

    :param action: ``"all"`` (a CA, a server certificate and the client certificates),
        ``"ca"``, ``"server"`` or ``"client"`` (those need the CA in ``directory``).
    :param name: the server certificate's file name stem.
    :param hosts: the names and addresses the server certificate carries
        (default: :data:`DEFAULT_HOSTS`).
    :param usernames: one client certificate for each.
    :raises ConfigurationError: cryptography is not installed (the ``certs``
        extra); an unknown action, a bad name or host, a file that
        exists (without ``overwrite``), or no CA to sign with.
    """
    _require_cryptography()
    if action not in CERTS_ACTIONS:
        raise ConfigurationError(f"action must be one of {CERTS_ACTIONS}, not {action!r}")
    folder = Path(directory)
    host_list = list(hosts) if hosts is not None else list(DEFAULT_HOSTS)
    names = list(usernames)
    _days(days)
    targets: list[Path] = []
    if action in ("all", "ca"):
        targets += [folder / CA_CERTIFICATE, folder / CA_PRIVATE_KEY]
    stems: list[str] = []
    if action in ("all", "server"):
        stems.append(_file_stem("server name", name))
        _alternative_names(host_list)
    if action in ("all", "client"):
        stems += [_file_stem("username", username) for username in names]
    targets += [folder / f"{stem}{suffix}" for stem in stems for suffix in (".pem", "-key.pem")]
    for index, target in enumerate(targets):
        if target in targets[:index]:
            raise ConfigurationError(f"two files would be written to {target}; rename one")
    _check_free(targets, overwrite)

    made: list[CertificatePaths] = []
    if action in ("all", "ca"):
        made.append(make_ca(folder, days=days, overwrite=overwrite))
    if action in ("all", "server"):
        made.append(
            make_server_certificate(
                folder, name=name, hosts=host_list, days=days, overwrite=overwrite
            )
        )
    if action in ("all", "client"):
        for username in names:
            made.append(make_client_certificate(folder, username, days=days, overwrite=overwrite))
    return made
