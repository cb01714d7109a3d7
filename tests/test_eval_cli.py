"""``hf-posext eval ppl|passkey`` on a tiny saved checkpoint: files, numbers, resume, bad input."""

from __future__ import annotations

import csv
import json

import pytest
from transformers import AutoModelForCausalLM

from hf_posext import patch_model
from hf_posext.cli import main
from hf_posext.eval import encode_documents, load_texts, sliding_window_perplexity, truncated_perplexity
from hf_posext.fixtures import byte_tokenizer, make_tiny_model


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
    argv = ["eval", "ppl", str(path), "--data", str(text), "--lengths", "16,64", "--method", "none,yarn",
            "--factor", "2", "--mode", "both", "--stride", "8", "--out", str(out), "--no-progress"]
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
    argv = ["eval", "passkey", str(path), "--lengths", "300,400", "--depths", "0,1", "--trials", "1",
            "--method", "none,dynamic_yarn", "--factor", "16", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    report = json.loads((out / "passkey.json").read_text())
    for method in ("none", "dynamic_yarn"):
        result = report["results"][method]
        assert result["lengths"] == [300, 400] and len(result["accuracy"]) == 2
        assert len(result["samples"]) == 4
    assert (out / "passkey.png").stat().st_size > 0


def test_bad_input_is_reported(checkpoint, tmp_path, capsys):
    path, text = checkpoint
    assert main(["eval", "ppl", str(path), "--data", str(text), "--lengths", "16", "--method", "rotary",
                 "--factor", "2", "--out", str(tmp_path), "--no-progress"]) == 2
    assert "unknown method 'rotary'" in capsys.readouterr().err
    assert main(["eval", "ppl", str(path), "--data", str(tmp_path / "missing.txt"), "--lengths", "16",
                 "--out", str(tmp_path), "--no-progress"]) == 2
    assert "missing.txt" in capsys.readouterr().err
    assert main(["eval", "ppl", str(path), "--data", str(text), "--lengths", "16", "--method", "yarn",
                 "--out", str(tmp_path), "--no-progress"]) == 2
    assert "--method yarn needs --factor" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["eval", "ppl", str(path), "--lengths", "sixteen"])
