"""``hf-posext eval ppl|passkey`` on a tiny saved checkpoint: files, numbers, resume, bad input."""

from __future__ import annotations

import csv
import json
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from hf_posext import patch_model
from hf_posext.commands.main import main
from hf_posext.commands import eval as eval_cli
from hf_posext.eval import evaluated_model
from hf_posext.eval import encode_documents, load_texts, sliding_window_perplexity, truncated_perplexity
from hf_posext.testing import byte_tokenizer, make_tiny_model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    path = make_tiny_model(root / "tiny", hidden_size=32, max_position_embeddings=32)
    text = root / "doc.txt"
    text.write_text("def add(a, b):\n    return a + b\n" * 6)
    return path, text


def test_ppl_writes_files_equal_to_library_calls(checkpoint, tmp_path, capsys):
    path, text = checkpoint
    out = tmp_path / "ppl"
    argv = [
        "eval",
        "ppl",
        str(path),
        "--data",
        str(text),
        "--lengths",
        "16,64",
        "--method",
        "none,yarn",
        "--factor",
        "2",
        "--mode",
        "both",
        "--stride",
        "8",
        "--out",
        str(out),
        "--no-progress",
    ]
    assert main(argv) == 0
    report = json.loads((out / "ppl.json").read_text())
    assert list(report["results"]) == ["none/truncated", "none/sliding", "yarn/truncated", "yarn/sliding"]
    assert report["results"]["yarn/truncated"]["patch"]["method"] == "yarn"

    model = AutoModelForCausalLM.from_pretrained(path)
    docs = encode_documents(load_texts([str(text)]), byte_tokenizer())
    expected = {
        "none/truncated": truncated_perplexity(model, docs, [16, 64], progress=False),
        "none/sliding": sliding_window_perplexity(model, docs, [16, 64], 8, progress=False),
    }
    patch_model(model, "yarn", factor=2)
    expected["yarn/truncated"] = truncated_perplexity(model, docs, [16, 64], progress=False)
    for key, points in expected.items():
        got = [p["perplexity"] for p in report["results"][key]["points"]]
        assert got == pytest.approx([p.perplexity for p in points], rel=1e-5)
    with (out / "ppl.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 4 * 2
    assert (out / "ppl.png").stat().st_size > 0

    # A rerun with the same settings reuses every result.
    before = (out / "ppl.json").read_text()
    capsys.readouterr()
    assert main(argv) == 0
    assert capsys.readouterr().out.count("skipped") == 4
    assert json.loads((out / "ppl.json").read_text())["results"] == json.loads(before)["results"]


def test_passkey_writes_grid_and_heatmap(checkpoint, tmp_path):
    path, _ = checkpoint
    out = tmp_path / "pk"
    argv = [
        "eval",
        "passkey",
        str(path),
        "--lengths",
        "300,400",
        "--depths",
        "0,1",
        "--trials",
        "1",
        "--method",
        "none,dynamic_yarn",
        "--factor",
        "16",
        "--out",
        str(out),
        "--no-progress",
    ]
    assert main(argv) == 0
    report = json.loads((out / "passkey.json").read_text())
    for method in ("none", "dynamic_yarn"):
        result = report["results"][method]
        assert result["lengths"] == [300, 400] and len(result["accuracy"]) == 2
        assert len(result["samples"]) == 4
    assert (out / "passkey.png").stat().st_size > 0


def test_bad_input_is_reported(checkpoint, tmp_path, capsys):
    path, text = checkpoint
    assert (
        main(
            [
                "eval",
                "ppl",
                str(path),
                "--data",
                str(text),
                "--lengths",
                "16",
                "--method",
                "rotary",
                "--factor",
                "2",
                "--out",
                str(tmp_path),
                "--no-progress",
            ]
        )
        == 2
    )
    assert "unknown method 'rotary'" in capsys.readouterr().err
    assert (
        main(
            [
                "eval",
                "ppl",
                str(path),
                "--data",
                str(tmp_path / "missing.txt"),
                "--lengths",
                "16",
                "--out",
                str(tmp_path),
                "--no-progress",
            ]
        )
        == 2
    )
    assert "missing.txt" in capsys.readouterr().err
    assert (
        main(
            [
                "eval",
                "ppl",
                str(path),
                "--data",
                str(text),
                "--lengths",
                "16",
                "--method",
                "yarn",
                "--out",
                str(tmp_path),
                "--no-progress",
            ]
        )
        == 2
    )
    assert "--method yarn needs --factor" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["eval", "ppl", str(path), "--lengths", "sixteen"])


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--method", "yarn,bogus", "--factor", "2"], "unknown method 'bogus'"),
        (["--method", "none,dynamic"], "--method dynamic needs --factor"),
        (["--method", "none,self_extend"], "--method self_extend needs --factor"),
        (["--method", "yarn", "--factor", "2", "--set", "beta_fast=nan"], "beta_fast must be a finite number"),
        (["--method", "yarn", "--factor", "2", "--set", "factor=4"], "factor has its own flag"),
    ],
)
def test_every_method_is_checked_before_any_evaluation(checkpoint, tmp_path, capsys, monkeypatch, extra, message):
    path, text = checkpoint

    def no_evaluation(*args, **kwargs):
        raise AssertionError("a model was loaded before the methods were checked")

    monkeypatch.setattr(evaluated_model, "load_model", no_evaluation)
    for command in (["ppl", "--data", str(text)], ["passkey"]):
        assert (
            main(
                [
                    "eval",
                    command[0],
                    str(path),
                    *command[1:],
                    "--lengths",
                    "16",
                    *extra,
                    "--out",
                    str(tmp_path),
                    "--no-progress",
                ]
            )
            == 2
        )
        assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_resume_is_keyed_on_the_model_content_not_its_path(checkpoint, tmp_path, capsys):
    source, text = checkpoint
    model_dir = tmp_path / "model"
    shutil.copytree(source, model_dir)
    argv = [
        "eval",
        "ppl",
        str(model_dir),
        "--data",
        str(text),
        "--lengths",
        "16",
        "--out",
        str(tmp_path / "out"),
        "--no-progress",
    ]
    assert main(argv) == 0
    first = json.loads((tmp_path / "out" / "ppl.json").read_text())["results"]["none/truncated"]
    assert main(argv) == 0
    assert "done in an earlier run, skipped" in capsys.readouterr().out
    # Retrain in place: same path, new weights.
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        model.lm_head.weight.mul_(3.0)
    model.save_pretrained(model_dir)
    capsys.readouterr()
    assert main(argv) == 2  # the earlier model's results would be replaced
    assert "another model" in capsys.readouterr().err
    assert json.loads((tmp_path / "out" / "ppl.json").read_text())["results"]["none/truncated"] == first
    assert main([*argv, "--overwrite"]) == 0
    assert "skipped" not in capsys.readouterr().out
    second = json.loads((tmp_path / "out" / "ppl.json").read_text())["results"]["none/truncated"]
    assert second["points"][0]["perplexity"] != first["points"][0]["perplexity"]
    # A moved folder is the same model: resumed.
    model_dir.rename(tmp_path / "moved")
    first = second
    assert main([*argv[:2], str(tmp_path / "moved"), *argv[3:]]) == 0
    assert "done in an earlier run, skipped" in capsys.readouterr().out


