"""``python -m aotc``: the same command line as ``aotc``."""

import sys

from aotc.cli import main

sys.exit(main())
