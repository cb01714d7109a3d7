"""Every rotary decoder of the installed transformers, patched by each swept family, saved and read back.

scripts/sweep.py does the work; the candidates are split into chunks so that pytest-xdist spreads
them over the workers, each chunk reloading its checkpoints in one interpreter without hf_posext. It runs
on the newest lane too, where transformers' registry holds other model types.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers
from scripts.registry import candidates
from scripts.sweep import patch_all, read_back

pytestmark = [pytest.mark.slow, pytest.mark.newest, pytest.mark.usefixtures("one_thread")]

CHUNKS = 6
#: The committed sweep (benchmarks/model_sweep.py) that docs/methods/supported.md shows.
RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "model_sweep.json"


def committed() -> dict[tuple[str, str], str] | None:
    """``{(model_type, method): status}`` of the committed sweep, or ``None`` if it ran on another transformers."""
    rows = [row for row in json.loads(RESULTS.read_text()) if row["benchmark"] == "model_sweep"]
    if rows[0]["versions"]["transformers"] != transformers.__version__:
        return None
    return {(row["setting"]["model_type"], row["method"]): row["value"] for row in rows}


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_every_rotary_decoder_extends_or_is_refused_in_one_line_and_reads_back(chunk, tmp_path):
    """A patch either gives finite logits past L0 and a checkpoint that reads back as the same model (natively,
    or with the plugin where doctor says it needs it), or is refused with one ValueError line naming the method or
    the family."""
    model_types = candidates()[chunk::CHUNKS]
    refused, saved, _ = patch_all(tmp_path, model_types)
    for outcome in refused:  # one line naming the method, or the family and why it cannot be extended
        assert outcome.method in outcome.why or outcome.model_type in outcome.why, outcome
    outcomes = read_back(tmp_path, saved)
    assert {(o.model_type, o.method) for o in outcomes} == {tuple(path.name.split("--")) for path in saved}
    assert saved, f"no model type of chunk {chunk} ({model_types}) could be extended"
    shown = committed()
    if shown is not None:  # the docs page shows what this transformers does: run benchmarks/model_sweep.py
        found = {(o.model_type, o.method): o.status for o in [*refused, *outcomes]}
        expected = {key: status for key, status in shown.items() if key[0] in model_types and status != "unbuildable"}
        assert found == expected, "docs/methods/supported.md is stale: run python benchmarks/model_sweep.py"
