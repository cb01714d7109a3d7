"""Every command reports a malformed config or file in one line on stderr with exit code 2 (issue 24, item 7).

The table below breaks every rope field a config can carry in type, range and presence, and
``max_position_embeddings``, ``partial_rotary_factor`` and the hf-posext record besides; each case is
fed to ``hf-posext patch``, ``hf-posext eval ppl``, ``hf-posext eval passkey`` and the fine-tune
recipe (``hf-posext finetune``). Each must exit with code 2 and print exactly one line on stderr,
which names the bad field and the file. Plus the files of item 7 and 6: a truncated ``.gguf``, a
sharded checkpoint with a shard missing, a 0-byte or truncated ``model.safetensors``, and
``--device cuda:0`` without CUDA.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

from hf_posext.commands.finetune import main as finetune_main
from hf_posext.commands.main import main
from hf_posext.rope_utils import NO_ROPE_TYPE
from hf_posext.testing import make_tiny_model

ROOT = Path(__file__).resolve().parents[1]
L_ORIG = 32
HALF = 8  # rotary pairs of the tiny model: head_dim 16
NO_ROPE = {"rope_type": NO_ROPE_TYPE, "rope_theta": 10000.0}
LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8,
}
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 8}
LONGROPE = {
    "rope_type": "longrope",
    "rope_theta": 10000.0,
    "short_factor": [1.0] * HALF,
    "long_factor": [2.0] * HALF,
    "original_max_position_embeddings": 8,
}
LINEAR = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}
DYNAMIC = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
MISSING = object()


def _with(rope: dict, **changes) -> dict:
    rope = copy.deepcopy(rope)
    for key, value in changes.items():
        if value is MISSING:
            rope.pop(key, None)
        else:
            rope[key] = value
    return {"rope_parameters": rope}


#: (case id, top-level config changes, a word the error must name). A yarn or llama3 entry without
#: original_max_position_embeddings is not among them: transformers reads it as max_position_embeddings.
CASES = [
    ("max_positions_text", {"max_position_embeddings": "64"}, "max_position_embeddings"),
    ("max_positions_zero", {"max_position_embeddings": 0}, "max_position_embeddings"),
    ("max_positions_negative", {"max_position_embeddings": -8}, "max_position_embeddings"),
    ("max_positions_fraction", {"max_position_embeddings": 31.5}, "max_position_embeddings"),
    ("rope_parameters_text", {"rope_parameters": "yarn"}, "rope_parameters"),
    ("rope_type_number", _with(YARN, rope_type=3), "rope_type"),
    ("rope_type_unknown", _with(YARN, rope_type="rotary9"), "rotary9"),
    ("rope_theta_text", _with({"rope_type": "default", "rope_theta": "10000"}), "rope_theta"),
    ("rope_theta_zero", _with({"rope_type": "default", "rope_theta": 0}), "rope_theta"),
    ("rope_theta_negative", _with(YARN, rope_theta=-1.0), "rope_theta"),
    ("rope_theta_one", _with({"rope_type": "default", "rope_theta": 1.0}), "rope_theta"),
    (
        "partial_rotary_zero",
        _with({"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0}),
        "partial_rotary_factor",
    ),
    (
        "partial_rotary_two",
        _with({"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 2.0}),
        "partial_rotary_factor",
    ),
    (
        "partial_rotary_text",
        _with({"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": "0.5"}),
        "partial_rotary_factor",
    ),
    ("linear_no_factor", _with(LINEAR, factor=MISSING), "factor"),
    ("linear_factor_text", _with(LINEAR, factor="2"), "factor"),
    ("linear_factor_half", _with(LINEAR, factor=0.5), "factor"),
    ("dynamic_factor_zero", _with(DYNAMIC, factor=0), "factor"),
    ("dynamic_factor_nan", _with(DYNAMIC, factor=float("nan")), "factor"),
    ("yarn_no_factor", _with(YARN, factor=MISSING), "factor"),
    ("yarn_factor_negative", _with(YARN, factor=-4.0), "factor"),
    ("yarn_original_text", _with(YARN, original_max_position_embeddings="8"), "original_max_position_embeddings"),
    ("yarn_original_zero", _with(YARN, original_max_position_embeddings=0), "original_max_position_embeddings"),
    ("yarn_original_fraction", _with(YARN, original_max_position_embeddings=7.5), "original_max_position_embeddings"),
    ("yarn_beta_fast_text", _with(YARN, beta_fast="32"), "beta_fast"),
    ("yarn_beta_slow_text", _with(YARN, beta_slow=[1]), "beta_slow"),
    ("yarn_betas_swapped", _with(YARN, beta_fast=1.0, beta_slow=32.0), "beta_fast"),
    ("yarn_attention_factor_text", _with(YARN, attention_factor="1"), "attention_factor"),
    ("yarn_attention_factor_negative", _with(YARN, attention_factor=-1.0), "attention_factor"),
    ("yarn_truncate_text", _with(YARN, truncate="no"), "truncate"),
    ("llama3_no_low_freq_factor", _with(LLAMA3, low_freq_factor=MISSING), "low_freq_factor"),
    ("llama3_no_high_freq_factor", _with(LLAMA3, high_freq_factor=MISSING), "high_freq_factor"),
    ("llama3_low_freq_factor_text", _with(LLAMA3, low_freq_factor="1"), "low_freq_factor"),
    ("llama3_low_freq_factor_zero", _with(LLAMA3, low_freq_factor=0), "low_freq_factor"),
    ("llama3_freq_factors_equal", _with(LLAMA3, high_freq_factor=1.0), "high_freq_factor"),
    ("llama3_no_factor", _with(LLAMA3, factor=MISSING), "factor"),
    ("llama3_low_freq_factor_null", _with(LLAMA3, low_freq_factor=None), "low_freq_factor"),
    ("yarn_beta_slow_null_above_beta_fast", _with(YARN, beta_fast=0.5, beta_slow=None), "beta_fast"),
    ("longrope_short_factor_length", _with(LONGROPE, short_factor=[1.0] * (HALF - 1)), "short_factor"),
    ("longrope_long_factor_length", _with(LONGROPE, long_factor=[2.0] * (HALF + 3)), "long_factor"),
    ("longrope_long_factor_text", _with(LONGROPE, long_factor="2"), "long_factor"),
    ("longrope_short_factor_entries", _with(LONGROPE, short_factor=["1"] * HALF), "short_factor"),
    ("longrope_long_factor_zero", _with(LONGROPE, long_factor=[0.0] * HALF), "long_factor"),
    ("longrope_no_long_factor", _with(LONGROPE, long_factor=MISSING), "long_factor"),
    ("longrope_attention_factor_text", _with(LONGROPE, attention_factor="x"), "attention_factor"),
    # with a rope type that is not transformers' own (one with, a plugin's method, loads: tests/test_loading.py)
    ("record_unknown_method", {"hf_posext": {"method": "rotary9"}, "rope_parameters": NO_ROPE}, "rotary9"),
    ("record_not_a_mapping", {"hf_posext": "yarn"}, "hf_posext"),
]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("malformed")
    make_tiny_model(root / "base", hidden_size=32, num_heads=2, num_kv_heads=1, max_position_embeddings=L_ORIG)
    text = root / "data.txt"
    text.write_text((Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py").read_text())
    return root, text


def checkpoint_with(assets, tmp_path, changes) -> Path:
    """The tiny checkpoint with ``changes`` written into its config.json (weights linked, not copied)."""
    root, _ = assets
    folder = tmp_path / "model"
    folder.mkdir()
    for item in (root / "base").iterdir():
        if item.name != "config.json":
            (folder / item.name).symlink_to(item)
    config = json.loads((root / "base" / "config.json").read_text())
    config.update(changes)
    config = {key: value for key, value in config.items() if value is not MISSING}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def run_patch(model: Path, tmp_path: Path, text: Path) -> int:
    return main(["patch", str(model), str(tmp_path / "out"), "--method", "yarn", "--factor", "2"])


def run_ppl(model: Path, tmp_path: Path, text: Path, *extra: str) -> int:
    return main(
        [
            "eval",
            "ppl",
            str(model),
            "--data",
            str(text),
            "--lengths",
            "16",
            "--out",
            str(tmp_path / "out"),
            "--no-progress",
            *extra,
        ]
    )


def run_passkey(model: Path, tmp_path: Path, text: Path, *extra: str) -> int:
    return main(
        [
            "eval",
            "passkey",
            str(model),
            "--lengths",
            "64",
            "--depths",
            "0",
            "--trials",
            "1",
            "--out",
            str(tmp_path / "out"),
            "--no-progress",
            *extra,
        ]
    )


def run_finetune(model: Path, tmp_path: Path, text: Path) -> int:
    return finetune_main(
        [
            "--model",
            str(model),
            "--method",
            "yarn",
            "--factor",
            "2",
            "--dataset",
            str(text),
            "--output-dir",
            str(tmp_path / "out"),
            "--max-train-steps",
            "1",
            "--warmup-steps",
            "0",
            "--global-batch-size",
            "1",
            "--micro-batch-size",
            "1",
            "--mixed-precision",
            "no",
            "--cache-dir",
            str(tmp_path / "cache"),
        ]
    )


COMMANDS = {"patch": run_patch, "eval_ppl": run_ppl, "eval_passkey": run_passkey, "finetune": run_finetune}


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize(("changes", "field"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_a_malformed_config_is_one_line_and_exit_code_2(assets, tmp_path, capsys, command, changes, field):
    model = checkpoint_with(assets, tmp_path, changes)
    code = COMMANDS[command](model, tmp_path, assets[1])
    line = one_error_line(capsys)
    assert code == 2, line
    assert field in line and str(model / "config.json") in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", ["llama3_no_low_freq_factor", "longrope_short_factor_length", "max_positions_text"])
def test_the_installed_command_prints_exactly_one_line(assets, tmp_path, case):
    """In a real process: transformers' own warnings (its logger writes to the real stderr) are lines too."""
    changes = next(changes for name, changes, _ in CASES if name == case)
    model = checkpoint_with(assets, tmp_path, changes)
    command = [
        sys.executable,
        "-m",
        "hf_posext",
        "patch",
        str(model),
        str(tmp_path / "out"),
        "--method",
        "yarn",
        "--factor",
        "2",
    ]
    result = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False
    )
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_the_unbroken_checkpoint_passes_every_command(assets, tmp_path, capsys):
    """The table's base checkpoint is valid: each case fails for its one broken field."""
    model = checkpoint_with(assets, tmp_path, {})
    for name in ("patch", "eval_ppl"):
        assert COMMANDS[name](model, tmp_path / name, assets[1]) == 0, capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("command", ["eval_ppl", "eval_passkey"])
