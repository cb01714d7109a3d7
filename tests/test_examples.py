"""The shipped examples run unchanged (tiny models, seconds)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).parent.parent / "examples"


def test_quickstart_runs_and_reloads_identically():
    result = subprocess.run([sys.executable, str(EXAMPLES / "quickstart.py")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "same logits: True" in result.stdout
