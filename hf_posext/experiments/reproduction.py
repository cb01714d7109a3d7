"""A laptop-sized reproduction of the ALiBi and YaRN papers' main comparisons, in shape.

Three resumable experiments (from scratch, extension, passkey) on tiny stdlib Llamas;
`write_report` turns their JSON into ``reproduction.md`` and plots
(docs/results/reproduction.md).

Over ~400 lines: the three experiments and `write_report` share `ReproConfig` and the JSON files'
layout; the report is the part to move to a sibling module (commands/reproduce.py calls it here).
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from ..data import default_cache_dir, stdlib_files
from ..eval.passkey import passkey_accuracy
from ..eval.perplexity import truncated_perplexity
from ..eval.report import ResultFile, environment, markdown_table, plot_curves, plot_heatmaps
from ..methods import available_methods, method_class
from ..patching import patch_model, unpatch_model
from ..train.config import TrainConfig
from ..train.loop import train
from .demo import ROPE_METHODS, held_out_documents
from .tinylm import TinyLMConfig, pretrain

EXPERIMENTS = ("scratch", "extension", "passkey")


@dataclass(frozen=True)
class ReproConfig:
    """Sizes of the reproduction (see `FULL` and `QUICK`).

    Args:
        model: the pretraining run shared by every from-scratch model (only ``position`` varies).
        positions: position encodings trained from scratch in experiment 1.
        multiples: evaluation lengths as multiples of L_train.
        documents: held-out stdlib files per evaluation.
        factor: the extension factor s of experiment 2.
        finetune_methods: methods fine-tuned in experiment 2 (equal steps each).
        finetune_multiple: fine-tuning sequence length as a multiple of L_train.
        finetune_steps, finetune_batch, finetune_lr, finetune_warmup: the scaled-down recipe.
        finetune_bytes: bytes of stdlib training text given to the recipe.
        passkey_model: the pretraining run of experiment 3 (its ``position`` varies).
        passkey_multiples: passkey prompt lengths as multiples of its L_train.
        passkey_depths, passkey_trials: the grid of experiment 3.
    """

    model: TinyLMConfig = TinyLMConfig()
    #: ``rope`` and every registered method that replaces RoPE (ALiBi, sinusoidal, learned).
    positions: tuple[str, ...] = field(
        default_factory=lambda: (
            "rope",
            *(m for m in available_methods() if not method_class(m).scales_rope and not method_class(m).takes_factor),
        )
    )
    multiples: tuple[int, ...] = (1, 2, 4, 8, 16)
    documents: int = 24
    factor: float = 8.0
    finetune_methods: tuple[str, ...] = ("linear", "ntk", "yarn")
    finetune_multiple: int = 4
    finetune_steps: int = 100
    finetune_batch: int = 8
    finetune_lr: float = 1e-3
    finetune_warmup: int = 10
    finetune_bytes: int = 4_000_000
    passkey_model: TinyLMConfig = TinyLMConfig(seq_len=256, batch_size=8, steps=2000, passkey_fraction=1.0)
    passkey_multiples: tuple[int, ...] = (1, 2, 4, 8)
    passkey_depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    passkey_trials: int = 4


FULL = ReproConfig()
QUICK = ReproConfig(
    model=TinyLMConfig(
        seq_len=32,
        steps=20,
        batch_size=8,
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        warmup_steps=4,
        max_train_bytes=1_000_000,
    ),
    documents=2,
    multiples=(1, 2, 4),
    factor=4.0,
    finetune_multiple=2,
    finetune_steps=3,
    finetune_batch=2,
    finetune_warmup=1,
    finetune_bytes=200_000,
    passkey_model=TinyLMConfig(
        seq_len=128,
        steps=10,
        batch_size=4,
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        warmup_steps=2,
        max_train_bytes=1_000_000,
        passkey_fraction=0.5,
    ),
    passkey_multiples=(1, 2),
    passkey_depths=(0.0, 1.0),
    passkey_trials=1,
)


def _settings(config: ReproConfig, *names: str) -> dict[str, Any]:
    """The fields an experiment depends on: changing another experiment's sizes keeps its results.

    A model config also contributes its cache key (`TinyLMConfig.key`), which changes with
    the training recipe's format, Python and transformers: results measured on a model trained
    another way are not reused (they were, after the scheduler change of format 3).
    """
    settings: dict[str, Any] = {}
    for name in names:
        value = getattr(config, name)
        if isinstance(value, TinyLMConfig):
            settings[f"{name}_key"] = value.key()
        settings[name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    return settings


def _ppl_rows(
    model: Any, docs: list[torch.Tensor], lengths: list[int], n_scored: int, metric: str
) -> list[dict[str, Any]]:
    """``last``: the last ``n_scored`` tokens of cuts ending together; ``all``: every token of the first L."""
    if metric == "last":
        points = truncated_perplexity(model, docs, lengths, score_last=n_scored, end_at=lengths[-1], progress=False)
    else:
        points = truncated_perplexity(model, docs, lengths, progress=False)
    return [p.to_dict() for p in points]


def _both_metrics(model: Any, docs: list[torch.Tensor], lengths: list[int], n_scored: int) -> dict[str, Any]:
    return {metric: _ppl_rows(model, docs, lengths, n_scored, metric) for metric in ("last", "all")}


def run_scratch(config: ReproConfig, out: Path, cache_dir: Path | None, progress: bool = True) -> dict[str, Any]:
    """Experiment 1: every position encoding trained from scratch, evaluated up to max(multiples) x L_train."""
    stage = ResultFile(
        out / "scratch.json", _settings(config, "model", "multiples", "documents"), overwrite=True
    )  # its own stage file: a changed setting reruns the stage, with a warning
    lengths = [m * config.model.seq_len for m in config.multiples]
    for position in config.positions:
        if position != "rope" and position not in available_methods():
            continue

        def compute(position: str = position) -> dict[str, Any]:
            model, tokenizer, info = pretrain(
                dataclasses.replace(config.model, position=position), cache_dir, progress=progress
            )
            docs = held_out_documents(tokenizer, lengths[-1] + 1, config.documents)
            return {"train": info, **_both_metrics(model, docs, lengths, config.model.seq_len - 1)}

        stage.get(position, compute)
    return stage.results


def run_extension(config: ReproConfig, out: Path, cache_dir: Path | None, progress: bool = True) -> dict[str, Any]:
    """Experiment 2: the RoPE model extended to s x L_train by every method, then PI/NTK/YaRN fine-tuned."""
    stage = ResultFile(
        out / "extension.json",
        _settings(
            config,
            "model",
            "multiples",
            "documents",
            "factor",
            "finetune_multiple",
            "finetune_steps",
            "finetune_batch",
            "finetune_lr",
            "finetune_warmup",
            "finetune_bytes",
        ),
        overwrite=True,
    )
    train_len = config.model.seq_len
    lengths = [m * train_len for m in config.multiples]
    model, tokenizer, _ = pretrain(config.model, cache_dir, progress=progress)
    docs = held_out_documents(tokenizer, lengths[-1] + 1, config.documents)

    stage.get("none", lambda: _extended_rows(model, docs, lengths, train_len, config.factor, None))
    for method in ROPE_METHODS:
        stage.get(method, lambda method=method: _extended_rows(model, docs, lengths, train_len, config.factor, method))

    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    base_dir = root / f"tinylm-{config.model.key()}"
    data = _finetune_data(config, out)
    for method in config.finetune_methods:
        if method in available_methods():
            stage.get(
                f"{method} + fine-tune",
                lambda method=method: _finetuned_rows(config, out, base_dir, data, docs, lengths, method),
            )
    return stage.results


def _extended_rows(
    model: Any, docs: list[torch.Tensor], lengths: list[int], train_len: int, factor: float, method: str | None
) -> dict[str, Any]:
    """``{"last": rows, "all": rows}``: ``model`` patched with ``method`` at ``factor`` (None: as trained)."""
    rows = {}
    for metric in ("last", "all"):
        # A fresh patch per pass: transformers' dynamic rotary keeps the frequencies of the
        # longest sequence seen (it resets only below L_orig), so a second pass starting short
        # would run with the previous pass's s(2048). Within a pass lengths only grow.
        if method is not None:
            extra = {"exact_cache": False} if method_class(method).dynamic else {}
            patch_model(model, method, factor=factor, **extra)
        try:
            rows[metric] = _ppl_rows(model, docs, lengths, train_len - 1, metric)
        finally:
            if method is not None:
                unpatch_model(model)
    return rows


def _finetune_data(config: ReproConfig, out: Path) -> Path:
    """``out/work/finetune_data.txt``: the first ``finetune_bytes`` of the stdlib's training files, written once."""
    data = out / "work" / "finetune_data.txt"
    if not data.exists():
        data.parent.mkdir(parents=True, exist_ok=True)
        text, total = [], 0
        for path in stdlib_files("train"):
            chunk = path.read_bytes().decode("utf-8", errors="replace")
            text.append(chunk)
            total += len(chunk)
            if total >= config.finetune_bytes:
                break
        data.write_text("\n".join(text))
    return data


