"""The laptop-sized reproduction of the ALiBi and YaRN papers, in shape (see hf_posext/experiments/reproduce.py).

    python -m hf_posext.commands.reproduce                     # full: ~20-30 min on 2 CPU cores
    python -m hf_posext.commands.reproduce --only scratch extension # some experiments
    python -m hf_posext.commands.reproduce --quick --out /tmp/repro         # seconds, for CI
    CUDA_VISIBLE_DEVICES=0 python -m hf_posext.commands.reproduce           # same script; sizes are CPU-sized anyway

Writes ``benchmarks/results/{scratch,extension,passkey}.json``, ``reproduction.md`` (tables, protocol,
hardware, versions, wall time, this command) and repro_*.png plots. Trained models are cached under
``~/.cache/hf_posext`` (or ``--cache-dir``); a rerun reuses finished experiments.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from hf_posext.experiments.reproduce import EXPERIMENTS, FULL, QUICK, run_extension, run_passkey, run_scratch, write_report

RUNNERS = {"scratch": run_scratch, "extension": run_extension, "passkey": run_passkey}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/results", help="output folder (default: benchmarks/results)")
    parser.add_argument("--cache-dir", default=None, help="trained-model cache (default: ~/.cache/hf_posext)")
    parser.add_argument("--only", nargs="+", choices=EXPERIMENTS, default=list(EXPERIMENTS), help="experiments to run")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: the pipeline in seconds")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--report-only", action="store_true",
                        help="only rebuild reproduction.md and the plots from the JSON files (e.g. after running "
                             "experiments as parallel --only processes); wall time = the experiments' own")
    args = parser.parse_args()
    config = QUICK if args.quick else FULL
    out = Path(args.out)
    if args.report_only:
        seconds = sum(json.loads(p.read_text()).get("seconds", 0.0) for p in out.glob("*.json")
                      if p.stem in EXPERIMENTS)
        command = "python -m hf_posext.commands.reproduce --only EXPERIMENT` (one process each) and `--report-only"
        print(write_report(config, out, command, seconds))
        return 0
    start = time.perf_counter()
    for name in args.only:
        print(f"== {name}", flush=True)
        RUNNERS[name](config, out, Path(args.cache_dir) if args.cache_dir else None, progress=not args.no_progress)
    command = "python -m hf_posext.commands.reproduce " + shlex.join(sys.argv[1:])
    print(write_report(config, out, command.strip(), time.perf_counter() - start))
    return 0


if __name__ == "__main__":
    sys.exit(main())
