"""What the GPU benchmark scripts (``benchmarks/gpu/*.py``) share: paths, the device, the result file.

Every script writes rows of the one schema (``benchmarks/result_schema.py``) to ``OUT/<script>.json``
through :class:`Report`, runs tiny on CPU with ``--cpu-smoke`` and refuses to run without CUDA
otherwise. ``PLAN.md`` beside this file gives the device calls in order.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


ROOT = Path(__file__).resolve().parents[2]
for _path in (ROOT, ROOT / "benchmarks"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from harness import Results, child_env, unchanged  # noqa: E402, F401  (the path above)
from result_schema import Row  # noqa: E402

#: Dense bf16 tensor-core peaks (TFLOP/s, no sparsity) from the vendors' data sheets.
PEAK_BF16_TFLOPS = {
    "H200": 989.0,
    "H100 SXM": 989.0,
    "H100 PCIe": 756.0,
    "H100": 989.0,
    "A100": 312.0,
    "L40S": 362.0,
    "L4": 121.0,
    "A10G": 70.0,
    "RTX 4090": 165.0,
}


def add_common_arguments(parser: argparse.ArgumentParser, default_out: str) -> None:
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on CPU in seconds: the plumbing only")
    parser.add_argument("--out", default=default_out, help=f"result folder (default {default_out})")


def pick_device(args: argparse.Namespace) -> str:
    """``cpu`` for ``--cpu-smoke``, else ``cuda``; without CUDA the run stops, saying how to smoke-test."""
    import torch

    if args.cpu_smoke:
        return "cpu"
    if not torch.cuda.is_available():
        raise SystemExit(f"{Path(sys.argv[0]).name}: no CUDA device; pass --cpu-smoke to check the plumbing on CPU")
    return "cuda"


def peak_tflops(device: str, given: float | None = None) -> float | None:
    """The device's dense bf16 peak: ``given``, else from :data:`PEAK_BF16_TFLOPS`, else None (no MFU)."""
    if given or device != "cuda":
        return given
    import torch

    name = torch.cuda.get_device_name()
    return next((value for key, value in PEAK_BF16_TFLOPS.items() if key in name), None)


class Report:
    """A script's results, saved after every part so that a run stopped by a time limit keeps what finished.

    The script keeps its measurements in :attr:`payload` (``report[key] = value`` saves) and gives
    ``rows``, which writes the payload's rows into a :class:`~harness.Results`. Each save rewrites
    ``OUT/<script>.json`` with them and the wall time of each part (method ``run``, metric ``wall_s``,
    setting ``part``); every row's setting holds ``mode`` (``gpu`` or ``cpu-smoke``) and ``settings``.
    A row measured by an earlier save keeps its time.
    """

    def __init__(
        self,
        script: str,
        args: argparse.Namespace,
        device: str,
        settings: dict[str, Any],
        rows: Callable[[Results, dict[str, Any]], None],
        benchmarks: Sequence[str] = (),
    ) -> None:
        self.path = Path(args.out) / f"{script}.json"
        self.mode = "cpu-smoke" if args.cpu_smoke else "gpu"
        self.started = time.perf_counter()
        self.payload: dict[str, Any] = {"wall_s": {}}
        self.rows = rows
        self.results = Results(
            self.path, [f"gpu_{script}", *benchmarks], device=device, setting={"mode": self.mode, **settings}
        )

    def __setitem__(self, key: str, value: Any) -> None:
        self.payload[key] = value
        self.save()

    def __getitem__(self, key: str) -> Any:
        return self.payload[key]

    def timed(self, part: str, seconds: float) -> None:
        self.payload["wall_s"][part] = round(seconds, 2)
        self.save()

    def save(self) -> Path:
        self.payload["wall_s"]["total"] = round(time.perf_counter() - self.started, 2)
        before: dict[tuple, Row] = {row.identity: row for row in self.results.rows}
        self.results.rows = []
        self.rows(self.results, self.payload)
        for part, seconds in self.payload["wall_s"].items():
            self.results.add("run", "wall_s", seconds, setting={"part": part})
        self.results.rows = [
            before[r.identity] if r.identity in before and unchanged(before[r.identity], r) else r
            for r in self.results.rows
        ]
        return self.results.save()


def console_command() -> list[str]:
    """``python -c ...`` running the ``hf-posext`` console script from pyproject.toml, installed or not."""
    # A regex, not tomllib: the project supports Python 3.10, which has no tomllib.
    entry = re.search(r'^hf-posext\s*=\s*"([\w.]+):(\w+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    if entry is None:
        raise RuntimeError("pyproject.toml declares no hf-posext console script")
    module, function = entry.groups()
    return [
        sys.executable,
        "-c",
        f"import sys; sys.argv[0] = 'hf-posext'; from {module} import {function}; sys.exit({function}())",
    ]