def _finetuned_rows(
    config: ReproConfig,
    out: Path,
    base_dir: Path,
    data: Path,
    docs: list[torch.Tensor],
    lengths: list[int],
    method: str,
) -> dict[str, Any]:
    """Fine-tune ``base_dir`` with ``method`` by the recipe (`train`); its training numbers and perplexity rows."""
    train_len = config.model.seq_len
    output = out / "work" / f"finetuned-{method}"
    start = time.perf_counter()
    result = train(
        TrainConfig(
            model=str(base_dir),
            method=method,
            factor=config.factor,
            output_dir=str(output),
            dataset=[str(data)],
            seq_len=config.finetune_multiple * train_len,
            max_train_steps=config.finetune_steps,
            learning_rate=config.finetune_lr,
            warmup_steps=config.finetune_warmup,
            weight_decay=0.0,
            adam_beta1=0.9,
            adam_beta2=0.95,
            global_batch_size=config.finetune_batch,
            micro_batch_size=config.finetune_batch,
            mixed_precision="no",
            activation_checkpointing=False,
            attn_implementation="sdpa",
            cache_dir=str(out / "work" / "blocks"),
            seed=0,
            overwrite=True,
        )
    )
    seconds = time.perf_counter() - start
    tuned = AutoModelForCausalLM.from_pretrained(output, attn_implementation="sdpa").eval()
    rows = _both_metrics(tuned, docs, lengths, train_len - 1)
    return {
        "train": {
            "steps": result.steps,
            "tokens": result.tokens,
            "final_loss": result.final_loss,
            "seconds": round(seconds, 1),
        },
        **rows,
    }


