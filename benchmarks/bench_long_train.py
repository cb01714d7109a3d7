"""One long-sequence optimizer step: the fine-tune recipe against a plain transformers ``Trainer``.

The model has SmolLM2-135M's shape (Llama: 30 layers, hidden 576, 9 query / 3 KV heads of 64,
MLP 1536, vocabulary 49152, tied embeddings; random weights, nothing is downloaded), patched
with YaRN x4. Both sides train the same single block of text for one step with the same
settings: fp32, AdamW (0.9, 0.95), lr 2e-5, batch 1, SDPA, activation checkpointing. The
recipe computes its loss chunk-wise (``loss_chunk_size``); the Trainer calls the model with
``labels``, as every transformers training loop does, which materialises the fp32 logits.

Each (side, length) runs in a fresh subprocess. Reported per run: the peak resident set above
the process's resident set once every import is done (``peak_step_mib``: through the optimizer
step; ``peak_mib``: the whole run, the recipe's checkpoint writing included), the step time
(first forward to the end of the optimizer step) as tokens/s, and the step's loss, which must
agree. On a shared machine wall time depends on the other jobs, so the throughput ratio uses
the process's CPU time with one torch thread (``tokens_per_cpu_s``; the wall-time ratio is
reported too). The largest length that fits in 24 GiB is extrapolated from the longest measured
lengths (SDPA's CPU kernel keeps attention memory linear in the sequence): on the line through
the two longest, and as a lower bound from the longest alone (:func:`largest_fit`).

Both sides run with glibc's mmap threshold fixed at ``--mmap-threshold`` (1 MiB): every tensor of
1 MiB or more then comes from its own mapping and goes back to the system when freed, so the
resident peak follows the live tensors. Under glibc's default the threshold rises to the size of
each freed block up to 32 MiB, and freed blocks below it stay in the heap: measured that way the
recipe's step peaked higher at 8k tokens (4870 MiB, 18 MiB activations) than at 16k (2847 MiB,
36 MiB activations, above the 32 MiB ceiling), which says more about the allocator than the step.

    nice -n 19 python benchmarks/bench_long_train.py                     # 4k, 8k, 16k: ~1 h of CPU, one core
    python benchmarks/bench_long_train.py --lengths 4096 --resume        # add or redo lengths
    python benchmarks/bench_long_train.py --layers 2 --lengths 256 512 --out /tmp/x.json   # 1 min plumbing run

Writes rows (``result_schema.py``) to ``benchmarks/results/long_train.json`` after every run: per side
(``recipe``, ``trainer``) and length, each measurement above; per side, the estimates
``largest_fit_tokens`` (24 GiB) and, for an unmeasured 16k, ``peak_step_mib`` with ``extrapolated``.
``--resume`` keeps finished runs of the same settings.
"""

from __future__ import annotations

import argparse
import os
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import torch
import transformers.trainer  # noqa: F401  (loaded before the baseline, so both sides count the same imports)
from harness import ROOT, Results, emit_result, peak_rss_mib, rss_mib, run_child
from trainer_baseline import trainer_baseline
from transformers import LlamaConfig, LlamaForCausalLM

from hf_posext.testing import BOS_ID, EOS_ID, PAD_ID, byte_tokenizer
from hf_posext.train.config import TrainConfig
from hf_posext.train.loop import train

SIDES = ("recipe", "trainer")
BUDGET_MIB = 24 * 1024
FACTOR = 4


