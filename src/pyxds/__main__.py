"""``python -m pyxds``: the ``pyxds`` command (docs/cli.md), same as ``python -m pyxds.cli``."""

import sys

from pyxds.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
