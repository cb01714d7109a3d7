"""The GPU check: what the CPU test suite cannot show, in one run of under 8 minutes on one NVIDIA GPU.

Items (each is skipped with a line saying why when its package or device is missing, and a
failure in one does not stop the others):

* ``alibi_flash``: ALiBi through flash-attn's ``alibi_slopes`` against the eager path in bf16,
  forward and backward (error bound: 3x the native model's own bf16 error, the bound every bf16 check uses).
* ``alibi_flex_train``: a training step through FlexAttention's compiled backward (CUDA only)
  against the eager path's gradients, fp32.
* ``bf16_parity``: every registered method's bf16 logits against its fp32 logits at 3x the
  original context, bounded by 3x the unpatched model's bf16 error on the same input.
* ``fsdp2_recipe_step``: the fine-tune recipe under ``accelerate launch`` with the shipped FSDP2
  config, one process, activation checkpointing, the chunked loss: the model must be sharded
  (an ``FSDP*`` class), the losses finite, the checkpoint must reload in transformers.
* ``mfu``: model FLOPs utilisation of a training step (bf16 autocast, activation checkpointing,
  chunked loss, AdamW) of a SmolLM2-135M-shaped model at 16k tokens. Model FLOPs are
  ``6 N T + 6 L T^2 d`` (causal attention; recomputation not counted), over the GPU's dense
  bf16 peak (a table of known GPUs, or ``--peak-tflops``).
* ``dynamic_decode``: exact dynamic scaling's decode speed against the static method
  (``benchmarks/bench_dynamic_decode.py`` on the GPU, bf16).

    bash benchmarks/gpu/check.sh                       # the GPU run; writes benchmarks/results/gpu/check.json
    python benchmarks/gpu/check.py --cpu-smoke --out /tmp/smoke.json   # every item tiny on CPU (~1 min)

``--cpu-smoke`` proves the plumbing, not the GPU claims: items that need CUDA run their CPU
stand-in (SDPA instead of Flex for training, no FSDP wrapping) or skip, and say so.

``--out`` gets rows (``result_schema.py``), benchmark ``gpu_check``, method = the item: its ``status``
(``ok``, ``skip`` or ``FAIL``, with ``reason`` or ``error`` in ``extra``), its ``seconds``, and one row
per number it reports (``bf16_parity``: per method, setting ``rope``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import subprocess
import sys
import sysconfig
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
from common import PEAK_BF16_TFLOPS, child_env
from harness import Results
from result_schema import read_rows
from transformers import LlamaConfig, LlamaForCausalLM

import hf_posext
from hf_posext.testing import make_tiny_model
from hf_posext.methods import method_class
from hf_posext.train.loss import IGNORE_INDEX, causal_lm_loss

ROOT = Path(__file__).resolve().parents[2]


class Skip(Exception):
    """An item that cannot run here; the message says why."""


def tiny_llama(
    device: str,
    layers: int = 2,
    hidden: int = 128,
    heads: int = 4,
    kv_heads: int = 2,
    max_positions: int = 64,
    attn: str = "sdpa",
    vocab: int = 256,
    tied: bool = False,
    intermediate: int | None = None,
) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate or 2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // heads,
        max_position_embeddings=max_positions,
        attn_implementation=attn,
        tie_word_embeddings=tied,
    )
    return LlamaForCausalLM(config).to(device)


def random_ids(length: int, vocab: int, device: str, batch: int = 2) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(1)).to(device)


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits.float()


def native_bf16_error(device: str, ids: torch.Tensor, **model_kwargs) -> float:
    native = tiny_llama(device, **model_kwargs)
    fp32 = logits(native, ids)
    return float((logits(native.to(torch.bfloat16), ids) - fp32).abs().max())


def step_grads(model: torch.nn.Module, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    model(ids, labels=ids).loss.backward()
    return {name: p.grad.float().clone() for name, p in model.named_parameters() if p.grad is not None}


def max_rel_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-12)) for k in b)


# --- items ---------------------------------------------------------------------------------------


def alibi_flash(args: argparse.Namespace) -> dict:
    if args.device != "cuda":
        raise Skip("flash-attn needs CUDA")
    if importlib.util.find_spec("flash_attn") is None:
        raise Skip("flash_attn is not installed (pip install flash-attn --no-build-isolation)")
    ids = random_ids(256, 256, "cuda")
    eager = hf_posext.patch_model(tiny_llama("cuda", max_positions=64), "alibi", backend="eager").to(torch.bfloat16)
    flash = hf_posext.patch_model(tiny_llama("cuda", max_positions=64), "alibi", backend="flash").to(torch.bfloat16)
    bound = 3 * native_bf16_error("cuda", ids)
    error = float((logits(flash, ids) - logits(eager, ids)).abs().max())
    native = tiny_llama("cuda")
    native_fp32_grads = step_grads(native, ids)
    grad_bound = 3 * max_rel_diff(step_grads(native.to(torch.bfloat16), ids), native_fp32_grads)
    grad_error = max_rel_diff(step_grads(flash, ids), step_grads(eager, ids))
    return {
        "ok": error <= bound and grad_error <= grad_bound,
        "logit_error": error,
        "bound": bound,
        "grad_rel_error": grad_error,
        "grad_bound": grad_bound,
    }


def alibi_flex_train(args: argparse.Namespace) -> dict:
    # PyTorch has no CPU backward for flex_attention: the CPU stand-in trains through SDPA.
    backend = "flex" if args.device == "cuda" else "sdpa"
    if backend == "flex" and importlib.util.find_spec("torch.nn.attention.flex_attention") is None:
        raise Skip("torch.nn.attention.flex_attention is missing (PyTorch >= 2.5)")
    length = 512 if args.device == "cuda" else 64
    ids = random_ids(length, 256, args.device)
    reference = step_grads(hf_posext.patch_model(tiny_llama(args.device), "alibi", backend="eager"), ids)
    model = hf_posext.patch_model(tiny_llama(args.device), "alibi", backend=backend)
    started = time.perf_counter()
    got = step_grads(model, ids)
    error = max_rel_diff(got, reference)
    # fp32 on both sides; the tolerance covers TF32-free kernel reordering, not a wrong bias.
    return {
        "ok": error <= 1e-3,
        "backend": backend,
        "grad_rel_error": error,
        "bound": 1e-3,
        "first_step_s": time.perf_counter() - started,
    }


def method_kwargs(method: str, length: int) -> dict:
    spec = method_class(method)
    if spec.scales_rope:
        return {"factor": 4}
    if method == "learned":
        return {"max_length": length}
    return {}


def bf16_parity(args: argparse.Namespace) -> dict:
    original = 64
    length = 3 * original
    ids = random_ids(length, 256, args.device)
    bound = 3 * native_bf16_error(args.device, ids)
    rows = {}
    for method in hf_posext.available_methods():
        model = hf_posext.patch_model(tiny_llama(args.device), method, **method_kwargs(method, length))
        fp32 = logits(model, ids)
        error = float((logits(model.to(torch.bfloat16), ids) - fp32).abs().max())
        rows[method] = {
            "error": error,
            "ratio_to_native": error / bound * 3,
            "ok": math.isfinite(error) and error <= bound,
        }
    return {"ok": all(r["ok"] for r in rows.values()), "bound": bound, "methods": rows}


RECIPE_DRIVER = """
import json, sys
from hf_posext.train.config import TrainConfig
from hf_posext.train.loop import train

