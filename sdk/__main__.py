"""``python -m meshbus``: the ``meshbus`` command (the application layer, :mod:`meshbus.app`)."""

import sys

from meshbus.app._cli import main

sys.exit(main())