def test_none_after_a_method_is_the_checkpoint_as_loaded_even_a_patched_one(checkpoint, tmp_path):
    """Leaving a method's context restores the model on entry, not the checkpoint's base rope."""
    path, text = checkpoint
    patched = tmp_path / "yarn2"
    assert main(["patch", str(path), str(patched), "--method", "yarn", "--factor", "2"]) == 0
    out = tmp_path / "ppl"
    assert (
        main(
            [
                "eval",
                "ppl",
                str(patched),
                "--data",
                str(text),
                "--lengths",
                "16,64",
                "--method",
                "linear,none",
                "--factor",
                "4",
                "--out",
                str(out),
                "--no-progress",
            ]
        )
        == 0
    )
    results = json.loads((out / "ppl.json").read_text())["results"]
    assert results["none/truncated"]["patch"]["method"] == "yarn"
    assert results["none/truncated"]["patch"]["factor"] == 2
    model = AutoModelForCausalLM.from_pretrained(patched)
    docs = encode_documents(load_texts([str(text)]), byte_tokenizer())
    expected = [p.perplexity for p in truncated_perplexity(model, docs, [16, 64], progress=False)]
    assert [p["perplexity"] for p in results["none/truncated"]["points"]] == pytest.approx(expected, rel=1e-6)


