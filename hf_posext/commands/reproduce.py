"""``hf-posext reproduce``: the laptop-sized reproduction of the ALiBi and YaRN papers, in shape.

    hf-posext reproduce                            # full: ~20-40 min on 2 CPU cores
    hf-posext reproduce --only scratch extension   # some experiments
    hf-posext reproduce --quick --out /tmp/repro   # seconds, for CI

Writes ``<experiment>.json``, ``reproduction.md`` and ``repro_*.png`` under ``--out``; trained
models are cached, and a rerun reuses finished experiments (`hf_posext.experiments.reproduction`).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .arguments import OneLineParser, default_out, plain, run_command

PROG = "hf-posext reproduce"


def _reproduce(args: argparse.Namespace) -> int:
    from ..experiments import reproduction

    runners = {
        "scratch": reproduction.run_scratch,
        "extension": reproduction.run_extension,
        "passkey": reproduction.run_passkey,
    }
    only = args.only or list(reproduction.EXPERIMENTS)
    unknown = [name for name in only if name not in reproduction.EXPERIMENTS]
    if unknown:
        raise ValueError(
            f"--only: unknown experiment(s) {unknown}; the experiments are: {', '.join(reproduction.EXPERIMENTS)}"
        )
    config = reproduction.QUICK if args.quick else reproduction.FULL
    out = Path(args.out)
    if args.report_only:
        seconds = sum(
            json.loads(p.read_text()).get("seconds", 0.0)
            for p in out.glob("*.json")
            if p.stem in reproduction.EXPERIMENTS
        )
        command = f"{PROG} --only EXPERIMENT` (one process each) and `--report-only"
        print(reproduction.write_report(config, out, command, seconds))
        return 0
    start = time.perf_counter()
    for name in only:
        print(f"== {name}", flush=True)
        runners[name](config, out, Path(args.cache_dir) if args.cache_dir else None, progress=not args.no_progress)
    command = f"{PROG} {shlex.join(args.command_argv)}".strip()  # the report quotes the command that made it
    print(reproduction.write_report(config, out, command, time.perf_counter() - start))
    return 0


def _add_arguments(p: argparse.ArgumentParser) -> None:
    out = default_out("reproduce")
    p.add_argument("--out", default=out, help=f"output folder (default: ./{out})")
    p.add_argument(
        "--cache-dir", default=None, help="trained-model cache (default: $HF_POSEXT_CACHE or ~/.cache/hf_posext)"
    )
    p.add_argument(
        "--only",
        nargs="+",
        default=None,
        metavar="EXPERIMENT",
        help="experiments to run: scratch, extension or passkey (default: all three)",
    )
    p.add_argument("--quick", action="store_true", help="tiny sizes: the pipeline in seconds")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument(
        "--report-only",
        action="store_true",
        help="only rebuild reproduction.md and the plots from the JSON files (e.g. after running "
        "experiments as parallel --only processes); wall time = the experiments' own",
    )


def add_parser(subparsers: Any) -> None:
    """Register ``hf-posext reproduce``."""
    p = subparsers.add_parser(
        "reproduce",
        help="the laptop-sized reproduction of the ALiBi and YaRN papers",
        description=plain(__doc__.split("\n\n")[0]),
    )
    _add_arguments(p)
    p.set_defaults(func=_reproduce)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hf_posext.commands.reproduce ARGS``, the same as ``hf-posext reproduce ARGS``."""
    parser = OneLineParser(prog=PROG, description=plain(__doc__.split("\n\n")[0]))
    _add_arguments(parser)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.command_argv = argv
    return run_command(PROG, lambda: _reproduce(args))


if __name__ == "__main__":
    sys.exit(main())
