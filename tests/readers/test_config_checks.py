"""The checks of a rope config itself (hf_posext.readers.config_checks): each problem named, none on sound configs."""

from __future__ import annotations

import json

import pytest
from transformers import AutoConfig

import hf_posext
from hf_posext.commands.doctor import diagnose_path
from hf_posext.methods import available_methods, method_class
from hf_posext.readers.config_checks import check_config
from hf_posext.readers.shipped import SHIPPED, shipped_config_json

YARN = "YaRN saved by transformers 5 alone (`rope_parameters` only)"


def checks_of(tmp_path, config_json):
    folder = tmp_path / "ckpt"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config_json))
    return diagnose_path(str(folder))["checks"]


def tiny_llama_config():
    """A one-layer Llama config, 64 positions: what patch_model writes for it is checked."""
    return AutoConfig.for_model(
        "llama",
        vocab_size=97,
        hidden_size=128,
        num_attention_heads=4,
        head_dim=32,
        num_hidden_layers=1,
        max_position_embeddings=64,
    )


def yarn(**rope):
    config_json = shipped_config_json(YARN)
    config_json["rope_parameters"] = {**config_json["rope_parameters"], **rope}
    return config_json


@pytest.mark.parametrize("name", [n for n in SHIPPED if n != "a plain model (no rope fields)"])
def test_released_configs_have_no_problem(tmp_path, name):
    found = [c for c in checks_of(tmp_path, shipped_config_json(name)) if c["severity"] != "info"]
    # Phi-3 ships L0 beside the factor lists, which transformers 5 asks to be a factor: its own warning only
    assert all(c["check"] == "transformers-warns" for c in found), found


@pytest.mark.parametrize("method", available_methods())
def test_every_method_writes_a_config_with_no_problem(tmp_path, method):
    config = tiny_llama_config()
    kwargs = {"factor": 4} if method_class(method).scales_rope else {}
    hf_posext.patch_model(config, method, **kwargs).save_pretrained(tmp_path / "ckpt")
    found = diagnose_path(str(tmp_path / "ckpt"))["checks"]
    assert [c for c in found if c["severity"] != "info"] == []


def test_a_plain_model_is_said_to_be_one(tmp_path):
    (check,) = checks_of(tmp_path, shipped_config_json("a plain model (no rope fields)"))
    assert check["check"] == "no-rope-fields" and "plain RoPE" in check["message"] and "10000" in check["message"]


@pytest.mark.parametrize(
    "rope, check, words",
    [
        ({"factr": 4.0}, "unknown-key", "factr (4.0) is read by no reader"),
        ({"attn_factor": 1.2}, "ignored-key", "attn_factor (1.2) is read by vLLM, SGLang but not by transformers 5"),
        ({"beta_fast": 1, "beta_slow": 2}, "damaged-value", "rope_parameters.beta_fast = 1: beta_fast < beta_slow = 2"),
        ({"rope_theta": -1.0}, "damaged-value", "rope_parameters.rope_theta = -1.0: a positive finite number"),
        ({"factor": 0.5}, "damaged-value", "rope_parameters.factor = 0.5: a finite number >= 1"),
        (
            {"original_max_position_embeddings": 2048},
            "reach-mismatch",
            "reaches 8192, but max_position_embeddings is 16384",
        ),
    ],
)
def test_each_problem_is_named_with_its_value(tmp_path, rope, check, words):
    found = [c for c in checks_of(tmp_path, yarn(**rope)) if c["check"] == check]
    assert found and words in found[0]["message"], checks_of(tmp_path, yarn(**rope))


def test_a_missing_original_length_is_named(tmp_path):
    config_json = shipped_config_json("Llama 3.1 (`llama3`)")
    config_json["rope_scaling"] = {
        k: v for k, v in config_json["rope_scaling"].items() if k != "original_max_position_embeddings"
    }
    found = [c for c in check_config(config_json, None) if c["check"] == "missing-original"]
    assert found and "llama3 without original_max_position_embeddings" in found[0]["message"]


def test_legacy_fields_that_disagree_with_rope_parameters_are_named(tmp_path):
    config_json = yarn()
    config_json["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
    found = [c for c in checks_of(tmp_path, config_json) if c["check"] == "legacy-disagrees"]
    assert found and "transformers 4.x and 5 both read rope_scaling" in found[0]["message"]


def test_a_hand_edited_factor_is_told_from_the_patch_record(tmp_path):
    config = tiny_llama_config()
    hf_posext.patch_model(config, "linear", factor=4).save_pretrained(tmp_path / "ckpt")
    config_json = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    for key in ("rope_parameters", "rope_scaling"):
        config_json[key]["factor"] = 8.0
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(config_json))
    found = [c for c in diagnose_path(str(tmp_path / "ckpt"))["checks"] if c["check"] == "reach-mismatch"]
    assert found and "record says factor 4" in found[0]["message"] and "the rope says 8" in found[0]["message"]


def test_longrope_factor_lists_of_the_wrong_length_are_damaged(tmp_path):
    config_json = shipped_config_json("Phi-3 mini 128k (`longrope`)")
    config_json["rope_scaling"] = {**config_json["rope_scaling"], "long_factor": [1.0] * 47}
    found = [c for c in checks_of(tmp_path, config_json) if c["check"] == "damaged-value"]
    assert found and found[0]["field"] == "rope_scaling.long_factor"
    assert "'... (47 entries)']: 47 entries; the rotary dimension needs 48" in found[0]["message"]