def run_passkey(config: ReproConfig, out: Path, cache_dir: Path | None, progress: bool = True) -> dict[str, Any]:
    """Experiment 3: retrieval-trained RoPE and ALiBi models, passkey accuracy beyond L_train."""
    stage = ResultFile(
        out / "passkey.json",
        _settings(config, "passkey_model", "passkey_multiples", "passkey_depths", "passkey_trials"),
        overwrite=True,
    )
    base = config.passkey_model
    lengths = [m * base.seq_len for m in config.passkey_multiples]
    runs: list[tuple[str, str, str | None]] = [("rope", "rope (none)", None), ("rope", "rope + yarn", "yarn")]
    if "alibi" in available_methods():
        runs.append(("alibi", "alibi", None))
    for position, name, method in runs:

        def compute(position: str = position, method: str | None = method) -> dict[str, Any]:
            model, tokenizer, info = pretrain(
                dataclasses.replace(base, position=position), cache_dir, progress=progress
            )
            result = {"train": info, "results": []}
            for length in lengths:
                # Static YaRN is set to each prompt length (s = L / L_train), as a user would for that context.
                factor = length / base.seq_len
                if method is not None:
                    patch_model(model, method, factor=factor)
                try:
                    cell = passkey_accuracy(
                        model,
                        tokenizer,
                        [length],
                        config.passkey_depths,
                        config.passkey_trials,
                        task="",
                        progress=progress,
                    )
                finally:
                    if method is not None:
                        unpatch_model(model)
                result["results"].append({"factor": factor, **cell.to_dict()})
            return result

        stage.get(name, compute)
    return stage.results


def _perplexity_tables(heading: str, header: list[str], results: dict[str, Any]) -> list[str]:
    """One experiment's perplexity tables, ``last`` then ``all`` (one row per model, one column per length)."""
    return [
        part
        for metric in ("last", "all")
        for part in (
            f"## {heading} ({metric})\n",
            markdown_table(header, [[k, *[r["perplexity"] for r in v[metric]]] for k, v in results.items()]) + "\n",
        )
    ]


def _perplexity_plot(path: Path, caption: str, results: dict[str, Any], title: str, train_len: int) -> str:
    """Plots each model's ``last`` perplexity by length to ``path``; returns the report's image line."""
    curves = {k: ([r["length"] for r in v["last"]], [r["perplexity"] for r in v["last"]]) for k, v in results.items()}
    plot_curves(path, curves, title=title, vline=train_len)
    return f"![{caption}]({path.name})\n"