def test_a_cuda_device_without_cuda_is_one_line(assets, tmp_path, capsys, command):
    model = checkpoint_with(assets, tmp_path, {})
    assert COMMANDS[command](model, tmp_path, assets[1], "--device", "cuda:0") == 2
    assert "--device cuda:0" in one_error_line(capsys)


def broken_weights(folder: Path, damage: str) -> str:
    """Damage the weights of ``folder`` (a copy); the name of the file the error must name."""
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.unlink()
    if damage == "empty":
        weights.write_bytes(b"")
    elif damage == "truncated":
        weights.write_bytes(data[: len(data) // 2])
    elif damage == "header":
        weights.write_bytes(b"\xff" * 8 + data[8:])
    else:  # a sharded checkpoint whose index names a shard that is not there
        header = int.from_bytes(data[:8], "little")
        names = list(json.loads(data[8 : 8 + header]))
        (folder / "model-00001-of-00002.safetensors").write_bytes(data)
        index = {
            "metadata": {},
            "weight_map": {n: "model-00001-of-00002.safetensors" for n in names if n != "__metadata__"},
        }
        index["weight_map"]["lm_head.weight"] = "model-00002-of-00002.safetensors"
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
        return "model-00002-of-00002.safetensors"
    return "model.safetensors"


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("damage", ["empty", "truncated", "header", "missing_shard"])
def test_broken_weights_are_refused_naming_the_file(assets, tmp_path, capsys, command, damage):
    model = tmp_path / "model"
    shutil.copytree(assets[0] / "base", model)
    name = broken_weights(model, damage)
    assert COMMANDS[command](model, tmp_path, assets[1]) == 2
    line = one_error_line(capsys)
    assert name in line, line
    assert not (tmp_path / "out").exists()


def test_published_layouts_are_read(assets, tmp_path):
    """No false refusal: transformers 4's layout (rope_scaling; theta and a partial rotary factor at the top
    level, as Phi-4-mini writes them) with longrope lists of the partial rotary pairs."""
    from hf_posext.validation.saved_model import read_config

    pairs = HALF // 2
    changes = {
        "rope_scaling": {
            "type": "longrope",
            "short_factor": [1.0] * pairs,
            "long_factor": [2.0] * pairs,
            "original_max_position_embeddings": 8,
        },
        "rope_theta": 500000.0,
        "partial_rotary_factor": 0.5,
        "rope_parameters": MISSING,
    }
    config = read_config(checkpoint_with(assets, tmp_path, changes))
    assert config.rope_parameters["rope_type"] == "longrope" and config.rope_parameters["rope_theta"] == 500000.0
    # a rope type a model's own config renames when it reads it (Phi-3's "su" is longrope)
    phi3 = {**changes, "model_type": "phi3", "architectures": ["Phi3ForCausalLM"]}
    phi3["rope_scaling"] = {**changes["rope_scaling"], "type": "su"}
    (tmp_path / "phi3").mkdir()
    assert read_config(checkpoint_with(assets, tmp_path / "phi3", phi3)).rope_parameters["rope_type"] == "longrope"
