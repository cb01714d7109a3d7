"""``hf-posext doctor PATH [--json]``: a folder, a Hub id from huggingface_hub's cache (offline), a GGUF file."""

from __future__ import annotations

import json
import re

import pytest
from tests.helpers.gguf_files import write_tiny_gguf

from hf_posext.commands.main import main
from hf_posext.readers import ANSWERS
from hf_posext.readers.registry import READERS as REGISTRY
from hf_posext.readers.shipped import shipped_config_json

READERS = [reader.key for reader in REGISTRY]

QWEN = "Qwen2.5 with YaRN (`yarn`, as its model card adds it)"


def one_line_error(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    return lines[0]


def write_config(folder, config_json):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config_json))
    return folder


def test_json_names_every_reader_with_a_verdict_and_why(tmp_path, capsys):
    folder = write_config(tmp_path / "qwen", shipped_config_json(QWEN))
    assert main(["doctor", str(folder), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert list(report["readers"]) == list(READERS)
    assert list(READERS) == ["transformers5", "transformers5_hf_posext", "transformers4", "vllm", "sglang", "llamacpp"]
    for finding in report["readers"].values():
        assert finding["verdict"] in ANSWERS and finding["why"] and finding["rules"]
        assert finding["checked"] in ("run here", "read from source")
    assert report["rope"]["reach"] == 131072 and isinstance(report["checks"], list)


def test_the_text_report_has_a_line_per_reader_and_the_checks(tmp_path, capsys):
    folder = write_config(
        tmp_path / "t5", shipped_config_json("YaRN saved by transformers 5 alone (`rope_parameters` only)")
    )
    assert main(["doctor", str(folder)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"transformers4 +misread", out) and "config:" in out and "[read from source]" in out


def test_a_hub_id_is_read_from_the_hub_cache_offline(tmp_path, capsys, monkeypatch):
    """huggingface_hub's cache layout: models--ORG--NAME/{refs/main, snapshots/<commit>/config.json}."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--someorg--tiny-qwen"
    write_config(repo / "snapshots" / commit, shipped_config_json(QWEN))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    assert main(["doctor", "someorg/tiny-qwen", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rope"]["rope_type"] == "yarn"
    assert main(["doctor", "someorg/not-cached"]) == 2
    assert "'someorg/not-cached' is no local path" in one_line_error(capsys)


def gguf_readers(capsys, path) -> dict:
    assert main(["doctor", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)["readers"]


def test_a_plain_gguf_is_read_the_same_by_llamacpp_and_transformers(tmp_path, capsys):
    readers = gguf_readers(capsys, write_tiny_gguf(tmp_path / "plain.gguf"))
    assert readers["llamacpp"]["verdict"] == "same" and readers["transformers5"]["verdict"] == "same"
    assert {readers[k]["verdict"] for k in ("transformers4", "vllm", "sglang")} == {"unknown"}


def test_a_yarn_gguf_with_betas_llamacpp_does_not_read_is_misread(tmp_path, capsys):
    path = write_tiny_gguf(
        tmp_path / "yarn.gguf",
        **{
            "rope.scaling.type": "yarn",
            "rope.scaling.factor": 4.0,
            "rope.scaling.original_context_length": 64.0,
            "rope.scaling.yarn_beta_fast": 16.0,
        },
    )
    readers = gguf_readers(capsys, path)
    assert readers["llamacpp"]["verdict"] == "misread" and "rope.scaling.yarn_beta_fast" in readers["llamacpp"]["why"]
    assert readers["transformers5"]["verdict"] == "misread"


def test_a_longrope_gguf_without_factor_tensors_runs_as_plain_rope(tmp_path, capsys):
    readers = gguf_readers(capsys, write_tiny_gguf(tmp_path / "lr.gguf", **{"rope.scaling.type": "longrope"}))
    assert readers["llamacpp"]["verdict"] == "misread" and "plain RoPE" in readers["llamacpp"]["why"]


def test_transformers_gguf_loader_drops_a_files_rope_scaling(tmp_path):
    """The rule behind transformers 5's ``misread`` of a scaled GGUF, run: its config keeps theta and length only."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path = write_tiny_gguf(
        tmp_path / "yarn.gguf",
        **{"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 64.0},
    )
    config = load_gguf_checkpoint(str(path), return_tensors=False)["config"]
    assert config["max_position_embeddings"] == 64 and config["rope_theta"] == 10000.0
    assert not any("scaling" in key or key == "rope_parameters" for key in config), config


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda p: p / "missing", "does not exist (a local path"),
        (lambda p: (p / "empty").mkdir() or p / "empty", "is a folder without config.json: not a checkpoint"),
        (lambda p: (p / "notes.txt").write_text("x") and p / "notes.txt", "is a file but not a .gguf file"),
        (lambda p: (p / "bad.gguf").write_bytes(b"NOPE" * 8) and p / "bad.gguf", "is not a GGUF file"),
        (
            lambda p: write_config(p / "gpt2", {"model_type": "gpt2", "n_embd": 64, "n_head": 2, "n_layer": 1}),
            "model_type 'gpt2' has no rotary position embedding",
        ),
        (lambda p: write_config(p / "remote", {"model_type": "my_custom_lm"}), "model_type 'my_custom_lm' is not one"),
        (
            lambda p: (p / "broken").mkdir() or (p / "broken" / "config.json").write_text("{") and p / "broken",
            "is not valid JSON",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, make, words):
    assert main(["doctor", str(make(tmp_path))]) == 2
    assert words in one_line_error(capsys)


def test_a_config_transformers_refuses_is_answered_not_an_error(tmp_path, capsys):
    config_json = shipped_config_json(QWEN)
    config_json["rope_scaling"] = {"factr": 4.0, "type": "yarn", "original_max_position_embeddings": 32768}
    assert main(["doctor", str(write_config(tmp_path / "typo", config_json)), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["readers"]["transformers5"]["verdict"] == "refused"
    assert "Missing required keys" in report["readers"]["transformers5"]["why"]
    assert report["readers"]["vllm"]["verdict"] == "refused"
    assert any(c["check"] == "unknown-key" and "factr" in c["message"] for c in report["checks"])
