"""The shipped accelerate configs, launched as shipped on the GPUs there are, each against one process.

NOT YET RUN ON A GPU (issue 47 item 6: written on a CPU machine; its ``--cpu-smoke`` ran there).
With N = ``torch.cuda.device_count()`` processes (1 or 8), one tiny Llama (8 heads, 4 layers, fp32
so that runs compare tightly), the same global batch of 8 everywhere:

* ``baseline``: ``single_gpu.yaml``, 1 process, 8 accumulation steps (and one with ``--lora``);
* ``ddp``: ``ddp.yaml``; ``fsdp2``: ``fsdp2.yaml`` with a training state at step 2, then
  ``fsdp2_resumed`` from it (its losses must equal the uninterrupted run's bit for bit);
  ``fsdp2_lora``: ``fsdp2.yaml --lora`` against the LoRA baseline;
* ``ulysses``: ``deepspeed_ulysses.yaml --sp-size N`` (N >= 2, deepspeed installed);
  ``context_parallel``: ``context_parallel.yaml`` (its cp_size is 8: N = 8 only, SDPA);
  ``zero3``: ``deepspeed_zero3.yaml`` (deepspeed installed).

Each item is a row (``result_schema.py``) of its status (``ok``/``skip``/``FAIL`` with the reason), its
largest loss difference to the baseline (``max_loss_diff``, pass under 1e-3 in fp32: reduction order
and TF32-free cuBLAS differ) and its seconds, in ``OUT/many_gpus.json``:

    python benchmarks/gpu/many_gpus.py --out $OUT/many_gpus              # 1 or 8 GPUs, ~5 min
    python benchmarks/gpu/many_gpus.py --cpu-smoke --out /tmp/many      # 2 CPU processes (gloo): DDP and
                                                                        # FSDP2 run, the rest are refused
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from common import ROOT, Report, add_common_arguments, pick_device

CONFIGS = ROOT / "examples" / "accelerate"
TOLERANCE = 1e-3


def launch(config: str, processes: int, flags: list[str], log: Path) -> subprocess.CompletedProcess:
    """``accelerate launch --config_file examples/accelerate/<config> --num_processes N -m <the recipe> FLAGS``."""
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / config)]
    command += ["--num_processes", str(processes), "-m", "hf_posext.commands.finetune", *flags]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    log.write_text(done.stdout + done.stderr)
    return done


def losses(folder: Path) -> list[float]:
    return json.loads((folder / "train_results.json").read_text())["losses"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser, "hf_posext_out/many_gpus")
    args = parser.parse_args(argv)
    device = pick_device(args)
    import torch

    processes = 2 if args.cpu_smoke else torch.cuda.device_count()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from hf_posext.testing import make_tiny_model

    # 8 query and key/value heads: sequence parallelism over 8 GPUs hands each one head
    model = make_tiny_model(
        out / "tiny-llama", hidden_size=128, num_layers=4, num_heads=8, num_kv_heads=8, max_position_embeddings=64
    )
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    data = out / "data.txt"
    data.write_text("".join((stdlib / name).read_text() for name in ("textwrap.py", "glob.py", "string.py")))
    common = ["--model", str(model), "--dataset", str(data), "--method", "yarn", "--factor", "2"]
    common += ["--max-train-steps", "4", "--global-batch-size", "8", "--micro-batch-size", "1", "--seed", "3"]
    common += ["--mixed-precision", "no", "--learning-rate", "1e-3", "--warmup-steps", "1", "--overwrite"]
    common += ["--cache-dir", str(out / "cache"), "--attn-implementation", "sdpa", "--loss-chunk-size", "32"]
    have_deepspeed = importlib.util.find_spec("deepspeed") is not None and not args.cpu_smoke

    def rows(results, payload) -> None:
        for item, record in payload.get("items", {}).items():
            results.add(item, "status", record["status"], reason=record.get("reason", ""))
            if "max_loss_diff" in record:
                results.add(item, "max_loss_diff", record["max_loss_diff"], unit="nats")
            results.add(item, "seconds", record["seconds"], unit="s")

    report = Report("many_gpus", args, device, {"processes": processes}, rows)
    report["items"] = {}
    plan = [
        ("baseline", "single_gpu.yaml", 1, [], None, None),
        ("baseline_lora", "single_gpu.yaml", 1, ["--lora"], None, None),
        ("ddp", "ddp.yaml", processes, [], "baseline", None),
        ("fsdp2", "fsdp2.yaml", processes, ["--checkpointing-steps", "2"], "baseline", None),
        (
            "fsdp2_resumed",
            "fsdp2.yaml",
            processes,
            ["--resume", str(out / "fsdp2-checkpoints" / "step_00000002")],
            "fsdp2",
            None,
        ),
        ("fsdp2_lora", "fsdp2.yaml", processes, ["--lora"], "baseline_lora", None),
        (
            "ulysses",
            "deepspeed_ulysses.yaml",
            processes,
            ["--sp-size", str(processes)],
            "baseline",
            None if have_deepspeed and processes >= 2 else "needs deepspeed and >= 2 GPUs",
        ),
        (
            "context_parallel",
            "context_parallel.yaml",
            processes,
            [],
            "baseline",
            None if processes == 8 else "its cp_size is 8: needs 8 GPUs",
        ),
        ("zero3", "deepspeed_zero3.yaml", processes, [], "baseline", None if have_deepspeed else "needs deepspeed"),
    ]
    for name, config, count, flags, against, skip in plan:
        started = time.perf_counter()
        record: dict = {"status": "skip", "reason": skip} if skip else {}
        if not skip:
            done = launch(config, count, [*common, *flags, "--output-dir", str(out / name)], out / f"{name}.log")
            if done.returncode != 0:
                lines = (done.stderr or done.stdout).strip().splitlines()
                record = {"status": "FAIL", "reason": lines[-1] if lines else f"exit {done.returncode}"}
            else:
                record = {"status": "ok"}
                if against is not None:
                    ours, theirs = losses(out / name), losses(out / against)
                    if name == "fsdp2_resumed":
                        ours, theirs = ours[2:], theirs[2:]
                    diff = max(abs(a - b) for a, b in zip(ours, theirs))
                    record["max_loss_diff"] = diff
                    limit = 0.0 if name == "fsdp2_resumed" else TOLERANCE
                    if diff > limit:
                        record = {**record, "status": "FAIL", "reason": f"losses {diff:.2e} off {against}'s"}
        record["seconds"] = round(time.perf_counter() - started, 1)
        report["items"] = {**report["items"], name: record}
        print(f"{name}: {record}", flush=True)
    report.save()


if __name__ == "__main__":
    main()
