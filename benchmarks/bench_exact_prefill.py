"""Memory and time of an exact-cache prefill past L_orig whose rows share one frequency set, in blocks or whole.

The exact cache (hf_posext.attention.exact_dynamic) sends the prompt rows that share one frequency set
to the kernel as one call: LongRoPE's rows past L_orig (its long factors, ``factors_by="query"``), YaRN's rows from
saturation (``factor * L_orig``) on. Whole, such a call's ``[rows, keys]`` mask was built in the
query dtype (24k x 32k elements for a 32k LongRoPE prompt at L_orig 8k: 3 GiB of fp32); now the rows
go in blocks within ``CALL_MASK_BUDGET`` mask elements
(:func:`~hf_posext.attention.exact_dynamic.attention.call_blocks`).
Three rows per method and prompt length, each forward in a process of its own (a process's peak
resident set cannot be reset), one torch thread, CPU time:

* ``blocks``: the exact cache as shipped;
* ``whole``: the same with the budget set past any call (every call one block: the code before blocks);
* ``transformers``: transformers' own path (``exact_cache=False``: one frequency set per forward).

``peak_mib`` is the forward's peak resident set above the process's before it (the model and the
prompt built); ratios are against ``transformers`` and ``whole`` of the same run. The forwards'
logits are compared: ``blocks`` and ``whole`` must agree to fp32 rounding.

    python benchmarks/bench_exact_prefill.py --out benchmarks/results/exact_prefill.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Results, child_env, emit_result, peak_rss_mib, run_child  # noqa: E402

MODES = ("blocks", "whole", "transformers")


def child(args: argparse.Namespace) -> None:
    """One forward of one configuration: emit its CPU seconds, its peak above the start, and save its logits."""
    import time

    import torch
    from bench_dynamic_decode import build  # imports torch and transformers: the child's, not the parent's

    import hf_posext
    from hf_posext.attention.exact_dynamic import attention

    torch.set_num_threads(1)
    if args.mode == "whole":
        attention.CALL_MASK_BUDGET = attention.ACCELERATOR_CALL_MASK_BUDGET = 1 << 62
    elif args.budget is not None:
        attention.CALL_MASK_BUDGET = args.budget
    blocks = []
    split = attention.call_blocks
    attention.call_blocks = lambda *call: blocks.extend(split(*call)) or split(*call)  # counted
    model = build(argparse.Namespace(**vars(args), checkpoint=None, dtype="float32", device="cpu"))
    exact = args.mode != "transformers"
    # LongRoPE's exact kernel is its per-query definition (the default rotates with transformers' own module)
    query = {"factors_by": "query"} if exact and args.method == "longrope" else {}
    hf_posext.patch_model(model, args.method, factor=args.factor, exact_cache=exact, **query)
    prompt = torch.randint(0, args.vocab, (1, args.tokens), generator=torch.Generator().manual_seed(1))
    before = peak_rss_mib()
    with torch.inference_mode():
        start = time.process_time()
        logits = model(prompt, use_cache=False).logits
        seconds = time.process_time() - start
    torch.save(logits[0, -args.compare :], args.logits)
    emit_result({"seconds": seconds, "peak_mib": peak_rss_mib() - before, "kernel_calls": len(blocks)})


def measure(args: argparse.Namespace, method: str, tokens: int, mode: str, logits: Path) -> dict[str, float]:
    command = [sys.executable, __file__, "--child", "--method", method, "--tokens", str(tokens), "--mode", mode]
    command += ["--logits", str(logits)]
    for name in ("hidden", "heads", "kv_heads", "layers", "vocab", "original_length", "factor", "attention", "compare"):
        command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    if args.budget is not None:
        command += ["--budget", str(args.budget)]
    return run_child(command, env=child_env(OMP_NUM_THREADS="1"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=["longrope", "dynamic_yarn"])
    parser.add_argument("--multiples", type=int, nargs="+", default=[4, 8], help="prompt lengths in L_orig")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--original-length", type=int, default=1024, help="L_orig")
    parser.add_argument("--factor", type=float, default=4.0, help="YaRN saturates at factor x L_orig")
    parser.add_argument("--attention", default="sdpa", choices=("sdpa", "eager"))
    parser.add_argument("--compare", type=int, default=64, help="the last rows' logits compared between modes")
    parser.add_argument("--budget", type=int, help="CALL_MASK_BUDGET of the blocks row (default: as shipped)")
    parser.add_argument("--out", type=Path, help="results file (rows of result_schema.py)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--method", help=argparse.SUPPRESS)
    parser.add_argument("--tokens", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--logits", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return 0
    import torch

    shape = ("hidden", "heads", "kv_heads", "layers", "original_length", "budget")
    setting = {key: getattr(args, key) for key in shape}
    results = Results(
        args.out, "exact_prefill", setting={**setting, "factor": args.factor, "attention": args.attention, "threads": 1}
    )
    with tempfile.TemporaryDirectory() as scratch:
        for method in args.methods:
            for multiple in args.multiples:
                tokens = multiple * args.original_length
                found = {}
                for mode in MODES:
                    found[mode] = measure(args, method, tokens, mode, Path(scratch) / f"{mode}.pt")
                    found[mode]["logits"] = torch.load(Path(scratch) / f"{mode}.pt")
                difference = float((found["blocks"]["logits"] - found["whole"]["logits"]).abs().max())
                if difference > 1e-4:
                    raise SystemExit(f"{method} at {tokens}: blocks and whole differ by {difference:.3g} in the logits")
                where = {"tokens": tokens, "multiple_of_original": multiple}
                for mode in MODES:
                    results.add(f"{method} {mode}", "prefill_s", found[mode]["seconds"], "s", where)
                    results.add(f"{method} {mode}", "peak_mib", found[mode]["peak_mib"], "MiB", where)
                    if mode != "transformers":  # the exact cache's kernel calls for rows sharing frequencies
                        results.add(f"{method} {mode}", "kernel_calls", found[mode]["kernel_calls"], "", where)
                for against in ("whole", "transformers"):
                    for metric in ("seconds", "peak_mib"):
                        name = "time_ratio" if metric == "seconds" else "memory_ratio"
                        ratio = found["blocks"][metric] / max(found[against][metric], 1e-9)
                        results.add(f"{method} blocks / {against}", name, ratio, "x", where)
                results.add(f"{method} blocks / whole", "max_logit_difference", difference, "", where)
                print(
                    f"{method:13s} {tokens:6d} tokens: "
                    + ", ".join(f"{m} {found[m]['seconds']:6.2f} s {found[m]['peak_mib']:7.0f} MiB" for m in MODES),
                    flush=True,
                )
    if args.out:
        results.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
