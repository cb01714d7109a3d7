"""Time and peak memory of every ALiBi attention path against RoPE + SDPA on the same model.

One forward (inference, batch 1) per path and length on a small Llama built from a config
(no weights needed); every ratio is against the plain RoPE + SDPA model measured in the same run.
The point to check: FlexAttention's memory grows about linearly with the length (the bias is a
score modifier, never a tensor), while the SDPA path materialises a [batch, heads, L, L] bias and
grows quadratically. The growth exponent between consecutive lengths is reported per path.

A second table times the attention kernels alone (one layer's shapes, forward, and forward plus
backward where the kernel has one), each against SDPA ``is_causal`` (RoPE's kernel): FlexAttention
with the causal block mask and no score_mod, the same with the ALiBi score_mod, and the folded
path (ALiBi as extra query/key channels of SDPA's causal kernel). It says where the flex path's
time goes: the kernel, or the bias.

Peak memory on CPU comes from the PyTorch profiler's allocator events (allocations minus frees,
in time order, during one forward after a warm-up; compile-time memory is not counted). On CUDA
it is ``torch.cuda.max_memory_allocated``. Quadratic paths stop at the first length whose
projected peak (4x the previous one) exceeds ``--memory-budget-gib``.

Run (CPU, about 10 minutes on 2 cores)::

    .venv/bin/python benchmarks/bench_alibi.py
    .venv/bin/python benchmarks/bench_alibi.py --lengths 256 512 --repeats 1   # a quick smoke run
    nice -n 5 .venv/bin/python benchmarks/bench_alibi.py --threads 1 --lengths 1024 2048 4096 8192  # shared machine
    .venv/bin/python benchmarks/bench_alibi.py --device cuda --dtype bfloat16 --lengths 4096 16384 65536

It writes rows (``result_schema.py``) to ``benchmarks/results/alibi.json`` (``--out``): benchmark
``alibi`` (per path and length: ``time_s``, ``cpu_s``, ``peak_mib``, ``time_ratio``, ``memory_ratio``,
or a ``status`` row saying why a path was skipped) and ``alibi_kernels`` (per kernel and length:
``forward_s``, ``train_s`` and their ratios); ``--resume`` keeps the rows a previous run of the same
settings wrote. ``python scripts/tables.py`` then renders ``benchmarks/results/alibi.md``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from harness import Clock, Results
from tqdm import tqdm
from transformers import LlamaConfig, LlamaForCausalLM, masking_utils

import hf_posext
from hf_posext.methods.alibi import attention as alibi_attention
from hf_posext.methods.alibi import folded as alibi_folded

PATHS = ("rope_sdpa", "alibi_eager", "alibi_sdpa", "alibi_flex", "alibi_folded", "alibi_flash")
QUADRATIC = {"alibi_eager", "alibi_sdpa"}
KERNELS = ("sdpa_causal", "flex_causal", "flex_alibi", "folded")
RESULTS = Path(__file__).parent / "results"


def build(path: str, args: argparse.Namespace) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=args.heads * args.head_dim,
        intermediate_size=2 * args.heads * args.head_dim,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        max_position_embeddings=max(args.lengths),
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval().to(device=args.device, dtype=getattr(torch, args.dtype))
    if path != "rope_sdpa":
        hf_posext.patch_model(model, "alibi", backend=path.removeprefix("alibi_"))
    return model


def available(path: str, args: argparse.Namespace) -> str | None:
    """Why ``path`` cannot run here, or None."""
    if path == "alibi_flash" and not (args.device == "cuda" and alibi_attention.flash_attn_available()):
        return "needs flash_attn on CUDA"
    if path == "alibi_flex" and not alibi_attention.flex_attention_available():
        return "needs torch.nn.attention.flex_attention"
    return None


def peak_bytes(run, device: str) -> int:
    """Peak bytes allocated above the starting point while ``run()`` executes."""
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        run()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - start
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    # Each op event carries the bytes it allocated (self), "[memory]" events carry the frees.
    changes = sorted(
        (event.time_range.start, event.self_cpu_memory_usage) for event in prof.events() if event.self_cpu_memory_usage
    )
    current = peak = 0
    for _, change in changes:
        current += change
        peak = max(peak, current)
    return peak


def measure(model, length: int, args: argparse.Namespace) -> dict[str, float]:
    ids = torch.randint(0, 256, (1, length), generator=torch.Generator().manual_seed(length)).to(args.device)

    def run():
        with torch.no_grad():
            model(ids, use_cache=False, logits_to_keep=1)

    def synced():
        run()
        if args.device == "cuda":
            torch.cuda.synchronize()

    synced()  # warm-up: compiles the flex path for this shape
    wall, cpu = [], []
    for _ in range(args.repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        synced()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return {
        "time_s": statistics.median(wall),
        "cpu_s": statistics.median(cpu),
        "peak_mib": peak_bytes(run, args.device) / 2**20,
    }


def clock(fn, repeats: int, device: str) -> float:
    """Median seconds of ``fn()`` after a warm-up call: CPU time on CPU (steadier on a shared machine)."""
    # The warm-up compiles flex for this shape.
    return statistics.median(Clock(device, cpu_time=None).repeat(fn, repeats, warm_up=1))


def kernel_rows(length: int, args: argparse.Namespace) -> list[dict]:
    """Attention alone at one layer's shapes: forward, and forward + backward where there is one."""
    generator = torch.Generator().manual_seed(length)
    dtype = getattr(torch, args.dtype)
    q, k, v = (
        torch.randn(1, heads, length, args.head_dim, generator=generator).to(args.device, dtype)
        for heads in (args.heads, args.kv_heads, args.kv_heads)
    )
    scale, gqa, module = args.head_dim**-0.5, args.heads != args.kv_heads, torch.nn.Module().eval()

    def sdpa_causal(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)

    kernels = {
        "sdpa_causal": (sdpa_causal, True),
        "folded": (lambda q, k, v: alibi_folded.folded_alibi(module, q, k, v, scale)[0], True),
    }
    if alibi_attention.flex_attention_available():
        block_mask = alibi_attention.flex_block_mask(
            1, length, length, 0, 0, masking_utils.causal_mask_function, None, args.device
        )
        flex = alibi_attention._flex_attention()
        groups = args.heads // args.kv_heads

        def flex_causal(q, k, v):
            # flex's GQA needs a power-of-two head count; repeat the keys otherwise, as flex_alibi does
            if gqa and args.heads & (args.heads - 1):
                k, v = alibi_attention._repeat_kv(k, groups), alibi_attention._repeat_kv(v, groups)
                return flex(q, k, v, block_mask=block_mask, scale=scale)
            return flex(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa)

        on_cuda = args.device == "cuda"  # no CPU backward for flex_attention
        kernels["flex_causal"] = (flex_causal, on_cuda)
        kernels["flex_alibi"] = (
            lambda q, k, v: alibi_attention.flex_alibi(module, q, k, v, block_mask, scale)[0],
            on_cuda,
        )
    rows = []
    for name in KERNELS:
        if name not in kernels:
            continue
        fn, has_backward = kernels[name]
        with torch.no_grad():
            row = {"kernel": name, "length": length, "forward_s": clock(lambda: fn(q, k, v), args.repeats, args.device)}
        if has_backward:
            inputs = [t.detach().requires_grad_() for t in (q, k, v)]
            row["train_s"] = clock(lambda: fn(*inputs).sum().backward(), args.repeats, args.device)
        rows.append(row)
    base = rows[0]
    for row in rows:
        row["forward_ratio"] = row["forward_s"] / base["forward_s"]
        if "train_s" in row:
            row["train_ratio"] = row["train_s"] / base["train_s"]
    return rows


