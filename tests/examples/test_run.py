"""The shipped examples run unchanged (tiny models, seconds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_quickstart_runs_and_reloads_identically():
    result = subprocess.run([sys.executable, str(EXAMPLES / "quickstart.py")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "same logits: True" in result.stdout


def test_reproduce_quick_writes_every_result(tmp_path):
    # The laptop reproduction's whole pipeline at toy sizes (~15 s): train, extend, fine-tune, evaluate, report.
    command = [
        sys.executable,
        "-m",
        "hf_posext.commands.reproduce",
        "--quick",
        "--out",
        str(tmp_path),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--no-progress",
    ]
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    expected = {
        "scratch": {"rope", "alibi", "sinusoidal", "learned"},
        "extension": {"none", "linear", "ntk", "dynamic_ntk", "yarn", "dynamic_yarn", "yarn + fine-tune"},
        "passkey": {"rope (none)", "rope + yarn", "alibi"},
    }
    for name, models in expected.items():
        results = json.loads((tmp_path / f"{name}.json").read_text())["results"]
        assert models <= set(results), (name, set(results))
        if name != "passkey":  # perplexity per byte at 1x, 2x, 4x the training length, below 256 (uniform bytes)
            curves = [results[model][protocol] for model in models for protocol in ("last", "all")]
            assert all([row["length"] for row in curve] == [32, 64, 128] for curve in curves)
            assert all(1 < row["perplexity"] < 256 for curve in curves for row in curve)
        assert (tmp_path / f"repro_{name}.png").stat().st_size > 0
    report = (tmp_path / "reproduction.md").read_text()
    assert "hf-posext reproduce --quick" in report and "| dynamic_yarn" in report


def test_quickstart_takes_methods_without_a_factor():
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py"), "--method", "alibi"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert "'method': 'alibi'" in result.stdout and "same logits: True" in result.stdout
