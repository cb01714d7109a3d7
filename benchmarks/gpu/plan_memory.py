"""``hf-posext plan`` against ``torch.cuda.max_memory_allocated`` on a GPU (issue 60; not yet run on one).

benchmarks/plan_memory.py checks the plan against the peak resident set on CPU; this is the same check on
CUDA, where the peak the plan must predict is the caching allocator's. Each run trains SmolLM2-135M's shape
(random weights, ``hidden 576``, 30 layers, vocabulary 49152) with the recipe itself
(:func:`hf_posext.train.loop.train`, YaRN x16, bf16 autocast, activation checkpointing, the chunked loss,
AdamW) for two optimizer steps, full and LoRA, at each length, in a process of its own (so one run's cache
does not count in the next); rows go to ``$OUT/plan_memory.json`` (``result_schema.py``): measured and
predicted peak (MiB) and their error.

    python benchmarks/gpu/plan_memory.py --out "$OUT/plan_memory"                       # on the GPU (~2 min)
    python benchmarks/gpu/plan_memory.py --cpu-smoke --out /tmp/plan_memory_smoke       # plumbing, here
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from harness import current_versions, device_name, now  # noqa: E402
from result_schema import Row, write_rows  # noqa: E402

SMOLLM2 = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    max_position_embeddings=8192,
    tie_word_embeddings=True,
)
TINY = dict(
    SMOLLM2,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    max_position_embeddings=64,
)
MIB = 2**20


def run_settings(workdir: Path, model: dict, length: int, lora: bool, device: str) -> dict:
    return dict(
        model=str(workdir / "model"),
        method="yarn",
        factor=16,
        dataset=[str(workdir / "data.txt")],
        seq_len=length,
        output_dir=str(workdir / f"out-{length}-{lora}"),
        overwrite=True,
        max_train_steps=2,
        learning_rate=1e-4,
        warmup_steps=0,
        global_batch_size=1,
        micro_batch_size=1,
        mixed_precision="bf16" if device == "cuda" else "no",
        cache_dir=str(workdir / "cache"),
        lora=lora,
    )


def prepare(workdir: Path, model: dict, longest: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from hf_posext.testing import BOS_ID, EOS_ID, PAD_ID, byte_tokenizer

    config = LlamaConfig(
        **model,
        rope_parameters={"rope_type": "default", "rope_theta": 100_000.0},
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(workdir / "model")
    byte_tokenizer().save_pretrained(workdir / "model")
    text = Path(json.__file__).read_text()
    (workdir / "data.txt").write_text((text * (longest * 8 // len(text) + 1))[: longest * 8])


def child(values: dict, device: str) -> None:
    """One run in this process; prints its peak (MiB) as the last line."""
    import resource

    import torch

    from hf_posext.train.config import TrainConfig
    from hf_posext.train.loop import train

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    train(TrainConfig(**values))
    peak = (
        torch.cuda.max_memory_allocated() / MIB
        if device == "cuda"
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    )
    print(json.dumps({"peak_mib": peak}))


def predict(model: dict, values: dict, device: str) -> float:
    from hf_posext.train.config import TrainConfig
    from hf_posext.train.memory import Layout, ModelShape, estimate_memory

    shape = ModelShape.from_config(dict(model, model_type="llama"), "benchmark model")
    layout = Layout(1, "ddp", device, bf16=device == "cuda")
    return estimate_memory(shape, TrainConfig(**values), layout).peak_bytes / MIB


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384, 65536])
    parser.add_argument("--cpu-smoke", action="store_true", help="a tiny model at 256 tokens on the CPU")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child), args.device)
        return 0
    device, model = ("cpu", TINY) if args.cpu_smoke else ("cuda", SMOLLM2)
    lengths = [256] if args.cpu_smoke else args.lengths
    args.out.mkdir(parents=True, exist_ok=True)
    started, rows = time.perf_counter(), []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        prepare(workdir, model, max(lengths))
        for length in lengths:
            for lora in (False, True):
                values = run_settings(workdir, model, length, lora, device)
                done = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--out",
                        str(args.out),
                        "--child",
                        json.dumps(values),
                        "--device",
                        device,
                    ],
                    capture_output=True,
                    text=True,
                    timeout=900,
                )
                if done.returncode != 0:
                    print(done.stderr[-2000:], file=sys.stderr)
                    continue
                measured = json.loads(done.stdout.strip().splitlines()[-1])["peak_mib"]
                predicted = predict(model, values, device)
                setting = {"tokens": length, "processes": 1, "mode": "cpu-smoke" if args.cpu_smoke else "gpu"}
                mode = "lora" if lora else "full"
                for metric, value in (
                    ("measured_peak_mib", measured),
                    ("predicted_peak_mib", predicted),
                    ("error", predicted / measured - 1),
                ):
                    rows.append(
                        Row(
                            "plan_memory_gpu",
                            mode,
                            setting,
                            metric,
                            round(value, 4),
                            "MiB" if "mib" in metric else "ratio",
                            device_name(device),
                            current_versions(),
                            now(),
                        )
                    )
                error = predicted / measured - 1
                print(f"{mode} {length}: measured {measured:.0f} MiB, plan {predicted:.0f} ({error:+.1%})")
    mode = {"mode": "cpu-smoke" if args.cpu_smoke else "gpu", "part": "total"}
    rows.append(
        Row(
            "plan_memory_gpu",
            "run",
            mode,
            "wall_s",
            round(time.perf_counter() - started, 1),
            "s",
            device_name(device),
            current_versions(),
            now(),
        )
    )
    write_rows(args.out / "plan_memory.json", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
