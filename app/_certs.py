"""The ``meshbus certs`` command: development certificates (see :mod:`meshbus.transports.certs`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from meshbus import ConfigurationError
from meshbus.transports.certs import DEFAULT_DIRECTORY, DEFAULT_HOSTS, make_certificates

__all__ = ["add_parser", "run"]


def add_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Add the ``certs`` command to the ``meshbus`` command's subparsers.

    The parsed arguments are for :func:`run`. Its actions::

        meshbus certs all [--dir D] [--client USERNAME ...]   CA, server and clients at once
        meshbus certs ca [--dir D]
        meshbus certs server [--dir D] [--name N] [--host H ...]
        meshbus certs client USERNAME ... [--dir D]

    Each also takes ``--days`` and ``--overwrite``; ``--dir`` defaults to
    ``./meshbus-certs``.

    :param subparsers: what :meth:`argparse.ArgumentParser.add_subparsers` returned.
    :returns: the parser of ``certs``.
    """
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--dir",
        type=Path,
        default=Path(DEFAULT_DIRECTORY),
        metavar="D",
        help=f"directory of the CA and the certificates (default: ./{DEFAULT_DIRECTORY})",
    )
    common.add_argument(
        "--days", type=int, default=365, help="how long certificates are valid (default: 365)"
    )
    common.add_argument(
        "--overwrite", action="store_true", help="replace existing files instead of refusing"
    )
    server = argparse.ArgumentParser(add_help=False)
    server.add_argument(
        "--name", default="server", metavar="N", help="server file name stem (default: server)"
    )
    server.add_argument(
        "--host",
        dest="hosts",
        action="extend",
        nargs="+",
        metavar="H",
        help="a host name or IP address clients use (repeatable; default: "
        + ", ".join(DEFAULT_HOSTS)
        + ")",
    )

    parser = subparsers.add_parser(
        "certs",
        help="make development TLS certificates",
        description="Make a development CA and certificates signed by it, for TLS "
        "listeners and client-certificate logins. Start with `meshbus certs all`.",
    )
    actions = parser.add_subparsers(dest="certs_action", required=True, metavar="ACTION")
    everything = actions.add_parser(
        "all",
        parents=[common, server],
        help="make a CA, a server certificate and client certificates (start here)",
    )
    everything.add_argument(
        "--client",
        dest="usernames",
        action="extend",
        nargs="+",
        default=[],
        metavar="USERNAME",
        help="also make a client certificate for this username (repeatable)",
    )
    actions.add_parser("ca", parents=[common], help="make a CA (ca.pem, ca-key.pem)")
    actions.add_parser(
        "server", parents=[common, server], help="make a server certificate signed by the CA"
    )
    client = actions.add_parser(
        "client", parents=[common], help="make client certificates signed by the CA"
    )
    client.add_argument("usernames", nargs="+", metavar="USERNAME", help="the client username")
    return parser


def run(args: argparse.Namespace) -> int:
    """Carry out a ``meshbus certs`` command parsed by a parser from :func:`add_parser`.

    Prints ``wrote PATH`` for each file written, or an error to standard error.

    :returns: the exit status: 0 on success, 2 when the certificates could not be made
        (a file exists, no CA, an invalid name or host).
    """
    try:
        made = make_certificates(
            args.dir,
            args.certs_action,
            name=getattr(args, "name", "server"),
            hosts=getattr(args, "hosts", None),
            usernames=getattr(args, "usernames", []),
            days=args.days,
            overwrite=args.overwrite,
        )
    except ConfigurationError as exc:
        print(f"meshbus certs: error: {exc}", file=sys.stderr)
        return 2
    for paths in made:
        print(f"wrote {paths.certificate}")
        print(f"wrote {paths.private_key}")
    return 0
