"""The model sweep (docs/methods/supported.md): each rotary decoder of the installed transformers, patched, read back.

scripts/sweep.py does the work, as in tests/test_model_sweep.py: each model type of transformers' registry
that builds as a tiny model is patched by the first method of each swept family, saved, and read back (natively
in an interpreter that never imports hf_posext, else with ``hf_posext.from_pretrained`` after doctor said it
needs the plugin). One row of ``benchmarks/results/model_sweep.json`` per model type and method (``value``:
``native``, ``plugin`` or ``refused``, ``extra.why``: the refusal's line), and one per model type that does not
build tiny (``method``: ``(tiny model)``, ``value``: ``unbuildable``). About 3 minutes on 2 CPU cores.

    python benchmarks/model_sweep.py
    python scripts/tables.py   # renders docs/methods/supported.md from the rows
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]  # scripts (the tiny registry models); harness

from harness import current_versions, device_name, now  # noqa: E402
from result_schema import Row, write_rows  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "model_sweep.json"
#: The ``method`` of a model type that does not build as a tiny model.
UNBUILDABLE = "(tiny model)"


def sweep(scratch: Path) -> list[tuple[str, str, str, str]]:
    """``[(model_type, method, status, why)]`` for every candidate, refusals and unbuildable types included."""
    from scripts.sweep import patch_all, read_back, sweep_methods

    refused, saved, unbuildable = patch_all(scratch)
    outcomes = [*refused, *read_back(scratch, saved)]
    found = [(o.model_type, o.method, o.status, o.why) for o in outcomes]
    found += [(model_type, UNBUILDABLE, "unbuildable", why) for model_type, why in unbuildable]
    order = [*sweep_methods(), UNBUILDABLE]  # the families' order: the table's columns
    return sorted(found, key=lambda outcome: (outcome[0], order.index(outcome[1])))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help="the results file (rows merged in)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        found = sweep(Path(scratch))
    versions, time, device = current_versions(), now(), device_name()
    rows = [
        Row(
            "model_sweep",
            method,
            {"model_type": model_type},
            "status",
            status,
            "",
            device,
            versions,
            time,
            {"why": why},
        )
        for model_type, method, status, why in found
    ]
    write_rows(args.out, rows, replace=lambda row: row.benchmark == "model_sweep")
    print(f"{len(rows)} outcomes of {len({r.setting['model_type'] for r in rows})} model types -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
