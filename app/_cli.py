"""The ``meshbus`` command: the demo, a standalone node, and clients of a running node."""

from __future__ import annotations

import argparse
import sys

from meshbus import __version__, available_plugins


def main(argv: list[str] | None = None) -> int:
    # Imported here: ``meshbus --version`` should not pay for the transports.
    from . import _certs as certs
    from . import _clients as clients
    from . import _manage as manage
    from . import _run

    parser = argparse.ArgumentParser(prog="meshbus", description="An embeddable message bus.")
    parser.add_argument("--version", action="version", version=f"meshbus {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="run the main demo on embedded defaults")
    commands.add_parser("plugins", help="list the installed plugins")
    _run.add_parser(commands)
    clients.add_parsers(commands)
    manage.add_parsers(commands)
    certs.add_parser(commands)
    args = parser.parse_args(argv)
    if args.command == "demo":
        from ._demo import main as demo

        demo()
    elif args.command == "plugins":
        for name, ep in sorted(available_plugins().items()):
            print(f"{name:12} {ep.value}")
    elif args.command == "run":
        return int(_run.run(args))
    elif args.command == "certs":
        return int(certs.run(args))
    elif args.command in ("show", "queue"):
        return int(manage.run(args))
    else:
        return int(clients.run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
