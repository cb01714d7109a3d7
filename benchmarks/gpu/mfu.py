"""Model FLOPs utilisation of the recipe's training step at 16k and 32k tokens: chunked loss vs Liger-Kernel vs plain.

A SmolLM2-135M-shaped Llama (random weights, tied embeddings), YaRN x4, batch 1, bf16 autocast,
activation checkpointing, fused AdamW, one optimizer step per measurement; each variant runs in
its own process (Liger's patches are process-wide):

* ``recipe``: the recipe's chunked loss (``hf_posext.train.loss.causal_lm_loss``, 1024-token chunks);
* ``liger``: Liger-Kernel's fused linear cross-entropy, RMSNorm, SwiGLU and RoPE
  (``apply_liger_kernel_to_llama``; skipped with a line when ``liger_kernel`` is not installed);
* ``liger_kernels_chunked_loss``: Liger's RMSNorm, SwiGLU and RoPE with the recipe's chunked loss;
* ``plain``: the step a transformers ``Trainer`` takes, ``model(input_ids, labels=...)``, which
  materialises the ``[tokens x vocabulary]`` fp32 logits.

Model FLOPs are ``6 N T + 6 L T^2 d`` (causal attention, recomputation not counted) over the GPU's
dense bf16 peak. ``--profile`` adds the top kernels of one ``recipe`` step at the first length.
Goal: >= 35% MFU at 16k. Liger's wheel: ``python benchmarks/gpu/carry_model.py prepare`` downloads
it (``pip download liger-kernel --no-deps``) into ``.carry/a/wheels``.

    python3 benchmarks/gpu/mfu.py --out $OUT/mfu --profile         # the GPU run, ~2 min
    python benchmarks/gpu/mfu.py --cpu-smoke --out /tmp/mfu-smoke   # tiny shapes on CPU

Rows (``result_schema.py``) in ``OUT/mfu.json``, benchmark ``gpu_mfu``: per variant and length
(setting ``tokens``) ``step_s`` (each step's seconds and the profile in ``extra``), ``first_step_s``,
``tokens_per_s``, ``model_tflops_per_s``, ``peak_tflops``, ``mfu``, ``peak_memory_mib``, ``loss``,
``first_loss``, ``finite``; a variant or length that did not run: a ``status`` row (``skip``, ``FAIL``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from common import (
    ROOT,
    Report,
    Results,
    add_common_arguments,
    child_env,
    peak_tflops,
    pick_device,
)

VARIANTS = ("recipe", "plain", "liger", "liger_kernels_chunked_loss")  # cheapest first: a time limit cuts the last
SMOLLM2 = dict(layers=30, hidden=576, heads=9, kv_heads=3, vocab=49152, intermediate=1536)
TINY = dict(layers=2, hidden=64, heads=2, kv_heads=1, vocab=512, intermediate=128)


def build(shape: dict[str, int], original: int, device: str) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import hf_posext

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=shape["vocab"],
        hidden_size=shape["hidden"],
        intermediate_size=shape["intermediate"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"],
        head_dim=shape["hidden"] // shape["heads"],
        max_position_embeddings=original,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
        rope_parameters={"rope_type": "default", "rope_theta": 100_000.0},
    )
    model = LlamaForCausalLM(config).to(device)
    hf_posext.patch_model(model, "yarn", factor=4)
    return model


def measure(variant: str, length: int, args: argparse.Namespace) -> dict[str, Any]:
    """One variant at one length: a warm-up step, then ``--steps`` timed steps."""
    import torch
    from harness import Clock, peak_memory_mib, reset_peak_memory

    from hf_posext.train.loss import IGNORE_INDEX, causal_lm_loss

    device = args.device
    shape = TINY if args.cpu_smoke else SMOLLM2
    model = build(shape, length // 4, device)
    if variant.startswith("liger"):
        from liger_kernel.transformers import apply_liger_kernel_to_llama

        apply_liger_kernel_to_llama(
            rope=True, rms_norm=True, swiglu=True, fused_linear_cross_entropy=variant == "liger", model=model
        )
    model.activation_checkpointing_enable()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device == "cuda")
    ids = torch.randint(0, shape["vocab"], (1, length), generator=torch.Generator().manual_seed(1)).to(device)
    labels = torch.nn.functional.pad(ids[:, 1:], (0, 1), value=IGNORE_INDEX)
    positions = torch.arange(length, device=device).unsqueeze(0)
    chunked = variant in ("recipe", "liger_kernels_chunked_loss")

    def step() -> float:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            if chunked:
                loss = causal_lm_loss(model, ids, positions, labels, chunk_size=1024)
            else:
                loss = model(input_ids=ids, position_ids=positions, labels=ids, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    clock = Clock(device)
    first_s, first_loss = clock.time(step)  # kernels, allocator, optimizer states
    reset_peak_memory(device)
    times, losses = [], []
    for _ in range(args.steps):
        seconds, loss = clock.time(step)
        times.append(seconds)
        losses.append(loss)
    step_s = sorted(times)[len(times) // 2]
    n_params = sum(p.numel() for p in model.parameters())  # the tied embedding once: as the head's matmul
    flops = 6 * n_params * length + 6 * shape["layers"] * length**2 * shape["hidden"]
    peak = peak_tflops(device, args.peak_tflops)
    row = {
        "variant": variant,
        "tokens": length,
        "first_step_s": first_s,
        "step_s": step_s,
        "steps_s": times,
        "tokens_per_s": length / step_s,
        "model_tflops_per_s": flops / step_s / 1e12,
        "peak_tflops": peak,
        "mfu": flops / step_s / 1e12 / peak if peak else None,
        "peak_memory_mib": peak_memory_mib(device),
        "loss": losses[-1],
        "first_loss": first_loss,
        "finite": all(math.isfinite(x) for x in losses),
    }
    if args.profile and variant == "recipe" and length == args.lengths[0]:
        row["profile"] = profile(step, device)
    return row


def profile(step: Any, device: str) -> str:
    """The top operators of one step by device time (CPU time on CPU)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with torch_profile(activities=activities) as prof:
        step()
    key = "cuda_time_total" if device == "cuda" else "cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=25)


