"""The ``meshbus`` command."""

from __future__ import annotations

import argparse
import sys

from . import __version__
from ._plugins import available_plugins


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="meshbus", description="An embeddable message bus.")
    parser.add_argument("--version", action="version", version=f"meshbus {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="run the main demo on embedded defaults")
    commands.add_parser("plugins", help="list the installed plugins")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from ._demo import main as demo

        demo()
    elif args.command == "plugins":
        for name, ep in sorted(available_plugins().items()):
            print(f"{name:12} {ep.value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
