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


@pytest.mark.parametrize("load, cpus, threads", [(0.0, 2, 2), (0.9, 2, 1), (1.5, 2, 1), (3.0, 16, 2), (40.0, 16, 1)])
def test_demo_threads_are_the_cores_other_work_leaves_free(monkeypatch, load, cpus, threads):
    from hf_posext.experiments import demo as demo_module

    monkeypatch.setattr(demo_module.os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(demo_module.os, "cpu_count", lambda: cpus)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert demo_module.demo_threads() == threads
    finally:
        torch.set_num_threads(before)


def test_the_demo_runs_on_the_free_cores_and_gives_the_thread_count_back(tmp_path, monkeypatch):
    """Two OpenMP threads on a 2-core machine running another job cost 3-9x per step (docs/getting_started.md)."""
    from hf_posext.experiments import demo as demo_module

    seen = []
    for name in ("pretrain", "truncated_perplexity"):
        real = getattr(demo_module, name)

        def spy(*args, _real=real, **kwargs):
            seen.append(torch.get_num_threads())
            return _real(*args, **kwargs)

        monkeypatch.setattr(demo_module, name, spy)
    monkeypatch.setattr(demo_module.os, "getloadavg", lambda: (1.5, 1.5, 1.5))
    monkeypatch.setattr(demo_module.os, "cpu_count", lambda: 2)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        report = demo_module.run_demo(QUICK, tmp_path / "cache", progress=False)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert seen and set(seen) == {1} and report["threads"] == 1
