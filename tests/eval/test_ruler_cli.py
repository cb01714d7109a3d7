"""``hf-posext eval ruler`` on a tiny checkpoint: files, resume cell by cell, checks before the model loads."""

from __future__ import annotations

import csv
import json

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_posext.commands.main import main
from hf_posext import eval as eval_lib
from hf_posext.eval import evaluated_model
from hf_posext.eval.ruler import ruler_accuracy
from hf_posext.testing import make_tiny_model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("ruler") / "tiny", hidden_size=32, max_position_embeddings=1024)


def run(path, out, *extra):
    return main(
        [
            "eval",
            "ruler",
            str(path),
            "--samples",
            "2",
            "--max-new-tokens",
            "3",
            "--out",
            str(out),
            "--no-progress",
            *extra,
        ]
    )


def test_writes_json_csv_table_and_plots_equal_to_the_library(checkpoint, tmp_path, capsys):
    out = tmp_path / "out"
    assert (
        run(
            checkpoint,
            out,
            "--lengths",
            "1000,2000",
            "--tasks",
            "niah_single_1,fwe",
            "--method",
            "none,yarn",
            "--factor",
            "2",
        )
        == 0
    )
    report = json.loads((out / "ruler.json").read_text())
    assert sorted(report["results"]) == sorted(
        f"{m}/{t}/{n}" for m in ("none", "yarn") for t in ("niah_single_1", "fwe") for n in (1000, 2000)
    )
    cell = report["results"]["yarn/fwe/2000"]
    assert cell["patch"]["method"] == "yarn" and cell["n"] == 2 and cell["prompt_tokens"] == 2000 - 50
    assert 0 <= cell["low"] <= cell["accuracy"] <= cell["high"] <= 100
    assert report["summary"]["none"]["average"]["1000"]["n"] == 4
    with (out / "ruler.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {"method", "task", "length", "accuracy", "n", "low", "high"} <= set(rows[0])
    assert len(rows) == 2 * (2 * 2 + 2)  # per method: 2 tasks x 2 lengths, plus the average at each length
    table = (out / "ruler.md").read_text()
    assert "none/niah_single_1" in table
    # the tiny model scores 0: no length reaches the threshold, said in words rather than "None"
    assert "None" not in table and "- none: effective length (> 85.6): none (not above 85.6 at 1000)" in table
    assert (out / "ruler_niah.png").stat().st_size > 0 and (out / "ruler_tasks.png").stat().st_size > 0

    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    mine = ruler_accuracy(
        model,
        AutoTokenizer.from_pretrained(checkpoint),
        [1000],
        "niah_single_1,fwe",
        2,
        max_new_tokens=3,
        progress=False,
    )
    for key, value in mine["cells"].items():
        assert report["results"][f"none/{key}"]["samples"] == value["samples"]


def test_resumes_cell_by_cell(checkpoint, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    assert run(checkpoint, out, "--lengths", "1000", "--tasks", "niah_single_1") == 0
    first = json.loads((out / "ruler.json").read_text())["results"]["none/niah_single_1/1000"]
    calls = []
    original = eval_lib.ruler.ruler_accuracy

    def counting(*args, **kwargs):
        store = kwargs["store"]
        get = store.get

        def recording(key, compute):
            return get(key, lambda: calls.append(key) or compute())

        store.get = recording
        return original(*args, **kwargs)

    monkeypatch.setattr(eval_lib.ruler, "ruler_accuracy", counting)
    # Another length and task later: only the new cells are computed, the old one is kept as it was.
    assert run(checkpoint, out, "--lengths", "1000,1020", "--tasks", "niah_single_1,niah_single_2") == 0
    assert calls == ["niah_single_2/1000", "niah_single_1/1020", "niah_single_2/1020"]
    report = json.loads((out / "ruler.json").read_text())
    assert report["results"]["none/niah_single_1/1000"] == first and len(report["results"]) == 4
    calls.clear()
    capsys.readouterr()
    assert run(checkpoint, out, "--lengths", "1000,1020", "--tasks", "niah_single_1,niah_single_2") == 0
    assert calls == [] and "done in an earlier run, skipped" in capsys.readouterr().out
    # Other samples or another factor would replace the cells: refused; --overwrite starts a new evaluation.
    other = [
        "eval",
        "ruler",
        str(checkpoint),
        "--samples",
        "1",
        "--max-new-tokens",
        "3",
        "--out",
        str(out),
        "--no-progress",
        "--lengths",
        "1000",
        "--tasks",
        "niah_single_1",
    ]
    capsys.readouterr()
    assert main(other) == 2 and "samples 2 -> 1" in capsys.readouterr().err
    assert main([*other[:4], "2", *other[5:], "--method", "yarn", "--factor", "1.5"]) == 2
    assert "factor None -> 1.5" in capsys.readouterr().err
    assert len(json.loads((out / "ruler.json").read_text())["results"]) == 4
    assert main([*other, "--overwrite"]) == 0
    assert list(json.loads((out / "ruler.json").read_text())["results"]) == ["none/niah_single_1/1000"]


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--lengths", "1000", "--tasks", "niah_single_1,needle"], "unknown RULER task 'needle'"),
        (
            ["--lengths", "1000,4096"],
            "--lengths 4096 is longer than the model can take with --method none: 1024 tokens",
        ),
        (
            ["--lengths", "4096", "--method", "none,yarn", "--factor", "2"],
            "longer than the model can take with --method none,yarn: 2048 tokens",
        ),
        (["--lengths", "300,1000", "--tasks", "vt"], "--lengths 300 is too short for vt"),
        (["--lengths", "1000", "--method", "yarn"], "--method yarn needs --factor"),
    ],
)
def test_bad_tasks_and_lengths_are_refused_before_the_model_loads(
    checkpoint, tmp_path, capsys, monkeypatch, extra, message
):
    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(evaluated_model, "load_model", no_model)
    assert main(["eval", "ruler", str(checkpoint), "--out", str(tmp_path / "out"), "--no-progress", *extra]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_hint_for_a_patched_checkpoint_counts_from_its_pretrained_context(checkpoint, tmp_path, capsys):
    patched = tmp_path / "yarn2"
    assert main(["patch", str(checkpoint), str(patched), "--method", "yarn", "--factor", "2"]) == 0
    argv = ["eval", "ruler", str(patched), "--out", str(tmp_path / "out"), "--no-progress", "--lengths", "4096"]
    assert main([*argv, "--method", "none,yarn", "--factor", "2"]) == 2
    error = capsys.readouterr().err
    # 2048 as saved (yarn x2 of 1024); the hint is a factor that reaches 4096 from 1024, not the one that failed
    assert "2048 tokens (pretrained context 1024; as saved: yarn to 2048)" in error
    assert "--method none,yarn --factor 4)" in error


def test_quick_runs_one_task_per_category_with_two_samples(checkpoint, tmp_path):
    assert (
        main(
            [
                "eval",
                "ruler",
                str(checkpoint),
                "--quick",
                "--lengths",
                "2000",
                "--method",
                "yarn",
                "--factor",
                "2",
                "--max-new-tokens",
                "2",
                "--out",
                str(tmp_path),
                "--no-progress",
                "--overwrite",
            ]
        )
        == 0
    )
    results = json.loads((tmp_path / "ruler.json").read_text())["results"]
    assert sorted(k.split("/")[1] for k in results) == sorted(["niah_single_1", "niah_multikey_1", "vt", "fwe", "qa"])
    assert {c["n"] for c in results.values()} == {2}
