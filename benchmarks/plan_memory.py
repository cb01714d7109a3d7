"""``hf-posext plan`` checked against measurement: the peak resident set of real fine-tune steps on CPU.

Each run trains a random model of SmolLM2's family (Llama, tied embeddings, vocabulary 49152; hidden
256, 2 layers, 4 query / 2 KV heads of 64, MLP 768: small enough for 16k tokens on a shared CPU) with
the recipe itself (:func:`hf_posext.train.loop.train`, YaRN x16, fp32, activation checkpointing, the
chunked loss, AdamW) for two optimizer steps, so that AdamW's moments exist through a whole step as they
do in every later one. One process runs as ``hf-posext finetune`` would; two run under ``accelerate launch
--config_file examples/accelerate/fsdp2.yaml --num_processes 2`` (FSDP2 over gloo, the recipe's own path,
as tests/train/test_fsdp2.py launches it). Measured: each process's peak resident set (``ru_maxrss``)
through the last step, the largest over the processes; predicted: :func:`hf_posext.train.memory.estimate_memory`
for the same settings (``hf-posext plan ... --processes N --json``'s ``peak_bytes``). Every process runs
with glibc's mmap threshold at 1 MiB (as benchmarks/bench_long_train.py explains: otherwise freed blocks stay
in the heap and the resident set says more about the allocator than about the step).

Rows (``result_schema.py``) go to ``benchmarks/results/plan_memory.json`` after every run: per (lora|full,
processes, length) ``measured_peak_mib``, ``predicted_peak_mib``, ``error`` (predicted / measured - 1) and
the baseline; the plot to ``benchmarks/results/plan_memory.png``.

    nice -n 5 python benchmarks/plan_memory.py                  # the sweep: 20 runs, ~20 min on 2 cores
    python benchmarks/plan_memory.py --resume                   # keep the runs measured, redo the predictions
    python benchmarks/plan_memory.py --lengths 512 --processes 1 --out /tmp/x.json   # a 1-minute plumbing run
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

from harness import ROOT, Results, emit_result, rss_mib, run_child

MODEL = dict(
    vocab_size=49152,
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=1024,
    tie_word_embeddings=True,
)
FACTOR = 16
STEPS = 2
MIB = 2**20
ACCELERATE = shutil.which("accelerate", path=os.path.dirname(sys.executable))


def settings(workdir: Path, length: int, lora: bool, processes: int) -> dict:
    """The run's TrainConfig values (``hf-posext finetune``'s flags)."""
    return dict(
        model=str(workdir / "model"),
        method="yarn",
        factor=FACTOR,
        dataset=[str(workdir / "data.txt")],
        seq_len=length,
        output_dir=str(workdir / f"out-{length}-{lora}-{processes}"),
        overwrite=True,
        max_train_steps=STEPS,
        learning_rate=1e-4,
        warmup_steps=0,
        global_batch_size=processes,
        micro_batch_size=1,
        mixed_precision="no",
        cache_dir=str(workdir / "cache"),
        lora=lora,
    )


def prepare(workdir: Path, lengths: list[int]) -> None:
    """The random checkpoint with the byte tokenizer, and text for every run's blocks."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from hf_posext.testing import BOS_ID, EOS_ID, PAD_ID, byte_tokenizer

    config = LlamaConfig(
        **MODEL,
        rope_parameters={"rope_type": "default", "rope_theta": 100_000.0},
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(workdir / "model")
    byte_tokenizer().save_pretrained(workdir / "model")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = "".join(path.read_text() for path in sorted(stdlib.glob("*.py"))[:80])
    needed = max(lengths) * 2 * STEPS * 2  # two processes' blocks for every step, twice over
    (workdir / "data.txt").write_text((text * (needed // len(text) + 1))[:needed])


def child(args: argparse.Namespace) -> None:
    """One process of a run: train, then report its resident set (each rank writes its own file)."""
    import torch

    from hf_posext.train.config import TrainConfig
    from hf_posext.train.loop import train

    torch.set_num_threads(1)
    baseline = rss_mib()
    peaks: dict[str, float] = {}

    def at_step(progress) -> None:
        peaks[f"step_{progress.step}"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    values = json.loads(args.child)
    train(TrainConfig(**values), callbacks=[at_step])
    rank = int(os.environ.get("RANK", "0"))
    report = {"baseline_mib": baseline, "peak_mib": peaks[f"step_{STEPS}"], **peaks}
    Path(values["output_dir"], f"memory-rank{rank}.json").write_text(json.dumps(report))
    emit_result(report)


def measure(workdir: Path, length: int, lora: bool, processes: int) -> dict:
    """The run's peak over its processes (MiB)."""
    values = settings(workdir, length, lora, processes)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": str(MIB)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    me = [str(Path(__file__).resolve()), "--child", json.dumps(values)]
    if processes == 1:
        command = [sys.executable, *me]
    else:
        config = str(ROOT / "examples" / "accelerate" / "fsdp2.yaml")
        command = [ACCELERATE, "launch", "--config_file", config, "--num_processes", str(processes), *me]
    run_child(command, env=env, timeout=3600)
    reports = [json.loads(p.read_text()) for p in Path(values["output_dir"]).glob("memory-rank*.json")]
    if len(reports) != processes:
        raise SystemExit(f"{len(reports)} of {processes} processes reported their memory")
    worst = max(reports, key=lambda r: r["peak_mib"])
    return {"measured_peak_mib": worst["peak_mib"], "baseline_mib": worst["baseline_mib"], "ranks": reports}


def predict(length: int, lora: bool, processes: int) -> tuple[float, dict]:
    """``hf-posext plan``'s peak for the run (MiB) and its terms."""
    from hf_posext.train.config import TrainConfig
    from hf_posext.train.memory import Layout, ModelShape, estimate_memory

    shape = ModelShape.from_config(dict(MODEL, model_type="llama"), "benchmark model")
    config = TrainConfig(**settings(Path("/nonexistent"), length, lora, processes))
    layout = Layout(processes, "fsdp2" if processes > 1 else "ddp", "cpu", bf16=False)
    estimate = estimate_memory(shape, config, layout)
    return estimate.peak_bytes / MIB, {k: round(v / MIB, 1) for k, v in {**estimate.terms, **estimate.moments}.items()}


def plot(results: Results, path: Path) -> None:
    """Predicted against measured peak, one marker per run, the 20% band shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points: dict[tuple, dict] = {}
    for row in results.rows:
        key = (row.method, row.setting["processes"], row.setting["tokens"])
        points.setdefault(key, {})[row.metric] = row.value
    fig, ax = plt.subplots(figsize=(6, 5))
    for (method, processes), marker in {("full", 1): "o", ("lora", 1): "s", ("full", 2): "^", ("lora", 2): "D"}.items():
        pts = [
            (p["measured_peak_mib"], p["predicted_peak_mib"], k[2])
            for k, p in points.items()
            if k[:2] == (method, processes) and "measured_peak_mib" in p
        ]
        if pts:
            ax.scatter(
                [p[0] for p in pts], [p[1] for p in pts], marker=marker, label=f"{method}, {processes} process(es)"
            )
    top = max(max(p.get("measured_peak_mib", 0), p.get("predicted_peak_mib", 0)) for p in points.values()) * 1.1
    line = [0, top]
    ax.plot(line, line, color="black", lw=0.8)
    ax.fill_between(line, [0.8 * x for x in line], [1.2 * x for x in line], color="grey", alpha=0.2, label="within 20%")
    ax.set(
        xlabel="measured peak resident set per process (MiB)",
        ylabel="hf-posext plan's peak (MiB)",
        xlim=(0, top),
        ylim=(0, top),
    )
    ax.set_title("hf-posext plan vs measurement, CPU, 1k-16k tokens")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--modes", nargs="+", choices=("full", "lora"), default=["full", "lora"])
    parser.add_argument("--resume", action="store_true", help="keep the runs already measured in --out")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "plan_memory.json"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    setup = {
        "model": "SmolLM2-family Llama, hidden 256, 2 layers, vocabulary 49152, tied, random weights",
        "precision": "fp32",
        "steps": STEPS,
        "threads": 1,
        "mmap_threshold": MIB,
    }
    results = Results(args.out, "plan_memory", setting=setup, resume=args.resume)
    measured = {
        (r.method, r.setting["processes"], r.setting["tokens"]): r
        for r in results.rows
        if r.metric == "measured_peak_mib"
    }
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        prepare(workdir, args.lengths)
        for processes in args.processes:
            for mode in args.modes:
                for length in args.lengths:
                    key = (mode, processes, length)
                    setting = {
                        "processes": processes,
                        "tokens": length,
                        "strategy": "fsdp2" if processes > 1 else "one process",
                    }
                    predicted, terms = predict(length, mode == "lora", processes)
                    if key in measured:
                        value, baseline = measured[key].value, measured[key].extra["baseline_mib"]
                    else:
                        print(f"{mode}, {processes} process(es), {length} tokens ...", flush=True)
                        run = measure(workdir, length, mode == "lora", processes)
                        value, baseline = run["measured_peak_mib"], run["baseline_mib"]
                        results.add(
                            mode, "measured_peak_mib", value, "MiB", setting, baseline_mib=baseline, ranks=run["ranks"]
                        )
                    results.add(mode, "predicted_peak_mib", round(predicted, 1), "MiB", setting, **terms)
                    results.add(mode, "error", round(predicted / value - 1, 4), "ratio", setting)
                    error = predicted / value - 1
                    print(f"  {mode:4} x{processes} {length:6}: {value:7.0f} MiB, plan {predicted:7.0f} ({error:+.1%})")
                    results.save()
    plot(results, Path(args.out).with_suffix(".png"))


if __name__ == "__main__":
    main()
