"""Throughput and peak memory of the fine-tune recipe against a plain transformers ``Trainer``.

Both fine-tune the same YaRN-patched model on the same blocks of the same data with the same
settings (fp32, AdamW betas (0.9, 0.95), linear schedule, micro-batch, gradient accumulation,
activation checkpointing); only the training loop differs. Each measured run is its own
subprocess, so peak memory (the peak resident set above Python + torch, each approach's own
imports included) is not polluted by the other; runs alternate recipe/Trainer and the median of the
repeats is reported as ratios from one invocation (throughput: recipe / Trainer, target >= 1;
memory: recipe / Trainer, target <= 1). Tokens/s counts the steps after the first (warm-up).

    python benchmarks/bench_train.py                       # ~3 min on 2 CPU cores
    python benchmarks/bench_train.py --repeats 1 --steps 4 # quick look
    python benchmarks/bench_train.py --threads 2 --seq-len 2048

Writes rows (``result_schema.py``) to ``benchmarks/results/bench_train.json``: per side (``recipe``,
``trainer``), ``tokens_per_s`` and ``peak_mib``, each the median of the repeats (listed in ``extra``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from harness import ROOT, Results, emit_result, peak_rss_mib, rss_mib, run_child
from tqdm.auto import tqdm


# hf_posext, transformers and torch are imported inside functions on purpose: each measured child
# process counts the memory of its own approach's imports and not the other's.


def run_recipe(args: argparse.Namespace, workdir: Path) -> dict:
    from hf_posext.train.config import TrainConfig
    from hf_posext.train.loop import train

    stamps: list[float] = []
    train(
        TrainConfig(
            model=str(workdir / "model"),
            method="yarn",
            factor=args.factor,
            dataset=[str(workdir / "data.txt")],
            output_dir=str(workdir / "out-recipe"),
            max_train_steps=args.steps,
            learning_rate=2e-5,
            warmup_steps=1,
            global_batch_size=args.global_batch,
            micro_batch_size=args.micro_batch,
            mixed_precision="no",
            cache_dir=str(workdir / "cache"),
            activation_checkpointing=True,
            attn_implementation="sdpa",
        ),
        callbacks=[lambda progress: stamps.append(time.perf_counter())],
    )
    return {"stamps": stamps}


def run_trainer(args: argparse.Namespace, workdir: Path) -> dict:
    from trainer_baseline import trainer_baseline

    stamps: list[float] = []
    trainer, tokenizer = trainer_baseline(
        workdir,
        str(workdir / "data.txt"),
        args.seq_len,
        args.factor,
        max_steps=args.steps,
        warmup_steps=1,
        micro_batch=args.micro_batch,
        accumulation=args.global_batch // args.micro_batch,
        logging_steps=10**6,
        on_step_end=lambda: stamps.append(time.perf_counter()),
    )
    trainer.train()
    # The recipe's run includes writing the final checkpoint, so the baseline's does too.
    trainer.save_model(str(workdir / "out-trainer" / "final"))
    tokenizer.save_pretrained(str(workdir / "out-trainer" / "final"))
    return {"stamps": stamps}


def child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    # The common starting point: Python and torch. Everything after, each approach's own imports
    # included, is what fine-tuning with it costs.
    start_rss = rss_mib()
    workdir = Path(args.workdir)
    result = (run_recipe if args.child == "recipe" else run_trainer)(args, workdir)
    result["peak_mib"] = peak_rss_mib() - start_rss
    stamps = result["stamps"]
    tokens_per_step = args.global_batch * args.seq_len
    result["tokens_per_s"] = tokens_per_step * (len(stamps) - 1) / (stamps[-1] - stamps[0])
    emit_result({k: v for k, v in result.items() if k != "stamps"})


def prepare(args: argparse.Namespace, workdir: Path) -> None:
    from hf_posext.testing import make_tiny_model

    make_tiny_model(
        workdir / "model",
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=args.hidden // 32,
        num_kv_heads=max(1, args.hidden // 64),
        max_position_embeddings=args.seq_len // args.factor,
    )
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = "".join((stdlib / name).read_text() for name in ("typing.py", "argparse.py", "functools.py"))
    (workdir / "data.txt").write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--factor", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--global-batch", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads of each run")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_train.json"))
    parser.add_argument("--child", choices=["recipe", "trainer"], help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        prepare(args, workdir)
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_POSEXT_CACHE": str(workdir / "cache")}
        passthrough = [
            f"--{k.replace('_', '-')}={v}"
            for k, v in vars(args).items()
            if k not in ("child", "workdir", "out", "repeats")
        ]
        runs: dict[str, list[dict]] = {"recipe": [], "trainer": []}
        order = ["recipe", "trainer"] * args.repeats
        for name in tqdm(order, desc="runs"):
            try:
                runs[name].append(
                    run_child(
                        [sys.executable, __file__, f"--child={name}", f"--workdir={workdir}", *passthrough], env=env
                    )
                )
            except RuntimeError as error:
                raise SystemExit(f"{name} run failed: {error}") from None

    summary = {
        name: {
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in rs),
            "peak_mib": statistics.median(r["peak_mib"] for r in rs),
        }
        for name, rs in runs.items()
    }
    results = Results(
        args.out, "bench_train", setting={k: v for k, v in vars(args).items() if k not in ("child", "workdir", "out")}
    )
    for name, values in summary.items():
        for metric, value in values.items():
            results.add(name, metric, value, statistic="median of the repeats", repeats=[r[metric] for r in runs[name]])
    results.save()
    print(f"{'':10} {'tokens/s':>10} {'peak MiB':>10}")
    for name, values in summary.items():
        print(f"{name:10} {values['tokens_per_s']:10.0f} {values['peak_mib']:10.1f}")
    print(
        f"throughput recipe/Trainer = {summary['recipe']['tokens_per_s'] / summary['trainer']['tokens_per_s']:.3f} "
        "(target >= 1)"
    )
    print(
        f"peak memory recipe/Trainer = {summary['recipe']['peak_mib'] / summary['trainer']['peak_mib']:.3f} "
        "(target <= 1)"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
