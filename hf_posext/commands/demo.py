"""``hf-posext demo``: train a tiny model once, extend it with every method, print perplexity by length.

    hf-posext demo            # 3-5 CPU-minutes the first time (one thread per free core), seconds once cached
    hf-posext demo --quick    # the same pipeline shrunk to seconds (CI)

The experiment itself is `hf_posext.experiments.demo`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from .arguments import default_out, plain


def footer(report: dict[str, Any], out: str) -> str:
    """The demo's last line: wall time, and what training cost or that it came from the cache."""
    train_seconds = sum(t["train_seconds"] for t in report["train"].values())
    if all(report.get("cached", {}).values()):
        training = f"the models came from the cache; training them took {train_seconds:.1f} s"
    else:
        training = f"training {train_seconds:.1f} s, cached for the next run"
    return f"wall time {report['seconds']:.1f} s ({training}); files in {out}"


def _main(args: argparse.Namespace) -> int:
    from ..experiments.demo import FULL, QUICK, run_demo
    from ..files import check_output_dir

    config = QUICK if args.quick else FULL
    out = check_output_dir(args.out, overwrite=args.overwrite, owns=("demo.*",), reuse_own=True)
    previous = json.loads((out / "demo.json").read_text()) if (out / "demo.json").is_file() else {}
    if (
        not args.overwrite
        and isinstance(previous, dict)
        and previous.get("config") not in (None, json.loads(json.dumps(dataclasses.asdict(config))))
    ):
        raise ValueError(
            f"{str(out / 'demo.json')!r} holds the results of the other demo configuration "
            f"({'the full run' if args.quick else '--quick'}); pass --overwrite to replace them, "
            "or choose another --out (nothing was written)"
        )
    report = run_demo(config, args.cache_dir, args.out, progress=not args.no_progress)
    train = report["train"]["rope"]
    print(
        f"\nTiny Llama ({train['parameters'] / 1e6:.2f}M parameters) trained for {train['config']['steps']} steps at "
        f"{config.model.seq_len} tokens on the stdlib (final loss {train['final_loss']:.3f}); "
        f"{report['protocol']['metric']} ({report['protocol']['documents']} held-out files).\n"
        f"Static methods use s = L / {config.model.seq_len}; "
        f"dynamic ones s = {report['protocol']['dynamic_factor']:g}.\n"
    )
    print(report["table"])
    print("\n" + footer(report, args.out))
    return 0


def add_parser(subparsers: Any) -> None:
    """Register ``hf-posext demo``."""
    out = default_out("demo")
    p = subparsers.add_parser(
        "demo",
        help="train a tiny model once, extend it with every method, print perplexities",
        description=plain(__doc__.split("\n\n")[0]),
    )
    p.add_argument("--quick", action="store_true", help="shrink everything to seconds (CI)")
    p.add_argument("--out", default=out, help=f"output folder (default: ./{out})")
    p.add_argument(
        "--overwrite", action="store_true", help="write into an output folder holding other files (they are kept)"
    )
    p.add_argument(
        "--cache-dir", default=None, help="trained-model cache (default: $HF_POSEXT_CACHE or ~/.cache/hf_posext)"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_main)
