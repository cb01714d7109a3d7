"""Time and peak memory of the training-free methods against the unpatched model's SDPA forward.

SmolLM2-135M's shape (9 heads of 64, 3 KV heads, hidden 576, MLP 1536, vocab 49152, L0 = 8192)
with random weights and ``--layers`` layers (the ratio is per layer: every layer does the same
work), one prefill forward per (variant, length) in its own subprocess, its peak RSS growth sampled
every 2 ms; ``logits_to_keep=1`` as in generation (a full [L, 49152] logits tensor would dwarf the
attention). Wall and CPU seconds (the process's, on one thread: what a loaded machine does not
inflate) and ratios to ``none`` at each length. Rows (``result_schema.py``) per variant and length
(``seconds``, ``cpu_seconds``, ``peak_rss_growth_mib``, ``time_ratio``, ``cpu_time_ratio``,
``memory_ratio``) go to ``--out`` (``benchmarks/results/training_free_bench.json``). ``--paths fused
score`` also times each method on the score path (``<method>:score`` rows), which the fused CPU
path replaced for unpadded inference.

    nice -n 10 python benchmarks/bench_training_free.py                  # 4k, 8k, 16k; 1 layer
    python benchmarks/bench_training_free.py --lengths 1024 2048 --layers 1   # a quick CPU run
    python benchmarks/bench_training_free.py --lengths 16384 --variants string rerope --out /tmp/tf.json
    nice -n 10 python benchmarks/bench_training_free.py --lengths 8192 16384 --variants self_extend dca \
        --paths fused score --repeats 2 --out benchmarks/results/training_free_paths.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
from harness import Results

OUT = Path(__file__).resolve().parent / "results" / "training_free_bench.json"
#: variant -> patch_model arguments (``leaky_rerope`` is ``rerope`` with a leak); ``none``: unpatched.
VARIANTS = {
    "none": None,
    "self_extend": {"factor": 4.0},
    "dca": {},
    "string": {},
    "rerope": {},
    "leaky_rerope": {"leak": 16.0},
}


def one(variant: str, length: int, layers: int, repeats: int, dtype: str = "float32") -> dict[str, float]:
    """Wall and CPU seconds (best of ``repeats``) and peak RSS growth (MiB) of one forward, in this process.

    ``variant`` is a key of :data:`VARIANTS`, with ``:score`` appended for the score path.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    import hf_posext
    from hf_posext.attention.remap import attention as remap

    variant, _, path = variant.partition(":")
    if path == "score":  # what unpadded CPU inference ran before the fused path, and padded inputs still do
        remap.flash_available = lambda *args: False

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        max_position_embeddings=8192,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(config).eval().to(getattr(torch, dtype))
    if VARIANTS[variant] is not None:
        hf_posext.patch_model(model, variant.removeprefix("leaky_"), **VARIANTS[variant])
    ids = torch.randint(0, 49152, (1, length))
    with torch.inference_mode():  # first-call costs (allocator, kernel dispatch) stay out of the timing
        model(ids[:, :256], logits_to_keep=1)
    best, best_cpu = float("inf"), float("inf")
    before = _rss()
    peak = [before]
    stop = threading.Event()

    def sample() -> None:  # torch ops release the GIL; glibc returns large freed blocks, so RSS is live memory
        while not stop.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    with torch.inference_mode():
        for _ in range(repeats):
            start, start_cpu = time.perf_counter(), time.process_time()
            model(ids, logits_to_keep=1)
            best = min(best, time.perf_counter() - start)
            best_cpu = min(best_cpu, time.process_time() - start_cpu)
    stop.set()
    sampler.join()
    return {
        "seconds": round(best, 3),
        "cpu_seconds": round(best_cpu, 3),
        "peak_rss_growth_mib": round((peak[0] - before) / 2**20, 1),
    }


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384])
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument(
        "--variants",
        nargs="+",
        default=list(VARIANTS),
        choices=list(VARIANTS),
        help="methods to time (none, the baseline, always runs)",
    )
    parser.add_argument(
        "--paths",
        nargs="+",
        default=["fused"],
        choices=["fused", "score"],
        help="the remapped attention's paths to time (score: <method>:score rows)",
    )
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--one", nargs=2, metavar=("VARIANT", "LENGTH"), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]), args.layers, args.repeats, args.dtype)))
        return 0
    rows: dict[str, dict[str, dict[str, float]]] = {}
    methods = [v for v in args.variants if v != "none"]
    variants = ["none", *(v if path == "fused" else f"{v}:score" for v in methods for path in args.paths)]
    for length in args.lengths:
        for variant in variants:
            command = [
                sys.executable,
                __file__,
                "--one",
                variant,
                str(length),
                "--layers",
                str(args.layers),
                "--repeats",
                str(args.repeats),
                "--dtype",
                args.dtype,
            ]
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            rows.setdefault(str(length), {})[variant] = json.loads(done.stdout.strip().splitlines()[-1])
            print(length, variant, rows[str(length)][variant], flush=True)
        base = rows[str(length)]["none"]
        for variant in variants:
            cell = rows[str(length)][variant]
            cell["time_ratio"] = round(cell["seconds"] / base["seconds"], 3)
            cell["cpu_time_ratio"] = round(cell["cpu_seconds"] / base["cpu_seconds"], 3)
            cell["memory_ratio"] = round(cell["peak_rss_growth_mib"] / base["peak_rss_growth_mib"], 3)
    setting = {
        "layers": args.layers,
        "repeats": args.repeats,
        **({"dtype": args.dtype} if args.dtype != "float32" else {}),
    }
    results = Results(args.out, "training_free_bench", setting=setting)
    for length, by_variant in rows.items():
        for variant, cell in by_variant.items():
            results.add_all(
                variant,
                cell,
                {"length": int(length), **(VARIANTS[variant.partition(":")[0]] or {})},
                units={"cpu_seconds": "s"},
            )
    print(json.dumps(rows, indent=1), f"\nwrote {results.save()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
