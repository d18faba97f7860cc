"""``python -m devstack run|up|env|down|metrics-ports``: the embedded servers of ``make run`` and ``make test``."""

import sys

from devstack import main

sys.exit(main())