result = train(TrainConfig(**json.loads(sys.argv[1])))
print("RESULT " + json.dumps({"model_class": type(result.model).__name__, "losses": result.losses}))
"""


def fsdp2_recipe_step(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        make_tiny_model(work / "model", max_position_embeddings=64)
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        (work / "data.txt").write_text((stdlib / "textwrap.py").read_text())
        (work / "driver.py").write_text(RECIPE_DRIVER)
        config = dict(
            model=str(work / "model"),
            method="yarn",
            factor=4,
            dataset=[str(work / "data.txt")],
            output_dir=str(work / "out"),
            max_train_steps=2,
            warmup_steps=1,
            global_batch_size=2,
            micro_batch_size=1,
            activation_checkpointing=True,
            cache_dir=str(work / "cache"),
        )
        if args.device == "cuda":
            # The shipped FSDP2 config (bf16), on one process.
            launcher = [
                sys.executable,
                "-m",
                "accelerate.commands.launch",
                "--config_file",
                str(ROOT / "examples" / "accelerate" / "fsdp2.yaml"),
                "--num_processes",
                "1",
            ]
        else:
            # accelerate does not shard on CPU (it falls back to DDP or no wrapping): plumbing only.
            launcher = [sys.executable]
            config["mixed_precision"] = "no"
        started = time.perf_counter()
        done = subprocess.run(
            [*launcher, str(work / "driver.py"), json.dumps(config)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=300,
            env=child_env(),
        )
        if done.returncode != 0:
            return {"ok": False, "error": done.stderr[-2000:]}
        line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
        result = json.loads(line[len("RESULT ") :])
        reloaded = LlamaForCausalLM.from_pretrained(work / "out")
        sharded = result["model_class"].startswith("FSDP")
        ok = (
            all(math.isfinite(loss) for loss in result["losses"])
            and reloaded.config.rope_parameters["rope_type"] == "yarn"
            and (sharded or args.device != "cuda")
        )
        return {
            "ok": ok,
            "wrapping": result["model_class"],
            "losses": result["losses"],
            "seconds": time.perf_counter() - started,
        }


def mfu(args: argparse.Namespace) -> dict:
    cuda = args.device == "cuda"
    length = 16384 if cuda else 256
    # SmolLM2-135M's shape on the GPU.
    shape = (
        dict(layers=30, hidden=576, heads=9, kv_heads=3, vocab=49152, intermediate=1536)
        if cuda
        else dict(layers=2, hidden=64, heads=2, kv_heads=1, vocab=512)
    )
    model = tiny_llama(args.device, max_positions=length // 4, tied=True, **shape)
    hf_posext.patch_model(model, "yarn", factor=4)
    model.activation_checkpointing_enable()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=cuda)
    ids = random_ids(length, shape["vocab"], args.device, batch=1)
    labels = torch.nn.functional.pad(ids[:, 1:], (0, 1), value=IGNORE_INDEX)
    positions = torch.arange(length, device=args.device).unsqueeze(0)
    dtype = torch.bfloat16 if cuda else torch.float32

    def step() -> float:
        with torch.autocast(args.device, dtype=dtype, enabled=cuda):
            loss = causal_lm_loss(model, ids, positions, labels, chunk_size=1024)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    step()  # warm-up: kernels, allocator, optimizer states
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    steps = 3 if cuda else 1
    started = time.perf_counter()
    losses = [step() for _ in range(steps)]
    if cuda:
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - started) / steps
    # parameters() counts the tied embedding once: as the head's matmul (the lookup costs nothing).
    n_params = sum(p.numel() for p in model.parameters())
    flops = 6 * n_params * length + 6 * shape["layers"] * length**2 * shape["hidden"]
    achieved = flops / seconds / 1e12
    peak = args.peak_tflops or next(
        (v for k, v in PEAK_BF16_TFLOPS.items() if cuda and k in torch.cuda.get_device_name()), None
    )
    row = {
        "ok": all(math.isfinite(loss) for loss in losses),
        "tokens": length,
        "step_s": seconds,
        "tokens_per_s": length / seconds,
        "model_tflops_per_s": achieved,
        "peak_tflops": peak,
        "mfu": achieved / peak if peak else None,
    }
    if cuda:
        row["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return row


def dynamic_decode(args: argparse.Namespace) -> dict:
    out = Path(args.out).with_name("dynamic_decode.json")
    if args.device == "cuda":
        # L_orig 2048 with 128 new tokens and 3 rounds ran past the 300 s limit on an H200, when the row-wise
        # prefill still chunked by the CPU's budget (docs/results/gpu.md); this is what ran after.
        shape = [
            "--device",
            "cuda",
            "--dtype",
            "bfloat16",
            "--hidden",
            "2048",
            "--heads",
            "16",
            "--kv-heads",
            "4",
            "--layers",
            "8",
            "--original-length",
            "1024",
            "--new-tokens",
            "64",
            "--repeats",
            "2",
            "--prefill-multiples",
            "4,8",
        ]
    else:
        shape = [
            "--hidden",
            "64",
            "--heads",
            "2",
            "--kv-heads",
            "1",
            "--layers",
            "1",
            "--original-length",
            "32",
            "--new-tokens",
            "4",
            "--repeats",
            "1",
        ]
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_dynamic_decode.py"), *shape, "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env=child_env(),
    )
    if done.returncode != 0:
        return {"ok": False, "stderr": done.stderr[-2000:]}
    ratios = {
        f"{row.method} {'exact' if row.setting['exact_cache'] else 'transformers'}": row.value
        for row in read_rows(out)
        if row.metric == "decode_ratio_vs_static"
    }
    return {"ok": bool(ratios), "decode_ratio_vs_static": ratios, "goal": ">= 0.95", "json": str(out)}


ITEMS: dict[str, Callable[[argparse.Namespace], dict]] = {
    "alibi_flash": alibi_flash,
    "alibi_flex_train": alibi_flex_train,
    "bf16_parity": bf16_parity,
    "fsdp2_recipe_step": fsdp2_recipe_step,
    "mfu": mfu,
    "dynamic_decode": dynamic_decode,
}


def summary(row: dict) -> str:
    keys = (
        "logit_error",
        "grad_rel_error",
        "bound",
        "backend",
        "wrapping",
        "mfu",
        "model_tflops_per_s",
        "tokens_per_s",
        "peak_memory_gib",
        "decode_ratio_vs_static",
        "reason",
        "error",
    )
    parts = []
    for key in keys:
        if row.get(key) is not None:
            value = row[key]
            if isinstance(value, dict):
                value = ",".join(f"{k}:{v:.3f}" for k, v in value.items())
            parts.append(f"{key}={value:.3g}" if isinstance(value, float) else f"{key}={value}")
    if "methods" in row:
        worst = max(row["methods"], key=lambda m: row["methods"][m]["ratio_to_native"])
        parts.append(f"worst={worst} at {row['methods'][worst]['ratio_to_native']:.2f}x the native bf16 error")
    return " ".join(parts)


def add_item(results: Results, name: str, item: dict) -> None:
    """An item's rows: its status (lists and texts in ``extra``), then one row per number or word it reports."""
    details = ("reason", "error", "traceback", "stderr", "losses")
    results.add(name, "status", item["status"], **{k: item[k] for k in details if k in item})
    for key, value in item.items():
        if key in ("status", *details):
            continue
        if key == "methods":
            for method, result in value.items():
                results.add_all(name, result, {"rope": method})
        elif isinstance(value, dict):
            for case, number in value.items():
                results.add(name, key, number, setting={"case": case})
        else:
            results.add(name, key, value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="run every item tiny on CPU (plumbing only)")
    parser.add_argument("--only", nargs="+", choices=sorted(ITEMS), help="run these items only")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak, for MFU")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu" / "check.json"))
    args = parser.parse_args()
    if not args.cpu_smoke and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run on a GPU, or pass --cpu-smoke to check the plumbing on CPU")
    args.device = "cpu" if args.cpu_smoke else "cuda"
    results = Results(
        args.out, "gpu_check", device=args.device, setting={"mode": "cpu-smoke" if args.cpu_smoke else "gpu"}
    )
    items: dict[str, dict] = {}
    for name in args.only or ITEMS:
        started = time.perf_counter()
        try:
            row = ITEMS[name](args)
            row["status"] = "ok" if row.pop("ok") else "FAIL"
        except Skip as skip:
            row = {"status": "skip", "reason": str(skip)}
        except Exception as error:  # one broken item must not hide the others' results
            row = {"status": "FAIL", "error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
        row["seconds"] = time.perf_counter() - started
        items[name] = row
        print(f"{name}: {row['status']} in {row['seconds']:.1f} s", file=sys.stderr, flush=True)
        # Written after every item, so that a run stopped by check.sh's time limit keeps what finished.
        add_item(results, name, row)
        results.save()
    print(
        f"{'item':18} {'status':6} {'seconds':>8}  details\n"
        + "\n".join(f"{name:18} {row['status']:6} {row['seconds']:8.1f}  {summary(row)}" for name, row in items.items())
    )
    print(f"device: {results.device}; wrote {args.out}")
    sys.exit(1 if any(row["status"] == "FAIL" for row in items.values()) else 0)


if __name__ == "__main__":
    main()
