"""The fine-tune evaluation's experiments: other checkpoints' rows beside the recipe's, never in its file.

No model is loaded: the arguments are refused before one would be, and the report reads cell files.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the benchmark imports its siblings from there
_spec = importlib.util.spec_from_file_location("finetune_bench", ROOT / "benchmarks" / "finetune_real_model.py")
finetune = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = finetune
_spec.loader.exec_module(finetune)


@pytest.mark.parametrize(
    "argv",
    [
        ["ckpt", "--experiment", "windows"],  # a row of its own is required
        ["ckpt", "--row", "other"],  # another row in the recipe's own file would replace its cells
        ["ckpt", "--experiment", "windows", "--row", "other", "--report"],
        ["ckpt", "--experiment", "windows", "--row", "other", "--llamacpp"],
    ],
)
def test_experiment_and_row_go_together_and_only_evaluate(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        finetune.main(argv)
    assert exit_.value.code == 2 and "--experiment and --row go together" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "bad"),
    [
        (["ckpt", "--experiment", "windows", "--row", "yarn/4k"], "--row 'yarn/4k'"),
        (["ckpt", "--experiment", "runs/windows", "--row", "windows"], "--experiment 'runs/windows'"),
        (["ckpt", "--experiment", "..", "--row", "windows"], "--experiment '..'"),
    ],
)
def test_a_name_with_a_slash_is_one_line_naming_it(argv, bad, capsys, tmp_path, monkeypatch):
    """The cells are keyed ``passkey/ROW/LENGTH/DEPTH`` (split on "/") and NAME is one folder."""
    monkeypatch.setattr(finetune, "OUT", tmp_path)
    monkeypatch.setattr(finetune, "EXPERIMENTS", tmp_path / "experiments")
    with pytest.raises(SystemExit) as exit_:
        finetune.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and bad in err and "/" in err
    assert err.count("\n") == 1, err
    assert not (tmp_path / "experiments").exists()


def test_an_experiment_is_a_row_of_the_report_paired_with_the_recipe(tmp_path, monkeypatch):
    monkeypatch.setattr(finetune, "OUT", tmp_path)
    monkeypatch.setattr(finetune, "EXPERIMENTS", tmp_path / "experiments")
    recipe = finetune.ROW
    (tmp_path / "experiments" / "windows").mkdir(parents=True)
    variant = {
        "settings": {"row": "longer windows"},
        "cells": {
            "passkey/longer windows/16384/0.0": {"value": True},
            "passkey/longer windows/16384/0.5": {"value": True},
            "ppl/longer windows/32768": {"value": 12.5},
        },
    }
    (tmp_path / "experiments" / "windows" / "results.json").write_text(json.dumps(variant))
    cells = finetune.Cells(tmp_path / "results.json", {"row": recipe, "dtype": "bfloat16"})
    cells.cells = {
        f"passkey/{recipe}/16384/0.0": {"value": False},
        f"passkey/{recipe}/16384/0.5": {"value": True},
        f"ppl/{recipe}/32768": {"value": 14.0},
    }
    (tmp_path / "experiments" / "windows" / "train_results.json").write_text(json.dumps({"losses": [2.0, 1.5]}))
    text = finetune.report(cells, [16384], tmp_path / "no-checkpoint")
    lines = text.splitlines()
    row = next(line for line in lines if line.startswith("| longer windows"))
    assert "2/2" in row and "12.50" in row
    assert next(line for line in lines if line.startswith(f"| {recipe} ")).count("1/2") == 1
    # paired on the two shared prompts: the recipe right where the variant is wrong 0 times, the reverse once
    assert any(line.replace(" ", "") == "|16k|longerwindows|yarns=4fine-tuned|2|1|0|1|" for line in lines), text
    assert (tmp_path / "results.md").read_text() == text
    assert (tmp_path / "experiments" / "loss.png").exists()  # the experiment's loss curve, from its run's record


def measured_recipe(tmp_path, monkeypatch, cells):
    """A results folder holding the recipe's ``cells`` (measured on another checkpoint folder) and a
    checkpoint folder rebuilt since: ``(checkpoint, results file's content)``."""
    monkeypatch.setattr(finetune, "OUT", tmp_path / "out")
    monkeypatch.setattr(finetune, "EXPERIMENTS", tmp_path / "out" / "experiments")
    checkpoint = tmp_path / "smollm2-32k"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    measured = {
        "settings": {**finetune.SETTINGS, "row": finetune.ROW, "checkpoint": "sha256:measured", "dtype": "bfloat16"},
        "cells": cells,
    }
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "results.json").write_text(json.dumps(measured))
    return checkpoint, measured