def main(argv: list[str] | None = None) -> Results:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--memory-budget-gib", type=float, default=6.0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: PyTorch's)")
    parser.add_argument("--no-kernels", action="store_true", help="skip the attention-kernel table")
    parser.add_argument("--out", default=str(RESULTS / "alibi.json"), help="the results file")
    parser.add_argument("--resume", action="store_true", help="keep rows of a previous run with the same settings")
    args = parser.parse_args(argv)
    for length in args.lengths:
        if length < 1:
            parser.error(f"--lengths must be positive, got {length}")
    if args.heads % args.kv_heads:
        parser.error(f"--heads ({args.heads}) must be a multiple of --kv-heads ({args.kv_heads})")

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    ignored = ("out", "resume", "paths", "memory_budget_gib", "no_kernels", "lengths")
    results = Results(
        args.out,
        ["alibi", "alibi_kernels"],
        device=args.device,
        setting={k: v for k, v in vars(args).items() if k not in ignored},
        resume=args.resume,
    )
    done: dict[tuple[str, int], dict] = {}
    for row in results.rows:
        if row.benchmark == "alibi":
            done.setdefault((row.method, row.setting["length"]), {"path": row.method, "length": row.setting["length"]})
            done[row.method, row.setting["length"]][row.metric] = (
                row.extra["reason"] if row.metric == "status" else row.value
            )
    rows = []
    jobs = [(p, n) for p in args.paths for n in sorted(args.lengths)]
    over_budget: set[str] = set()
    models: dict[str, LlamaForCausalLM] = {}
    for path, length in tqdm(jobs, desc="bench_alibi"):
        if (path, length) in done:
            rows.append(done[(path, length)])
            continue
        reason = available(path, args)
        if reason is None and path in over_budget:
            reason = f"projected peak over {args.memory_budget_gib} GiB"
        if reason is not None:
            rows.append({"path": path, "length": length, "status": reason})
            continue
        if path not in models:
            models = {path: build(path, args)}  # one model at a time
        row = {"path": path, "length": length, **measure(models[path], length, args)}
        rows.append(row)
        if path in QUADRATIC and 4 * row["peak_mib"] > args.memory_budget_gib * 1024:
            over_budget.add(path)
        write(results, rows)
    kernels = []
    if not args.no_kernels:
        for length in tqdm(sorted(args.lengths), desc="kernels"):
            kernels += kernel_rows(length, args)
    write(results, rows, kernels)
    print(f"wrote {args.out}; `python scripts/tables.py` renders benchmarks/results/alibi.md from it")
    return results


def write(results: Results, rows: list[dict], kernels: list[dict] | None = None) -> None:
    """Every path's row (with its ratios to RoPE + SDPA at the same length) and kernel row, saved."""
    native = {r["length"]: r for r in rows if r["path"] == "rope_sdpa" and "time_s" in r}
    for row in rows:
        setting = {"length": row["length"]}
        if "status" in row:
            results.add(row["path"], "status", "skip", setting=setting, reason=row["status"])
            continue
        base = native.get(row["length"])
        if base is not None:
            # On a shared CPU the process's CPU time is steadier than wall time; ratios use it there.
            key = "cpu_s" if results.setting["device"] == "cpu" else "time_s"
            row["time_ratio"] = row[key] / base[key]
            row["memory_ratio"] = row["peak_mib"] / base["peak_mib"] if base["peak_mib"] else float("nan")
        results.add_all(row["path"], {k: v for k, v in row.items() if k not in ("path", "length")}, setting)
    for row in kernels or []:
        results.add_all(
            row["kernel"],
            {k: v for k, v in row.items() if k not in ("kernel", "length")},
            {"length": row["length"]},
            benchmark="alibi_kernels",
        )
    results.save()


if __name__ == "__main__":
    main()
