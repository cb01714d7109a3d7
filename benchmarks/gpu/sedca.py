"""Self-Extend and Dual Chunk Attention on the GPU: prefill time and memory at 16k-64k against SDPA/flash, bf16 parity.

For each length, one forward (``logits_to_keep=1``, as a prefill) of a random-weight Llama
(hidden 2048, 16/4 heads of 128, 4 layers, L_orig 4096, bf16): unpatched with SDPA and with
flash-attention 2 (when ``flash_attn`` is installed), and patched with ``self_extend`` and
``dca`` (factor = the longest length / L_orig, their other sizes derived from it, or
``--method-args``; over SDPA and, where installed, flash); best of ``--repeats`` after one untimed forward,
peak allocated memory. A cell that runs out of memory says so; a length predicted past
``--budget-minutes`` from the previous one is skipped with a line. Then bf16 parity: each
method's bf16 logits against its own fp32 logits at 4x L_orig of a small model, bounded by 3x
the unpatched model's own bf16 error on the same input (as ``check.py``'s ``bf16_parity``).

The methods come from the ``sedca`` work; where they are not registered the script writes a
skip line and exits 0.

    python3 benchmarks/gpu/sedca.py --out $OUT/sedca                 # the GPU run, ~1-2 min
    python benchmarks/gpu/sedca.py --cpu-smoke --out /tmp/sedca-smoke

Rows (``result_schema.py``) in ``OUT/sedca.json``: benchmark ``gpu_sedca``, per variant and length
(setting ``tokens``) ``prefill_s``, ``tokens_per_s``, ``peak_memory_mib``, ``time_vs_sdpa``,
``memory_vs_sdpa``, or a ``status`` row (``skip``, ``oom``, ``FAIL``); a ``status`` row of method
``all`` when the methods are not registered; ``gpu_sedca_parity``, per method, ``error``,
``ratio_to_native`` and ``ok`` (or a ``FAIL`` status row), and ``bound`` (method ``none``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from typing import Any

from common import ROOT, Report, Results, add_common_arguments, pick_device

METHODS = ("self_extend", "dca")
GPU = dict(hidden=2048, heads=16, kv_heads=4, layers=4, vocab=32000, original=4096, lengths=(16384, 32768, 65536))
SMOKE = dict(hidden=64, heads=2, kv_heads=1, layers=1, vocab=256, original=32, lengths=(128, 256))
PARITY_GPU = dict(hidden=512, heads=8, kv_heads=2, layers=2, vocab=1024, original=1024)
PARITY_SMOKE = dict(hidden=64, heads=2, kv_heads=1, layers=1, vocab=256, original=32)


def llama(shape: dict[str, Any], device: str, dtype: Any, attn: str = "sdpa") -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=shape["vocab"],
        hidden_size=shape["hidden"],
        intermediate_size=2 * shape["hidden"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"],
        head_dim=shape["hidden"] // shape["heads"],
        max_position_embeddings=shape["original"],
        attn_implementation=attn,
    )
    return LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()


def variants(device: str, methods: list[str]) -> list[tuple[str, str, str | None]]:
    """``(label, attention implementation, method)``: each kernel there is, alone and under each method."""
    kernels = ["sdpa"]
    if device == "cuda" and importlib.util.find_spec("flash_attn") is not None:
        kernels.append("flash_attention_2")
    rows: list[tuple[str, str, str | None]] = [(kernel, kernel, None) for kernel in kernels]
    for method in methods:
        rows += [(method if kernel == "sdpa" else f"{method} ({kernel})", kernel, method) for kernel in kernels]
    return rows


def arguments(method: str, factor: float, method_args: dict[str, Any]) -> dict[str, Any]:
    """``factor`` (the reach the methods derive their sizes from: with none, Self-Extend groups nothing)
    unless ``--method-args`` sets it, plus the method's ``--method-args``."""
    return {"factor": factor, **method_args.get(method, {})}


def prefill_cell(model: Any, length: int, vocab: int, device: str, repeats: int) -> dict[str, Any]:
    import torch
    from harness import Clock, peak_memory_mib, reset_peak_memory

    ids = torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(length)).to(device)
    clock = Clock(device)

    def forward() -> None:
        with torch.inference_mode():
            model(input_ids=ids, logits_to_keep=1, use_cache=False)

    forward()
    reset_peak_memory(device)
    times = clock.repeat(forward, repeats)
    return {"prefill_s": min(times), "tokens_per_s": length / min(times), "peak_memory_mib": peak_memory_mib(device)}


def speed(args: argparse.Namespace, report: Report, method_args: dict[str, Any]) -> list[dict[str, Any]]:
    import torch

    import hf_posext

    shape = SMOKE if args.cpu_smoke else GPU
    dtype = torch.float32 if args.cpu_smoke else torch.bfloat16
    deadline = time.perf_counter() + 60 * args.budget_minutes
    rows: list[dict[str, Any]] = []
    for label, attn, method in variants(args.device, args.methods):
        variant_started = time.perf_counter()
        last: tuple[int, float] | None = None
        model = llama(shape, args.device, dtype, attn)
        if method:
            factor = max(shape["lengths"]) / shape["original"]
            hf_posext.patch_model(model, method, **arguments(method, factor, method_args))
        for length in shape["lengths"]:
            row: dict[str, Any] = {"variant": label, "tokens": length}
            predicted = last[1] * (length / last[0]) ** 2 if last else 0.0
            if time.perf_counter() + predicted > deadline:
                rows.append({**row, "status": "skip", "reason": f"predicted {predicted:.0f} s, past the budget"})
                continue
            started = time.perf_counter()
            try:
                row.update(status="ok", **prefill_cell(model, length, shape["vocab"], args.device, args.repeats))
            except torch.OutOfMemoryError:
                row.update(status="oom")
            except Exception as error:  # one failing cell must not hide the others
                row.update(status="FAIL", error=f"{type(error).__name__}: {error}")
            last = (length, time.perf_counter() - started)
            rows.append(row)
            report["speed"] = rows  # saved cell by cell: a run stopped by its time limit keeps what finished
            if args.device == "cuda":
                torch.cuda.empty_cache()
        del model
        report.timed(f"speed {label}", time.perf_counter() - variant_started)
    base = {r["tokens"]: r for r in rows if r["variant"] == "sdpa" and r["status"] == "ok"}
    # Ratios against SDPA alone, for the methods over either kernel.
    for row in rows:
        if row["status"] == "ok" and row["tokens"] in base:
            row["time_vs_sdpa"] = row["prefill_s"] / base[row["tokens"]]["prefill_s"]
            row["memory_vs_sdpa"] = row["peak_memory_mib"] / base[row["tokens"]]["peak_memory_mib"]
    return rows