def prepare(args: argparse.Namespace, workdir: Path) -> None:
    """The random SmolLM2-135M-shaped checkpoint and one block of text per length."""
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=args.layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        max_position_embeddings=8192,
        rope_parameters={"rope_type": "default", "rope_theta": 100_000.0},
        tie_word_embeddings=True,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        rms_norm_eps=1e-5,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(workdir / "model")
    byte_tokenizer().save_pretrained(workdir / "model")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = "".join((stdlib / name).read_text() for name in ("typing.py", "argparse.py", "functools.py", "inspect.py"))
    for length in args.lengths:
        # Between one and two blocks of bytes: exactly one block, so both sides train the same tokens.
        (workdir / f"data{length}.txt").write_text(text[: length * 3 // 2])


def child(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    # Both sides import the same modules (at the top): what follows is what one step costs.
    baseline = rss_mib()
    workdir, length = Path(args.workdir), args.length
    data = str(workdir / f"data{length}.txt")
    stamps: dict[str, float] = {}

    def first_forward(module, inputs):
        if type(module).__name__ == "LlamaForCausalLM" and "start" not in stamps:
            stamps["start"], stamps["start_cpu"] = time.perf_counter(), time.process_time()

    def step_end():
        stamps.setdefault("end", time.perf_counter())
        stamps.setdefault("end_cpu", time.process_time())
        stamps.setdefault("peak_step_mib", peak_rss_mib() - baseline)

    hook = torch.nn.modules.module.register_module_forward_pre_hook(first_forward)
    if args.child == "recipe":
        result = train(
            TrainConfig(
                model=str(workdir / "model"),
                method="yarn",
                factor=FACTOR,
                dataset=[data],
                seq_len=length,
                output_dir=str(workdir / f"out-recipe-{length}"),
                max_train_steps=1,
                learning_rate=2e-5,
                warmup_steps=0,
                global_batch_size=1,
                micro_batch_size=1,
                mixed_precision="no",
                cache_dir=str(workdir / "cache"),
                activation_checkpointing=True,
                attn_implementation="sdpa",
                loss_chunk_size=args.loss_chunk_size,
            ),
            callbacks=[lambda progress: step_end()],
        )
        loss = result.final_loss
    else:
        trainer, _ = trainer_baseline(
            workdir,
            data,
            length,
            FACTOR,
            max_steps=1,
            warmup_steps=0,
            micro_batch=1,
            accumulation=1,
            logging_steps=1,
            on_step_end=step_end,
        )
        loss = trainer.train().training_loss
    hook.remove()
    report = {
        "baseline_mib": baseline,
        "peak_step_mib": stamps["peak_step_mib"],
        "peak_mib": peak_rss_mib() - baseline,
        "step_s": stamps["end"] - stamps["start"],
        "step_cpu_s": stamps["end_cpu"] - stamps["start_cpu"],
        "tokens_per_s": length / (stamps["end"] - stamps["start"]),
        "tokens_per_cpu_s": length / (stamps["end_cpu"] - stamps["start_cpu"]),
        "loss": loss,
    }
    emit_result(report)


def largest_fit(runs: dict[str, dict], side: str) -> dict | None:
    """The sequence length whose peak (baseline included) reaches 24 GiB.

    ``tokens``: by a line through the two longest measured lengths of ``side``. ``at_least_tokens``:
    a lower bound that holds whatever the shorter lengths say, if the step's memory is affine in the
    length with a non-negative intercept (SDPA keeps attention linear): then the step peak at
    ``L >= L_max`` is at most ``peak(L_max) L / L_max``. The line can be far too flat when the
    shorter lengths' peak is the optimizer step (weights, gradients, AdamW states: the same at
    every length) rather than the activations; the bound cannot.
    """
    points = sorted(
        (int(length), r["baseline_mib"], r["peak_step_mib"])
        for length, by_side in runs.items()
        for s, r in by_side.items()
        if s == side
    )
    if len(points) < 2:
        return None
    (t1, b1, p1), (t2, b2, p2) = points[-2:]
    slope = (p2 - p1) / (t2 - t1)
    line = int(t2 + (BUDGET_MIB - b2 - p2) / slope) if slope > 0 else None
    return {
        "tokens": line,
        "at_least_tokens": int(t2 * (BUDGET_MIB - b2) / p2),
        "mib_per_1k_tokens": slope * 1024,
        "extrapolated_from": [t1, t2],
    }


def extrapolated_peak(runs: dict[str, dict], side: str, length: int) -> float | None:
    """``peak_step_mib`` of ``side`` at an unmeasured ``length``, on the line through its two longest runs."""
    points = sorted((int(t), by_side[side]["peak_step_mib"]) for t, by_side in runs.items() if side in by_side)
    if len(points) < 2:
        return None
    (t1, m1), (t2, m2) = points[-2:]
    return m2 + (length - t2) * (m2 - m1) / (t2 - t1)


def add_estimates(results: Results, runs: dict[str, dict]) -> None:
    """The rows of the 24 GiB fit and, when 16k is not measured, its extrapolated step peaks."""
    results.discard(lambda row: row.metric == "largest_fit_tokens" or bool(row.setting.get("extrapolated")))
    for length in (16384,):
        if not set(SIDES) <= set(runs.get(str(length), {})):
            for side in SIDES:
                peak = extrapolated_peak(runs, side, length)
                if peak is not None:
                    results.add(side, "peak_step_mib", peak, setting={"tokens": length, "extrapolated": True})
    for side in SIDES:
        fit = largest_fit(runs, side)
        if fit:
            results.add(
                side,
                "largest_fit_tokens",
                fit["tokens"],
                "tokens",
                {"budget_gib": BUDGET_MIB // 1024},
                **{k: v for k, v in fit.items() if k != "tokens"},
            )


def previous_runs(results: Results) -> dict[str, dict]:
    """``{length: {side: measurements}}`` of the rows ``--resume`` keeps; they must have this run's settings."""
    if results.stale:
        raise SystemExit(
            f"--resume: {results.path} was measured with {results.stale[0].setting}, not {results.setting}"
        )
    runs: dict[str, dict] = {}
    for row in results.rows:
        if "tokens" in row.setting and not row.setting.get("extrapolated"):
            runs.setdefault(str(row.setting["tokens"]), {}).setdefault(row.method, {})[row.metric] = row.value
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384])
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads of each run (1: CPU time that other jobs do not skew)",
    )
    parser.add_argument("--loss-chunk-size", type=int, default=1024)
    parser.add_argument(
        "--mmap-threshold",
        type=int,
        default=1 << 20,
        help="glibc's MALLOC_MMAP_THRESHOLD_ in both sides' processes, bytes (0: glibc's dynamic default)",
    )
    parser.add_argument("--resume", action="store_true", help="keep the runs already in --out")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "long_train.json"))
    parser.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return

    setup = {k: v for k, v in vars(args).items() if k in ("layers", "threads", "loss_chunk_size", "mmap_threshold")}
    setup.update(
        model="SmolLM2-135M-shaped Llama, random weights, tied embeddings",
        rope=f"yarn x{FACTOR}",
        precision="fp32",
        activation_checkpointing=True,
        batch=1,
        cpu_count=os.cpu_count(),
    )
    results = Results(args.out, "long_train", setting=setup, resume=args.resume)
    runs = previous_runs(results)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        prepare(args, workdir)
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_POSEXT_CACHE": str(workdir / "cache")}
        if args.mmap_threshold:
            env["MALLOC_MMAP_THRESHOLD_"] = str(args.mmap_threshold)
        for length in args.lengths:
            for side in SIDES:
                if side in runs.get(str(length), {}):
                    continue
                print(f"{side} at {length} tokens ...", flush=True)
                command = [
                    sys.executable,
                    __file__,
                    f"--child={side}",
                    f"--workdir={workdir}",
                    f"--length={length}",
                    f"--threads={args.threads}",
                    f"--loss-chunk-size={args.loss_chunk_size}",
                ]
                try:
                    runs.setdefault(str(length), {})[side] = run_child(command, env=env)
                except RuntimeError as error:
                    raise SystemExit(f"{side} at {length} tokens failed: {error}") from None
                print(f"  {runs[str(length)][side]}", flush=True)
                results.add_all(side, runs[str(length)][side], {"tokens": length})
                add_estimates(results, runs)
                results.save()

    print(f"{'tokens':>7} {'side':8} {'peak MiB':>9} {'tokens/s':>9} {'loss':>9}")
    for length, by_side in sorted(runs.items(), key=lambda item: int(item[0])):
        for side, r in by_side.items():
            print(f"{length:>7} {side:8} {r['peak_step_mib']:9.0f} {r['tokens_per_s']:9.1f} {r['loss']:9.5f}")
        if set(by_side) == set(SIDES):
            recipe, trainer = by_side["recipe"], by_side["trainer"]
            print(
                f"{length:>7}: memory recipe/Trainer {recipe['peak_step_mib'] / trainer['peak_step_mib']:.3f} "
                f"(goal <= 0.6 at 16k), throughput {recipe['tokens_per_cpu_s'] / trainer['tokens_per_cpu_s']:.3f} "
                f"(goal >= 1), |loss difference| {abs(recipe['loss'] - trainer['loss']):.2e}"
            )
    for side in SIDES:
        fit = largest_fit(runs, side)
        if fit:
            print(
                f"{side}: one step fits in 24 GiB up to ~{fit['tokens']} tokens on the line through "
                f"{fit['extrapolated_from']}, and at least {fit['at_least_tokens']} (extrapolated)"
            )
    print(f"wrote {args.out}; `python scripts/tables.py` renders the docs' table")


if __name__ == "__main__":
    main()
