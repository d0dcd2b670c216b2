import sys

from pyxds.cli.main import main

sys.exit(main())