def parity(args: argparse.Namespace, method_args: dict[str, Any]) -> dict[str, Any]:
    """Each method's bf16 logits against its fp32 logits, bounded by 3x the unpatched model's bf16 error."""
    import torch

    import hf_posext

    shape = PARITY_SMOKE if args.cpu_smoke else PARITY_GPU
    length = 4 * shape["original"]
    ids = torch.randint(0, shape["vocab"], (1, length), generator=torch.Generator().manual_seed(3)).to(args.device)

    def logits(model: Any) -> Any:
        with torch.inference_mode():
            return model(input_ids=ids).logits.float()

    native = llama(shape, args.device, torch.float32)
    reference = logits(native)
    bound = 3 * float((logits(native.to(torch.bfloat16)) - reference).abs().max())
    rows = {}
    for method in args.methods:
        try:
            model = hf_posext.patch_model(
                llama(shape, args.device, torch.float32), method, **arguments(method, 4.0, method_args)
            )
            fp32 = logits(model)
            error = float((logits(model.to(torch.bfloat16)) - fp32).abs().max())
            rows[method] = {"error": error, "ratio_to_native": 3 * error / bound, "ok": error <= bound}
        except Exception as error:
            rows[method] = {"ok": False, "error": f"{type(error).__name__}: {error}"}
    return {"tokens": length, "bound": bound, "methods": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, str(ROOT / "benchmarks" / "results" / "gpu" / "sedca"))
    parser.add_argument("--repeats", type=int, default=2, help="timed forwards per cell, best kept")
    parser.add_argument("--budget-minutes", type=float, default=3.0, help="skip lengths predicted past this")
    parser.add_argument(
        "--methods",
        nargs="+",
        default=list(METHODS),
        help="the methods measured (any registered one, e.g. to check the script itself)",
    )
    parser.add_argument(
        "--method-args",
        type=json.loads,
        default={},
        help='per-method arguments as JSON, e.g. \'{"self_extend": {"group_size": 8}}\'',
    )
    args = parser.parse_args(argv)
    args.device = pick_device(args)
    import hf_posext

    report = Report(
        "sedca",
        args,
        args.device,
        {
            "speed_shape": SMOKE if args.cpu_smoke else GPU,
            "parity_shape": PARITY_SMOKE if args.cpu_smoke else PARITY_GPU,
            "method_args": args.method_args,
        },
        rows=add_rows,
        benchmarks=["gpu_sedca_parity"],
    )
    missing = [m for m in args.methods if m not in hf_posext.available_methods()]
    if missing:
        report["status"] = "skip"
        report["reason"] = f"not registered in this checkout: {', '.join(missing)}"
        print(f"sedca: skip: {report['reason']} (wrote {report.path})")
        return 0
    report["status"] = "ok"
    rows = speed(args, report, args.method_args)
    report["speed"] = rows
    started = time.perf_counter()
    report["parity"] = parity(args, args.method_args)
    report.timed("parity", time.perf_counter() - started)
    for row in rows:
        extra = (
            f"{row['prefill_s']:.3f} s, {row['peak_memory_mib']:.0f} MiB"
            if row["status"] == "ok"
            else row.get("reason") or row.get("error", "")
        )
        print(f"{row['variant']:18} {row['tokens']:6} {row['status']:5} {extra}")
    print(json.dumps(report["parity"]), f"\nwrote {report.path}")
    return 0


def add_rows(results: Results, payload: dict[str, Any]) -> None:
    """The rows of what was measured so far (the module docstring lists them)."""
    if payload.get("status") == "skip":
        results.add("all", "status", "skip", reason=payload["reason"])
    for row in payload.get("speed", []):
        setting = {"tokens": row["tokens"]}
        if row["status"] != "ok":
            results.add(
                row["variant"],
                "status",
                row["status"],
                setting=setting,
                **{k: row[k] for k in ("reason", "error") if k in row},
            )
            continue
        results.add_all(
            row["variant"], {k: v for k, v in row.items() if k not in ("variant", "tokens", "status")}, setting
        )
    if "parity" in payload:
        parity = payload["parity"]
        setting = {"tokens": parity["tokens"]}
        results.add("none", "bound", parity["bound"], setting=setting, benchmark="gpu_sedca_parity")
        for method, row in parity["methods"].items():
            if "ratio_to_native" in row:
                results.add_all(method, row, setting, benchmark="gpu_sedca_parity")
            else:
                results.add(method, "status", "FAIL", setting=setting, benchmark="gpu_sedca_parity", error=row["error"])


if __name__ == "__main__":
    sys.exit(main())
