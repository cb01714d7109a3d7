"""Exact dynamic scaling on the GPU: prefill of 4k-16k-token prompts at 4x L_orig against transformers' dynamic
prefill, and decode speed against the static method (``benchmarks/bench_dynamic_decode.py``'s measurements).

For L_orig = 1024, 2048, 4096 (prompts of 4x that): a random-weight Llama (hidden 2048, 16/4 heads,
8 layers, bf16, SDPA), patched with ``dynamic_ntk`` / ``dynamic_yarn`` at factor 8, exact
(``exact_cache=True``, the default) and transformers' own path (``exact_cache=False``); best of
``--repeats`` rounds after one untimed forward. A length is skipped, with a line saying so, when the
previous one's time predicts (quadratic in the length) that it would not finish in ``--budget-minutes``.
Then decode of the last 64 tokens up to 4x L_orig = 4096 against the static methods (goal >= 0.95x).

    python3 benchmarks/gpu/prefill.py --out $OUT/prefill            # the GPU run, ~1-2 min
    python benchmarks/gpu/prefill.py --cpu-smoke --out /tmp/prefill-smoke

Rows (``result_schema.py``) in ``OUT/prefill.json``: ``bench_dynamic_decode.py``'s benchmarks
``dynamic_prefill`` (per method and prompt; ``probe`` in the setting of a single-forward probe, a
``status`` row for a skipped length) and ``dynamic_decode`` (with ``original_length``, ``factor``, ``tokens``).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from common import ROOT, Report, Results, add_common_arguments, pick_device

GPU_SHAPE = dict(hidden=2048, heads=16, kv_heads=4, layers=8, vocab=1024, dtype="bfloat16")
SMOKE_SHAPE = dict(hidden=64, heads=2, kv_heads=1, layers=1, vocab=256, dtype="float32")


def bench_args(shape: dict[str, Any], device: str, original: int, repeats: int, new_tokens: int) -> argparse.Namespace:
    """The namespace ``bench_dynamic_decode``'s functions read (its flags' names)."""
    return argparse.Namespace(
        hidden=shape["hidden"],
        heads=shape["heads"],
        kv_heads=shape["kv_heads"],
        layers=shape["layers"],
        vocab=shape["vocab"],
        dtype=shape["dtype"],
        original_length=original,
        factor=4.0,
        new_tokens=new_tokens,
        batch=1,
        repeats=repeats,
        attention="sdpa",
        device=device,
        threads=1,
        prefill_multiples=[4],
        prefill_factor=8.0,
        checkpoint=None,
        prefill_warm_up=True,
        prefill_only=True,
        out=None,
    )


def probe_prefill(bench: Any, model: Any, namespace: argparse.Namespace) -> dict[str, Any]:
    """One forward of each path (dynamic NTK, first call included): what a still-slow exact path costs."""
    import torch

    import hf_posext

    prompt = torch.randint(
        0, namespace.vocab, (1, 4 * namespace.original_length), generator=torch.Generator().manual_seed(2)
    ).to(namespace.device)
    seconds = {}
    for exact in (False, True):
        hf_posext.patch_model(model, "dynamic_ntk", factor=namespace.prefill_factor, exact_cache=exact)
        seconds[exact] = bench.prefill(model, prompt, namespace.device)[0]
    return {
        "method": "dynamic_ntk",
        "exact_prefill_s": seconds[True],
        "transformers_prefill_s": seconds[False],
        "ratio": seconds[True] / seconds[False],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, str(ROOT / "benchmarks" / "results" / "gpu" / "prefill"))
    parser.add_argument(
        "--original-lengths",
        type=int,
        nargs="+",
        default=None,
        help="L_orig values; prompts are 4x (default 1024 2048 4096; smoke 16 32)",
    )
    parser.add_argument("--repeats", type=int, default=None, help="rounds, best kept (default 2, smoke 1)")
    parser.add_argument("--new-tokens", type=int, default=None, help="decoded tokens (default 64, smoke 4)")
    parser.add_argument("--budget-minutes", type=float, default=3.0, help="skip prefill lengths predicted past this")
    parser.add_argument("--no-decode", action="store_true", help="prefill only")
    args = parser.parse_args(argv)
    device = pick_device(args)
    import bench_dynamic_decode as bench
    import torch

    shape = SMOKE_SHAPE if args.cpu_smoke else GPU_SHAPE
    originals = args.original_lengths or ([16, 32] if args.cpu_smoke else [1024, 2048, 4096])
    repeats = args.repeats or (1 if args.cpu_smoke else 2)
    new_tokens = args.new_tokens or (4 if args.cpu_smoke else 64)
    report = Report(
        "prefill",
        args,
        device,
        {"shape": shape, "repeats": repeats, "new_tokens": new_tokens, "prefill_factor": 8.0, "multiple": 4},
        rows=add_rows,
        benchmarks=["dynamic_prefill", "dynamic_decode"],
    )
    deadline = time.perf_counter() + 60 * args.budget_minutes
    last: tuple[int, float] | None = None
    prefill_rows: list[dict[str, Any]] = []
    for original in originals:
        tokens = 4 * original
        if last is not None:
            # Each length runs 2 methods x 2 paths x (warm-up + repeats) forwards; exact dominates.
            predicted = last[1] * (tokens / last[0]) ** 2
            if time.perf_counter() + predicted > deadline:
                prefill_rows.append(
                    {
                        "tokens": tokens,
                        "status": "skip",
                        "reason": f"predicted {predicted:.0f} s from {last[0]} tokens, past the budget",
                    }
                )
                continue
        started = time.perf_counter()
        namespace = bench_args(shape, device, original, repeats, new_tokens)
        model = bench.build(namespace)
        probe = probe_prefill(bench, model, namespace)
        # The full cell runs 2 methods x 2 paths x (1 + repeats) forwards, the exact ones dominating.
        if time.perf_counter() + 2 * (1 + repeats) * probe["exact_prefill_s"] > deadline:
            prefill_rows.append(
                {
                    "status": "probe",
                    "original_length": original,
                    "tokens": tokens,
                    **probe,
                    "reason": "one exact forward predicts the full cell past the budget",
                }
            )
            report["prefill"] = prefill_rows
            break
        rows = bench.prefill_ratios(model, namespace)
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
        seconds = time.perf_counter() - started
        last = (tokens, seconds)
        prefill_rows += [{"status": "ok", "original_length": original, **row} for row in rows]
        report.timed(f"prefill {tokens}", seconds)
        report["prefill"] = prefill_rows
    report["prefill"] = prefill_rows
    if not args.no_decode:
        started = time.perf_counter()
        namespace = bench_args(shape, device, originals[0], repeats, new_tokens)
        report["decode"] = {
            "original_length": originals[0],
            "tokens": 4 * originals[0],
            "rows": bench.decode_ratios(bench.build(namespace), namespace),
            "goal": ">= 0.95",
        }
        report.timed("decode", time.perf_counter() - started)
    path = report.save()
    print(f"wrote {path}")
    return 0


def add_rows(results: Results, payload: dict[str, Any]) -> None:
    """The rows of the prefill cells and the decode run measured so far (the module docstring lists them)."""
    import bench_dynamic_decode as bench

    for row in payload.get("prefill", []):
        if row["status"] == "skip":
            results.add(
                "all",
                "status",
                "skip",
                setting={"tokens": row["tokens"]},
                benchmark="dynamic_prefill",
                reason=row["reason"],
            )
            continue
        probe = {"probe": True} if row["status"] == "probe" else {}
        setting = {k: row[k] for k in ("original_length", "multiple_of_original", "tokens") if k in row}
        results.add_all(
            row["method"],
            {k: row[k] for k in ("exact_prefill_s", "transformers_prefill_s", "ratio")},
            {**setting, **probe},
            benchmark="dynamic_prefill",
            **({"reason": row["reason"]} if probe else {}),
        )
    if "decode" in payload:
        decode = payload["decode"]
        bench.add_rows(
            results,
            decode["rows"],
            [],
            {"original_length": decode["original_length"], "factor": 4.0, "tokens": decode["tokens"]},
        )


if __name__ == "__main__":
    sys.exit(main())
