"""``python -m chaos``: see ``chaos.runner``."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chaos.runner import main  # noqa: E402 - after the path fix

sys.exit(main())
