"""Start-up cost of the package: ``import hf_posext`` and ``hf-posext --help`` over ``import torch``.

Each round runs the commands in fresh interpreters, interleaved (torch, package, CLI, the part of
transformers that registering needs, then the next round rotated), and the ratio of medians is
reported, so machine noise hits every side alike. Wall time and CPU time (user + system of the
child) are both recorded; on a machine shared with other jobs the CPU-time ratio is the steadier
one. Target (issue 33): ratio <= 1.5. Rows (``result_schema.py``) of ``wall_s`` and ``cpu_s`` per
command and ``wall_ratio`` / ``cpu_ratio`` over ``import torch`` go to
``benchmarks/results/import_time.json``; a rerun replaces them.

    python benchmarks/bench_import.py                 # ~2 min on 2 CPU cores
    python benchmarks/bench_import.py --runs 21
    python -X importtime -c "import hf_posext" 2> importtime.txt   # where the time goes
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from harness import Results, child_env

RESULTS = Path(__file__).parent / "results"
BASELINE = "import torch"
COMMANDS = {
    BASELINE: [sys.executable, "-c", "import torch"],
    "import hf_posext": [sys.executable, "-c", "import hf_posext"],
    "hf-posext --help": [sys.executable, "-m", "hf_posext", "--help"],
    # What registering rope types with transformers costs whatever the package does: transformers' top level.
    "import transformers.modeling_rope_utils": [sys.executable, "-c", "import torch, transformers.modeling_rope_utils"],
}


def timed(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """``(wall seconds, child CPU seconds)`` of one run of ``command``; raises if it fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(runs: int) -> dict[str, dict[str, list[float]]]:
    """``{command: {"wall_s": [...], "cpu_s": [...]}}`` over ``runs`` interleaved, rotated rounds."""
    env = child_env()
    names = list(COMMANDS)
    times: dict[str, dict[str, list[float]]] = {name: {"wall_s": [], "cpu_s": []} for name in names}
    for command in names:  # warm the file cache once, unrecorded
        timed(COMMANDS[command], env)
    for round_ in range(runs):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            wall, cpu = timed(COMMANDS[name], env)
            times[name]["wall_s"].append(wall)
            times[name]["cpu_s"].append(cpu)
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=11, help="rounds of the commands (default 11)")
    parser.add_argument("--out", type=Path, default=RESULTS / "import_time.json")
    args = parser.parse_args(argv)
    times = measure(args.runs)
    load_average = [round(x, 2) for x in os.getloadavg()]
    results = Results(args.out, "import_time", setting={"runs": args.runs})
    medians = {
        name: {kind: statistics.median(values) for kind, values in sides.items()} for name, sides in times.items()
    }
    for name, sides in times.items():
        for kind, values in sides.items():
            results.add(
                name,
                kind,
                round(medians[name][kind], 4),
                repeats=[round(v, 4) for v in values],
                load_average=load_average,
            )
        if name == BASELINE:
            continue
        for kind in sides:
            ratio = medians[name][kind] / medians[BASELINE][kind]
            results.add(name, kind.replace("_s", "_ratio"), round(ratio, 3), baseline=BASELINE)
            print(
                f"{name:<40} {kind}: {medians[name][kind]:.3f} s vs {BASELINE} "
                f"{medians[BASELINE][kind]:.3f} s = {ratio:.2f}x"
            )
    results.save()
    print(f"wrote {args.out} (target: ratio <= 1.5; load average {load_average})")


if __name__ == "__main__":
    main()