def child(args: argparse.Namespace) -> None:
    from harness import emit_result

    emit_result({"rows": measure_lengths(args)})


def measure_lengths(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for length in args.lengths:
        try:
            rows.append(measure(args.variant, length, args))
        except Exception as error:  # one failing length must not hide the others
            rows.append({"variant": args.variant, "tokens": length, "error": f"{type(error).__name__}: {error}"})
        if args.device == "cuda":
            import torch

            torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, str(ROOT / "benchmarks" / "results" / "gpu" / "mfu"))
    parser.add_argument("--lengths", type=int, nargs="+", default=None, help="default 16384 32768 (smoke: 256 512)")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--steps", type=int, default=None, help="timed steps per cell (default 3, smoke 1)")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak")
    parser.add_argument("--profile", action="store_true", help="the top kernels of one recipe step")
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.device = pick_device(args)
    args.lengths = args.lengths or ([256, 512] if args.cpu_smoke else [16384, 32768])
    args.steps = args.steps or (1 if args.cpu_smoke else 3)
    if args.variant:
        child(args)
        return 0
    from harness import run_child

    report = Report(
        "mfu",
        args,
        args.device,
        {
            "steps": args.steps,
            "shape": TINY if args.cpu_smoke else SMOLLM2,
            "rope": "yarn x4",
            "precision": "bf16 autocast" if args.device == "cuda" else "fp32",
        },
        rows=add_rows,
    )
    cells: list[dict[str, Any]] = []
    for variant in args.variants:
        started = time.perf_counter()
        if variant.startswith("liger") and importlib.util.find_spec("liger_kernel") is None:
            cells.append(
                {
                    "variant": variant,
                    "status": "skip",
                    "reason": "liger_kernel is not installed (carry its wheel: carry_model.py prepare)",
                }
            )
        elif variant.startswith("liger") and args.device != "cuda":
            cells.append({"variant": variant, "status": "skip", "reason": "Liger's Triton kernels need a GPU"})
        elif args.cpu_smoke:  # no Liger on CPU, so no process-wide patches: one process is enough
            args.variant = variant
            cells.extend({"status": "FAIL" if "error" in r else "ok", **r} for r in measure_lengths(args))
        else:
            command = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--variant",
                variant,
                "--out",
                args.out,
                "--lengths",
                *map(str, args.lengths),
                "--steps",
                str(args.steps),
            ]
            command += ["--cpu-smoke"] * args.cpu_smoke + ["--profile"] * args.profile
            if args.peak_tflops:
                command += ["--peak-tflops", str(args.peak_tflops)]
            try:
                rows = run_child(command, env=child_env(), timeout=480)["rows"]
            except (RuntimeError, TimeoutError) as error:
                rows = [{"variant": variant, "status": "FAIL", "error": str(error)[-2000:]}]
            cells.extend({"status": "FAIL" if "error" in r else "ok", **r} if "status" not in r else r for r in rows)
        report.payload["cells"] = cells
        report.timed(variant, time.perf_counter() - started)
        print(f"{variant}: {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    print(f"{'variant':28} {'tokens':>6} {'step s':>8} {'tok/s':>9} {'MFU':>6} {'peak MiB':>9}")
    for r in cells:
        if r.get("status") == "ok":
            mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "-"
            print(
                f"{r['variant']:28} {r['tokens']:6} {r['step_s']:8.3f} {r['tokens_per_s']:9.0f} {mfu:>6} "
                f"{r['peak_memory_mib']:9.0f}"
            )
        else:
            print(f"{r['variant']:28} {r.get('status')}: {r.get('reason') or r.get('error', '')[:200]}")
    print(json.dumps({"wall_s": report["wall_s"]}), f"\nwrote {report.path}")
    return 0


def add_rows(results: Results, payload: dict[str, Any]) -> None:
    """The rows of the cells measured so far (the module docstring lists them)."""
    for cell in payload.get("cells", []):
        setting = {"tokens": cell["tokens"]} if "tokens" in cell else {}
        if cell["status"] != "ok":
            results.add(
                cell["variant"],
                "status",
                cell["status"],
                setting=setting,
                **{k: cell[k] for k in ("reason", "error") if k in cell},
            )
            continue
        steps = {"steps_s": cell["steps_s"], **({"profile": cell["profile"]} if "profile" in cell else {})}
        results.add(cell["variant"], "step_s", cell["step_s"], setting=setting, **steps)
        results.add_all(
            cell["variant"],
            {k: v for k, v in cell.items() if k not in ("variant", "tokens", "status", "step_s", "steps_s", "profile")},
            setting,
        )


if __name__ == "__main__":
    sys.exit(main())
