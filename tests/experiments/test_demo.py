"""``hf-posext demo --quick``: the demo's whole pipeline, shrunk to seconds."""

from __future__ import annotations

import json

import pytest
import torch
from tests.helpers.models import single_thread

from hf_posext.commands.main import main
from hf_posext.experiments.demo import DYNAMIC_METHODS, QUICK, ROPE_METHODS
from hf_posext.experiments.tinylm import pretrain
from hf_posext.methods import available_methods


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    root = tmp_path_factory.mktemp("demo")
    with single_thread():
        code = main(
            ["demo", "--quick", "--cache-dir", str(root / "cache"), "--out", str(root / "out"), "--no-progress"]
        )
    assert code == 0
    return root, json.loads((root / "out" / "demo.json").read_text())


def test_writes_table_files_and_plot(demo, capsys):
    root, report = demo
    for name in ("demo.json", "demo.csv", "demo.md", "demo.png"):
        assert (root / "out" / name).stat().st_size > 0
    expected_rows = ["none", *ROPE_METHODS] + (["alibi (from scratch)"] if "alibi" in available_methods() else [])
    assert list(report["results"]) == expected_rows
    lengths = [m * QUICK.model.seq_len for m in QUICK.multiples]
    for rows in report["results"].values():
        assert [r["length"] for r in rows] == lengths
        assert all(r["tokens"] == QUICK.documents * (QUICK.model.seq_len - 1) for r in rows)
    table = (root / "out" / "demo.md").read_text()
    assert table.strip() == report["table"]
    assert all(f"| {name}" in table for name in expected_rows)
    assert report["environment"]["torch"] == torch.__version__


def test_static_methods_are_set_to_the_length_and_dynamic_ones_to_the_reach(demo):
    _, report = demo
    for method in ROPE_METHODS:
        factors = [r["factor"] for r in report["results"][method]]
        expected = (
            [float(max(QUICK.multiples))] * len(factors)
            if method in DYNAMIC_METHODS
            else [float(m) for m in QUICK.multiples]
        )
        assert factors == expected


def test_every_rope_method_is_the_plain_model_at_the_training_length(demo):
    """factor 1 (static) and s(L_orig) = 1 (dynamic) leave the model untouched."""
    _, report = demo
    plain = report["results"]["none"][0]["nll"]
    for method in ROPE_METHODS:
        assert report["results"][method][0]["nll"] == pytest.approx(plain, rel=1e-6)
    # ...while beyond it every method changes the model's predictions.
    longest = report["results"]["none"][-1]["nll"]
    for method in ROPE_METHODS:
        assert report["results"][method][-1]["nll"] != pytest.approx(longest, rel=1e-7)


def test_trained_model_is_cached(demo):
    root, report = demo
    assert set(report["cached"]) == set(report["train"]) and not any(report["cached"].values())  # a fresh cache
    model, _, info = pretrain(QUICK.model, root / "cache", progress=False)
    assert info == report["train"]["rope"]
    assert info["parameters"] == sum(p.numel() for p in model.parameters())
    assert info["final_loss"] < 5.0  # trained: a uniform guess over 259 byte tokens is ln 259 = 5.56