def test_a_method_context_restores_the_model_bit_for_bit(checkpoint, tmp_path):
    path, _ = checkpoint
    model = patch_model(AutoModelForCausalLM.from_pretrained(path), "yarn", factor=2)
    ids = torch.arange(60)[None] % 50
    with torch.no_grad():
        before = model(ids).logits
        for method in ("linear", "self_extend", "alibi"):
            with eval_cli._Patched(model, method, 4 if method != "alibi" else None, {}):
                pass
            assert eval_cli.patch_info(model)["method"] == "yarn"
            assert torch.equal(model(ids).logits, before), method


@pytest.mark.parametrize("command", ["ppl", "passkey"])
def test_two_models_never_replace_each_others_results_in_the_default_out(
    checkpoint, tmp_path, capsys, monkeypatch, command
):
    source, text = checkpoint
    other = make_tiny_model(tmp_path / "other", hidden_size=32, max_position_embeddings=32, seed=1)
    monkeypatch.chdir(tmp_path)
    extra = (
        ["--data", str(text), "--lengths", "24"]
        if command == "ppl"
        else ["--lengths", "300", "--trials", "1", "--depths", "0.5"]
    )
    assert main(["eval", command, str(source), "--no-progress", *extra]) == 0
    saved = (tmp_path / "hf_posext_out" / f"eval-{command}" / f"{command}.json").read_text()
    capsys.readouterr()
    assert main(["eval", command, str(other), "--no-progress", *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{command}.json" in err and "another model" in err and "--overwrite" in err
    assert (tmp_path / "hf_posext_out" / f"eval-{command}" / f"{command}.json").read_text() == saved


def test_the_dtype_choices_are_the_loaders():
    assert eval_cli.DTYPES == evaluated_model.DTYPES


def test_load_model_is_still_importable_from_the_command_module():
    assert eval_cli.load_model is evaluated_model.load_model
    assert eval_cli.model_fingerprint is evaluated_model.model_fingerprint


def test_an_interrupted_passkey_keeps_its_finished_prompts_and_the_same_command_resumes(
    checkpoint, tmp_path, capsys, monkeypatch
):
    from hf_posext.eval import passkey

    path, _ = checkpoint
    argv = ["eval", "passkey", str(path), "--lengths", "300,400", "--depths", "0,1", "--trials", "2", "--no-progress"]
    generate, calls = passkey._generate, []

    def interrupted_at_the_fourth(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4 and interrupt:
            raise KeyboardInterrupt
        return generate(*args, **kwargs)

    interrupt = True

    monkeypatch.setattr(passkey, "_generate", interrupted_at_the_fourth)
    assert main([*argv, "--out", str(tmp_path / "cut")]) == 130
    kept = (tmp_path / "cut" / "passkey.prompts.jsonl").read_text().splitlines()
    assert len(kept) == 1 + 3  # the settings, then one line per finished prompt
    calls.clear()
    interrupt = False
    assert main([*argv, "--out", str(tmp_path / "cut")]) == 0
    assert len(calls) == 8 - 3  # only the prompts not finished before
    assert not (tmp_path / "cut" / "passkey.prompts.jsonl").exists()  # the result file holds them all now
    assert main([*argv, "--out", str(tmp_path / "straight")]) == 0
    resumed, straight = (json.loads((tmp_path / d / "passkey.json").read_text()) for d in ("cut", "straight"))
    assert resumed["results"] == straight["results"]


def test_a_prompt_log_cut_mid_line_or_of_other_settings_keeps_only_what_it_can_vouch_for(tmp_path):
    from hf_posext.eval.prompt_log import PromptLog

    file = tmp_path / "p.jsonl"
    log = PromptLog(file, {"model": "a"})
    log.add("none", 0, {"key": 1})
    log.add("none", 1, {"key": 2})
    file.write_text(file.read_text() + '{"key": "none", "index": 2, "va')  # killed while writing the third
    again = PromptLog(file, {"model": "a"})
    assert again.finished("none") == {0: {"key": 1}, 1: {"key": 2}}
    again.add("none", 2, {"key": 3})
    assert PromptLog(file, {"model": "a"}).finished("none") == {0: {"key": 1}, 1: {"key": 2}, 2: {"key": 3}}
    other = PromptLog(file, {"model": "b"})
    assert other.finished("none") == {}
    other.add("none", 0, {"key": 9})
    assert PromptLog(file, {"model": "a"}).finished("none") == {}
