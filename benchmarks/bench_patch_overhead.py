"""Forward time of a patched model over the same model built natively by transformers.

For each method, two models with identical weights and identical ``rope_parameters``
(dynamic methods twice: with exact KV-cache semantics, the default, and with
``exact_cache=False``, transformers' own semantics):

* ``patched``: an unpatched model passed through ``hf_posext.patch_model``;
* ``native``: ``AutoModelForCausalLM.from_config`` on the patched config with the
  ``hf_posext`` record removed, i.e. what transformers alone builds from that config.

Timings are interleaved (native, patched, native, ...) and the ratio of medians is reported,
so machine noise hits both sides alike. Target: ratio <= 1.02 (patching costs nothing at run time).
Rows (``result_schema.py``) of ``native_ms``, ``patched_ms`` and ``ratio`` per method and length go
to ``benchmarks/results/patch_overhead.json``; a rerun replaces them.

    python benchmarks/bench_patch_overhead.py                 # ~1 min on 2 CPU cores
    python benchmarks/bench_patch_overhead.py --lengths 512 2048 --repeats 9
    nice -n 5 python benchmarks/bench_patch_overhead.py --cpu-time   # on a machine shared with other jobs
"""

from __future__ import annotations

import argparse
import copy
import statistics
from pathlib import Path

import torch
from harness import Clock, Results
from transformers import AutoModelForCausalLM, LlamaConfig

import hf_posext

RESULTS = Path(__file__).parent / "results"


def build_pair(method: str, factor: float, original: int, options: dict):
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=original,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    patched = AutoModelForCausalLM.from_config(config).eval()
    hf_posext.patch_model(patched, method, factor=factor, **options)
    native_config = copy.deepcopy(patched.config)
    del native_config.hf_posext
    native_config._attn_implementation = "sdpa"  # the exact-cache wrapper is hf-posext's, not native
    native = AutoModelForCausalLM.from_config(native_config).eval()
    native.load_state_dict(patched.state_dict())
    return native, patched


@torch.no_grad()
def seconds(model, ids, clock: Clock) -> float:
    """One forward, timed by ``clock``: wall time, or with ``--cpu-time`` the process's CPU time at
    one torch thread, which other jobs on a shared machine do not inflate."""
    return clock.time(lambda: model(ids))[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", default=["linear", "ntk", "dynamic_ntk", "yarn", "dynamic_yarn"])
    parser.add_argument("--factor", type=float, default=8)
    parser.add_argument("--original", type=int, default=256)
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 2048])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="one torch thread, timed by the process's CPU time (for a machine shared with other jobs)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "patch_overhead.json")
    args = parser.parse_args()
    clock = Clock("cpu", cpu_time=args.cpu_time)
    if args.cpu_time:
        torch.set_num_threads(1)

    results = Results(
        args.out,
        "patch_overhead",
        setting={
            "factor": args.factor,
            "original": args.original,
            "clock": clock.name,
            "threads": torch.get_num_threads(),
            "repeats": args.repeats,
        },
    )
    variants = [(m, {}) for m in args.methods]
    variants += [(m, {"exact_cache": False}) for m in args.methods if hf_posext.methods.method_class(m).dynamic]
    for method, options in variants:
        native, patched = build_pair(method, args.factor, args.original, options)
        label = method + ("" if not options else " (exact_cache=False)")
        for length in args.lengths:
            ids = torch.randint(0, 512, (1, length), generator=torch.Generator().manual_seed(length))
            seconds(native, ids, clock), seconds(patched, ids, clock)  # warm-up
            native_times, patched_times = [], []
            for _ in range(args.repeats):
                native_times.append(seconds(native, ids, clock))
                patched_times.append(seconds(patched, ids, clock))
            native_ms, patched_ms = 1000 * statistics.median(native_times), 1000 * statistics.median(patched_times)
            results.add_all(
                method,
                {"native_ms": native_ms, "patched_ms": patched_ms, "ratio": patched_ms / native_ms},
                {"length": length, **options},
            )
            print(
                f"{label:<33} L={length:<5} native {native_ms:8.1f} ms  patched {patched_ms:8.1f} ms  "
                f"ratio {patched_ms / native_ms:.3f}"
            )
    results.save()
    print(f"written to {args.out} (target: ratio <= 1.02); `python scripts/tables.py` renders the docs' table")


if __name__ == "__main__":
    main()
