"""The GPU check's plumbing, on CPU: ``benchmarks/gpu/check.py --cpu-smoke`` runs its items tiny.

The two items that start subprocesses of their own (the recipe under accelerate, the decode
benchmark) take a minute between them and run in the manual smoke run the script's docstring
gives; the rest run here in a real subprocess, as on the GPU machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import hf_posext

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from result_schema import read_rows  # noqa: E402  (benchmarks/ is not a package)


def test_cpu_smoke_runs_every_in_process_item_and_writes_one_table(tmp_path):
    out = tmp_path / "check.json"
    items = ["alibi_flash", "alibi_flex_train", "bf16_parity", "mfu"]
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu" / "check.py"),
            "--cpu-smoke",
            "--only",
            *items,
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    rows = read_rows(out)
    statuses = {row.method: row for row in rows if row.metric == "status"}
    assert {name: row.value for name, row in statuses.items()} == {
        "alibi_flash": "skip",
        "alibi_flex_train": "ok",
        "bf16_parity": "ok",
        "mfu": "ok",
    }
    assert statuses["alibi_flash"].extra["reason"] == "flash-attn needs CUDA"
    assert {r.setting["rope"] for r in rows if r.method == "bf16_parity" and r.metric == "ok"} == set(
        hf_posext.available_methods()
    )
    assert all(r.setting["mode"] == "cpu-smoke" and r.versions["torch"] for r in rows)
    lines = done.stdout.splitlines()  # an optional package may log first (DeepSpeed names its CPU accelerator)
    table = lines[next(i for i, line in enumerate(lines) if line.startswith("item ")) :]
    assert table[0].split()[:3] == ["item", "status", "seconds"]
    assert [line.split()[0] for line in table[1 : 1 + len(items)]] == items
