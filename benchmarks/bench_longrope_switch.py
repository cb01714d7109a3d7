"""The cost of LongRoPE's default cache at the switch: the crossing step, and the steady state after it.

By default (``factors_by="sequence"``, transformers' definition) the decoding step that takes a
sequence past L_orig computes the cache's prefix again with the long factors (every layer, once;
hf_posext/methods/longrope/switch.py); every later step is a plain cached decode. Three caches run on
twins of one random-weight Llama sharing its weight tensors, against transformers' native path
measured in the same run:

* ``transformers``: ``exact_cache=False``, transformers' own ``longrope`` (no recompute: its keys and
  values from before the switch keep the short factors; the reference of the ratios);
* ``recompute``: the default;
* ``per_query``: ``factors_by="query"``, the definition that was the default before (one turn of the
  cached keys at the switch, through the exact dynamic cache's attention wrapper).

Each round prefills ``L_orig - 1`` tokens and decodes one step to ``L_orig`` (untimed), then times the
crossing step (to ``L_orig + 1`` tokens) and ``--steps`` steps after it; the rows take their steps in
turn, in an order that rotates with the step, so that load on a shared machine hits them alike. A
round's steady step is the median of its steps; each metric is the median over ``--repeats`` rounds.
``prefill_s`` is transformers' prefill of ``L_orig`` tokens: the work a recompute repeats. On CPU the
clock is the process's CPU time with one torch thread; on a GPU, wall time.

Run (CPU, a few minutes of one core; the rows in benchmarks/results/longrope_switch.json)::

    .venv/bin/python benchmarks/bench_longrope_switch.py --out benchmarks/results/longrope_switch.json
    .venv/bin/python benchmarks/bench_longrope_switch.py --hidden 576 --heads 9 --kv-heads 3 --layers 30 \\
        --vocab 49152 --original-length 1024 --repeats 3 --out benchmarks/results/longrope_switch.json

Laptop-sized smoke run::

    .venv/bin/python benchmarks/bench_longrope_switch.py --hidden 64 --layers 1 --original-length 32 --steps 4

GPU (bf16, one H100)::

    python benchmarks/bench_longrope_switch.py --device cuda --dtype bfloat16 --hidden 4096 --heads 32 \\
        --kv-heads 8 --layers 8 --original-length 4096 --out longrope_switch_gpu.json
"""

from __future__ import annotations

import argparse
import copy
import statistics
from pathlib import Path

import torch
from harness import Clock, Results
from transformers import LlamaConfig, LlamaForCausalLM

import hf_posext

#: (cache, patch_model keyword arguments)
CACHES = (
    ("transformers", {"exact_cache": False}),
    ("recompute", {}),
    ("per_query", {"factors_by": "query"}),
)


#: The settings a row is of: a run replaces the rows of its shape and keeps the others.
SHAPE = ("hidden", "heads", "kv_heads", "layers", "vocab", "original_length", "factor", "attention", "dtype")


def build(args: argparse.Namespace) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=3 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.original_length,
        attn_implementation=args.attention,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval().to(device=args.device, dtype=getattr(torch, args.dtype))


def measure(args: argparse.Namespace) -> dict[str, dict[str, float | list[float]]]:
    """Per cache: each round's crossing step and median steady step (seconds), and their medians."""
    model = build(args)
    shared = {id(p): p for p in model.parameters()}
    twins = {}
    for name, kwargs in CACHES:
        twins[name] = copy.deepcopy(model, memo=dict(shared))
        hf_posext.patch_model(twins[name], "longrope", factor=args.factor, **kwargs)
    original, tick, names = args.original_length, Clock(args.device, cpu_time=None), list(twins)
    ids = torch.randint(0, args.vocab, (1, original + 1 + args.steps), generator=torch.Generator().manual_seed(1))
    ids = ids.to(args.device)
    crossing: dict[str, list[float]] = {name: [] for name in names}
    steady: dict[str, list[float]] = {name: [] for name in names}
    prefill: list[float] = []
    with torch.inference_mode():
        for _ in range(args.repeats):
            caches = {}
            for name in names:
                caches[name] = twins[name](ids[:, : original - 1], use_cache=True).cache
                twins[name](ids[:, original - 1 : original], cache=caches[name], use_cache=True)
            steps: dict[str, list[float]] = {name: [] for name in names}
            for step in range(1 + args.steps):  # step 0 crosses: L_orig + 1 tokens
                t = original + step
                for name in names[step % len(names) :] + names[: step % len(names)]:
                    spent, _ = tick.time(lambda m=twins[name], c=caches[name], t=t: m(ids[:, t : t + 1], cache=c))
                    steps[name].append(spent)
            for name in names:
                crossing[name].append(steps[name][0])
                steady[name].append(statistics.median(steps[name][1:]))
            spent, _ = tick.time(lambda: twins["transformers"](ids[:, :original], use_cache=True))
            prefill.append(spent)
    base_cross, base_steady = statistics.median(crossing["transformers"]), statistics.median(steady["transformers"])
    result: dict[str, dict[str, float | list[float]]] = {}
    for name in names:
        cross, still = statistics.median(crossing[name]), statistics.median(steady[name])
        result[name] = {
            "crossing_step_s": cross,
            "steady_step_s": still,
            "crossing_ratio_vs_transformers": cross / base_cross,
            "steady_ratio_vs_transformers": still / base_steady,
            "round_crossing_s": crossing[name],
            "round_steady_s": steady[name],
        }
    result["transformers"]["prefill_s"] = statistics.median(prefill)
    result["transformers"]["round_prefill_s"] = prefill
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--original-length", type=int, default=512, help="L_orig")
    parser.add_argument("--factor", type=float, default=4.0)
    parser.add_argument("--steps", type=int, default=16, help="steps timed after the crossing one")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--attention", default="sdpa", choices=("sdpa", "eager"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: stable CPU-time numbers)")
    parser.add_argument("--out", type=Path, default=None, help="merge the result rows into this JSON file")
    args = parser.parse_args()
    for name in ("hidden", "heads", "kv_heads", "layers", "vocab", "original_length", "steps", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    torch.set_num_threads(args.threads)
    result = measure(args)
    for name, values in result.items():
        print(
            f"{name:>12}: crossing step {values['crossing_step_s'] * 1e3:8.2f} ms "
            f"({values['crossing_ratio_vs_transformers']:.2f}x), steady step {values['steady_step_s'] * 1e3:7.2f} ms "
            f"({values['steady_ratio_vs_transformers']:.2f}x)"
        )
    print(
        f"transformers' prefill of L_orig = {args.original_length} tokens: {result['transformers']['prefill_s']:.3f} s"
    )
    if args.out is not None:
        setting = {k: v for k, v in vars(args).items() if k not in ("out", "device")}
        results = Results(
            args.out,
            "longrope_switch",
            device=args.device,
            setting={**setting, "clock": Clock(args.device, cpu_time=None).name},
            scope={k: setting[k] for k in SHAPE},
        )
        for name, values in result.items():
            metrics = {k: v for k, v in values.items() if not k.startswith("round_")}
            rounds = {k: v for k, v in values.items() if k.startswith("round_")}
            results.add_all("longrope", metrics, {"cache": name}, **rounds)
        results.save()


if __name__ == "__main__":
    main()
