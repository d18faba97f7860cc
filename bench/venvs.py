"""One virtual environment per peer under ``.bench/venvs/<name>``, installed from the package index with pip.

A venv is rebuilt only when its pinned requirement list changes (a stamp file holds the list).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

STAMP = ".bench-requirements"


def ensure(directory: Path, requirements: Sequence[str], *, log: Path) -> Path:
    """Create or reuse the venv at ``directory`` with exactly ``requirements``; return its python.

    Raises subprocess.CalledProcessError (pip's output is in ``log``) when the install fails.
    """
    wanted = "\n".join(requirements) + "\n"
    python = directory / "bin" / "python"
    stamp = directory / STAMP
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    if directory.exists():
        shutil.rmtree(directory)
    subprocess.run([sys.executable, "-m", "venv", str(directory)], check=True)
    with open(log, "ab") as out:
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *requirements],
            check=True,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    stamp.write_text(wanted)
    return python