def write_report(config: ReproConfig, out: Path, command: str, wall_seconds: float) -> str:
    """``reproduction.md`` (tables, protocol, environment, the command) and the PNG plots from the JSON files."""
    train_len = config.model.seq_len
    lengths = [m * train_len for m in config.multiples]
    header = ["model"] + [f"{n} ({m}x)" for n, m in zip(lengths, config.multiples)]
    parts = [f"# Laptop-sized reproduction\n\nMade by `{command}` in {wall_seconds / 60:.1f} min of wall time.\n"]
    # The machine the experiments ran on, as their JSON files recorded it (not this process's threads).
    recorded = [
        json.loads((out / f"{n}.json").read_text()).get("environment")
        for n in EXPERIMENTS
        if (out / f"{n}.json").exists()
    ]
    env = next((e for e in recorded if e), None) or environment()
    parts.append(
        f"Hardware and versions: {env['cpu']} ({env['cpu_count']} cores, {env['torch_threads']} torch threads), "
        f"Python {env['python']}, torch {env['torch']}, transformers {env['transformers']}.\n"
    )
    parts.append(
        f"Models: byte-level Llama, {config.model.hidden_size} wide, {config.model.num_layers} layers, "
        f"{config.model.num_heads} heads, trained for {config.model.steps} steps of {config.model.batch_size} x "
        f"{train_len} bytes of the Python standard library (seed {config.model.seed}). Metric: perplexity per byte on "
        f"{config.documents} held-out stdlib files; **last** = the same last {train_len - 1} bytes of each "
        "file's first "
        f"{lengths[-1]} bytes, read with L bytes of context; **all** = every byte of the first L bytes (the YaRN "
        "repo's truncated protocol).\n"
    )
    scratch_path, ext_path, pk_path = (out / f"{n}.json" for n in EXPERIMENTS)
    if scratch_path.exists():
        scratch = json.loads(scratch_path.read_text())["results"]
        parts += _perplexity_tables(f"1. Trained from scratch at {train_len} bytes", header, scratch)
        title = f"trained from scratch at {train_len} bytes (last {train_len - 1} bytes)"
        parts.append(_perplexity_plot(out / "repro_scratch.png", "from scratch", scratch, title, train_len))
    if ext_path.exists():
        ext = json.loads(ext_path.read_text())["results"]
        parts += _perplexity_tables(f"2. RoPE model extended to s = {config.factor:g}", header, ext)
        tuned = {k: v["train"] for k, v in ext.items() if "train" in v}
        if tuned:
            parts.append(
                f"Fine-tuned: {config.finetune_steps} steps of {config.finetune_batch} x "
                f"{config.finetune_multiple * train_len} bytes, lr {config.finetune_lr:g}, "
                f"warm-up {config.finetune_warmup}, "
                "AdamW (0.9, 0.95), no weight decay, via `hf_posext.train.loop.train`; "
                + "; ".join(f"{k}: final loss {v['final_loss']:.3f} in {v['seconds']} s" for k, v in tuned.items())
                + ".\n"
            )
        title = f"RoPE model extended to s = {config.factor:g}"
        parts.append(_perplexity_plot(out / "repro_extension.png", "extension", ext, title, train_len))
    if pk_path.exists():
        pk = json.loads(pk_path.read_text())["results"]
        base = config.passkey_model
        pk_lengths = [m * base.seq_len for m in config.passkey_multiples]
        parts.append(f"## 3. Passkey retrieval, trained at {base.seq_len} bytes\n")
        parts.append(
            f"Models trained {base.steps} steps of {base.batch_size} x {base.seq_len} bytes, "
            f"{base.passkey_fraction:.0%} of sequences being passkey prompts (no task line) ending with the answer, "
            "scored on the answer only. "
            f"Accuracy over depths {list(config.passkey_depths)}, {config.passkey_trials} keys each; "
            "RoPE + YaRN uses s = L / L_train.\n"
        )
        rows = [[name, *[r["accuracy_by_length"][0] for r in v["results"]]] for name, v in pk.items()]
        parts.append(
            markdown_table(["model", *[f"{n} ({m}x)" for n, m in zip(pk_lengths, config.passkey_multiples)]], rows)
            + "\n"
        )
        plot_heatmaps(
            out / "repro_passkey.png",
            {
                name: (
                    pk_lengths,
                    v["results"][0]["depths"],
                    [[r["accuracy"][d][0] for r in v["results"]] for d in range(len(v["results"][0]["depths"]))],
                )
                for name, v in pk.items()
            },
            title=f"passkey retrieval (trained at {base.seq_len} bytes)",
        )
        parts.append("![passkey](repro_passkey.png)\n")
    text = "\n".join(parts)
    (out / "reproduction.md").write_text(text)
    return text