def test_a_report_reads_the_cells_of_a_checkpoint_folder_rebuilt_since(tmp_path, monkeypatch):
    """The fingerprint hashes file times: a rebuilt folder is another checkpoint to evaluate, not to report."""
    recipe = finetune.ROW
    cells = {f"ppl/{recipe}/32768": {"value": 14.0}, f"passkey/{recipe}/32768/0.0": {"value": True}}
    rebuilt, measured = measured_recipe(tmp_path, monkeypatch, cells)
    assert finetune.main([str(rebuilt), "--report", "--lengths", "32768"]) == 0
    row = next(
        line for line in (tmp_path / "out" / "results.md").read_text().splitlines() if line.startswith(f"| {recipe} ")
    )
    assert "1/1" in row and "14.00" in row
    assert json.loads((tmp_path / "out" / "results.json").read_text()) == measured  # read, never rewritten


def test_a_report_rewrites_the_published_cards_evaluation_and_keeps_the_rest(tmp_path, monkeypatch):
    """The card's metrics follow the cells as they fill; the run's description and the rebuild stay as published."""
    recipe = finetune.ROW
    cells = {f"passkey/{recipe}/32768/0.0": {"value": True}, f"passkey/{recipe}/32768/0.5": {"value": True}}
    checkpoint, _ = measured_recipe(tmp_path, monkeypatch, cells)
    (tmp_path / "out" / "adapter").mkdir()
    card = tmp_path / "out" / "adapter" / "README.md"
    preface = "---\nlibrary_name: peft\n---\n\n# The adapter\n\nHow to rebuild it.\n\n"
    card.write_text(preface + finetune.EVALUATION + "\n\n| yarn s=4 fine-tuned | 1/1 |\n")
    assert finetune.main([str(checkpoint), "--report", "--lengths", "32768"]) == 0
    text = card.read_text()
    assert text.startswith(preface) and text.count(finetune.EVALUATION) == 1
    row = next(line for line in text.splitlines() if line.startswith(f"| {recipe} "))
    assert "2/2" in row and "1/1" not in row
    assert text.endswith((tmp_path / "out" / "results.md").read_text().split("\n", 2)[2])

    card.write_text(preface)  # a card published without the section: nothing to rewrite in place
    with pytest.raises(ValueError, match="no '## Evaluation"):
        finetune.main([str(checkpoint), "--report", "--lengths", "32768"])
    assert card.read_text() == preface


def test_one_row_measured_in_two_folders_is_one_row_of_the_report(tmp_path, monkeypatch):
    """An experiment's cells in two dtypes (fp32 perplexity, bf16 long passkeys) are two folders, one row."""
    monkeypatch.setattr(finetune, "OUT", tmp_path)
    monkeypatch.setattr(finetune, "EXPERIMENTS", tmp_path / "experiments")
    row = "long-short mix"
    for folder, dtype, cells in (
        ("mix", "float32", {f"ppl/{row}/32768": {"value": 12.5}, f"passkey/{row}/4096/0.0": {"value": True}}),
        ("mix-bf16", "bfloat16", {f"passkey/{row}/32768/0.0": {"value": True}}),
    ):
        (tmp_path / "experiments" / folder).mkdir(parents=True)
        content = {"settings": {"row": row, "dtype": dtype}, "cells": cells}
        (tmp_path / "experiments" / folder / "results.json").write_text(json.dumps(content))
    (tmp_path / "experiments" / "mix" / "train_results.json").write_text(json.dumps({"losses": [2.0, 1.5]}))
    variants = finetune.experiments()
    assert list(variants) == [row]
    folder, cells = variants[row]
    assert folder.name == "mix" and len(cells) == 3  # the folder holding the run's record; every cell
    text = finetune.report(
        finetune.Cells(tmp_path / "results.json", {"row": finetune.ROW, "dtype": "bfloat16"}),
        [32768],
        tmp_path / "no-checkpoint",
    )
    line = next(line for line in text.splitlines() if line.startswith(f"| {row}"))
    assert line.count("1/1") == 2 and "12.50" in line
    assert "long-short mix: float32, bfloat16" in text.replace("`", "")


