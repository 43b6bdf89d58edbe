"""``python -m aotc``: the same CLI as the ``aotc`` script."""

import sys

from aotc.cli import main

sys.exit(main())