def write_ruler(folder: Path, scores: list[float]) -> None:
    """``folder/seed0/ruler.json``: one niah_multikey_1 run at 16k, prompt i scored ``scores[i]``."""
    samples = [{"seed": f"0/niah_multikey_1/16384/{i}", "score": s} for i, s in enumerate(scores)]
    result = {"task": "niah_multikey_1", "length": 16384, "samples": samples}
    (folder / "seed0").mkdir(parents=True)
    (folder / "seed0" / "ruler.json").write_text(json.dumps({"results": {"none/niah_multikey_1/16384": result}}))


def test_the_ruler_section_has_a_row_per_run_and_pairs_each_of_ruler_pairs_on_their_common_prompts(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(finetune, "OUT", tmp_path)
    write_ruler(tmp_path / "ruler" / "yarn", [0, 0, 0, 1])
    write_ruler(tmp_path / "ruler" / "fine-tuned", [1, 1, 0, 1])
    write_ruler(tmp_path / "ruler" / "long-short-400", [1, 0, 1])  # one prompt fewer: paired on three
    lines = [line.replace(" ", "") for line in finetune.ruler_section().splitlines()]
    assert "|yarns=4|niah_multikey_1|16k|1/4(0.05-0.70)|" in lines
    assert "|long-shortmix,400steps|niah_multikey_1|16k|2/3(0.21-0.94)|" in lines
    # b: the row right where the other is wrong; c: the reverse
    assert "|yarns=4fine-tuned|yarns=4|niah_multikey_1|16k|4|2|0|0.5|" in lines
    assert "|long-shortmix,400steps|yarns=4|niah_multikey_1|16k|3|2|0|0.5|" in lines
    assert "|long-shortmix,400steps|yarns=4fine-tuned|niah_multikey_1|16k|3|1|1|1|" in lines


def test_key_indices_ask_only_those_keys_of_the_schedule(tmp_path, monkeypatch):
    from hf_posext.testing import byte_tokenizer

    monkeypatch.setattr(finetune, "EXPERIMENTS", tmp_path / "experiments")
    monkeypatch.setattr(finetune, "model_fingerprint", lambda path: "sha256:rebuilt")
    monkeypatch.setattr(finetune, "load_model", lambda *args, **kwargs: (None, byte_tokenizer()))
    monkeypatch.setattr(finetune, "reference_text", lambda: "text")
    asked = []
    monkeypatch.setattr(finetune, "passkey_found", lambda model, tok, n, i, d: asked.append(i) or i % 2 == 0)
    argv = ["ckpt", "--experiment", "rebuilt", "--row", "r", "--lengths", "32768", "--keys", "20", "--ppl"]
    assert finetune.main([*argv, "--key-indices", "8", "19", "10"]) == 0
    assert asked == [8, 10, 19]
    cells = json.loads((tmp_path / "experiments" / "rebuilt" / "results.json").read_text())["cells"]
    assert cells.keys() == {"passkey/r/32768/0.889", "passkey/r/32768/0.05", "passkey/r/32768/0.95"}


@pytest.mark.parametrize("indices", [["20"], ["-1"], ["3", "3"]])
def test_a_key_index_outside_the_schedule_or_twice_is_one_line_naming_it(indices, capsys):
    with pytest.raises(SystemExit) as stop:
        finetune.main(["ckpt", "--keys", "20", "--key-indices", *indices])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--key-indices" in err[0] and "0..19" in err[0], err
