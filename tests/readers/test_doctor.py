"""``hf-posext doctor``'s verdicts (hf_posext.readers.doctor) on every method's saved config and on released ones.

The engines' verdicts must be :func:`hf_posext.readers.support`'s (one source of truth); transformers 5's
``transformers5`` (no ``import hf_posext``) is checked against a real transformers 5 that cannot import it; the released
configs' expected verdicts are what each reader's source does with them (docs/readers/index.md).
"""

from __future__ import annotations

import json

import pytest
from tests.helpers.models import tiny_model
from scripts.vanilla import vanilla_load_errors
from transformers import AutoConfig, LlamaConfig

import hf_posext
from hf_posext.commands.doctor import diagnose_path
from hf_posext.methods import available_methods, method_class
from hf_posext.readers import sglang, support, vllm
from hf_posext.readers import ANSWERS, Finding
from hf_posext.readers.doctor import diagnose
from hf_posext.readers.registry import READERS as REGISTRY
from hf_posext.readers.shipped import SHIPPED, shipped_config_json

READERS = {reader.key: reader.name for reader in REGISTRY}

L_ORIG = 64


def kwargs_of(method):
    return {"factor": 4} if method_class(method).scales_rope else {}


def saved_folder(tmp_path, method, arch="llama", weights=False, **kwargs):
    folder = tmp_path / f"{arch}-{method}"
    if weights:
        hf_posext.patch_model(tiny_model(arch, max_positions=L_ORIG), method, **kwargs).save_pretrained(folder)
    else:
        config = AutoConfig.for_model(
            arch,
            vocab_size=97,
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            max_position_embeddings=L_ORIG,
        )
        hf_posext.patch_model(config, method, **kwargs).save_pretrained(folder)
    return folder


def shipped_folder(tmp_path, name, **changes):
    folder = tmp_path / f"shipped-{list(SHIPPED).index(name)}"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**shipped_config_json(name), **changes}))
    return folder


@pytest.mark.parametrize("method", available_methods())
def test_engine_verdicts_are_the_support_rules(tmp_path, method):
    report = diagnose_path(str(saved_folder(tmp_path, method, **kwargs_of(method))))
    config = AutoConfig.from_pretrained(tmp_path / f"llama-{method}")
    expected = support(config, config.hf_posext["context_length"])
    assert set(report["readers"]) == set(READERS)
    for key in ("vllm", "sglang"):
        assert report["readers"][key]["verdict"] == expected[READERS[key]][0], key
    converter = report["readers"]["llamacpp"]["routes"]["converter"]
    assert converter["verdict"] == expected["llama.cpp"][0]
    for finding in report["readers"].values():
        assert finding["verdict"] in ANSWERS and finding["why"] and finding["rules"]


def test_transformers5_without_the_plugin_refuses_exactly_where_a_transformers_without_it_refuses(tmp_path):
    folders = [saved_folder(tmp_path, m, weights=True, **kwargs_of(m)) for m in available_methods()]
    errors = vanilla_load_errors([(folder, {}) for folder in folders])
    for method, folder, error in zip(available_methods(), folders, errors):
        readers = diagnose_path(str(folder))["readers"]
        assert (readers["transformers5"]["verdict"] == "refused") == (error is not None), (method, error)
        assert readers["transformers5_hf_posext"]["verdict"] == "same"


#: What each reader's rules say of the released configs (docs/readers/index.md): the expected verdicts.
SHIPPED_VERDICTS = {
    "Llama 3.1 (`llama3`)": ("same", "same", "same", "same", "same", "same"),
    "Qwen2.5 with YaRN (`yarn`, as its model card adds it)": ("same", "same", "same", "same", "same", "same"),
    "Phi-3 mini 128k (`longrope`)": ("same", "same", "same", "same", "same", "unknown"),
    "vicuna-13b-v1.5-16k (`linear`)": ("same", "same", "same", "same", "same", "same"),
    "dynamic NTK in `rope_scaling`": ("same", "same", "same", "misread", "misread", "misread"),
    "a plain model (no rope fields)": ("same", "same", "same", "same", "same", "same"),
    "YaRN saved by transformers 5 alone (`rope_parameters` only)": ("same", "same", "misread", "same", "same", "same"),
}


def test_every_shipped_config_has_expected_verdicts():
    assert set(SHIPPED_VERDICTS) == set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_released_configs_get_their_readers_verdicts(tmp_path, name):
    report = diagnose_path(str(shipped_folder(tmp_path, name)))
    assert tuple(report["readers"][key]["verdict"] for key in READERS) == SHIPPED_VERDICTS[name]


def test_qwen25_yarn_says_which_engines_need_the_context_passed(tmp_path):
    readers = diagnose_path(str(shipped_folder(tmp_path, "Qwen2.5 with YaRN (`yarn`, as its model card adds it)")))[
        "readers"
    ]
    assert "131072" in readers["vllm"]["why"] and "--max-model-len" not in readers["vllm"]["why"]
    assert "--context-length 131072" in readers["sglang"]["why"]
    assert "-c 131072" in readers["llamacpp"]["why"]


def test_a_config_transformers_5_saved_alone_is_misread_by_transformers_4_naming_why(tmp_path):
    name = "YaRN saved by transformers 5 alone (`rope_parameters` only)"
    finding = diagnose_path(str(shipped_folder(tmp_path, name)))["readers"]["transformers4"]
    assert "never rope_parameters" in finding["why"] and "plain RoPE" in finding["why"]


def test_longrope_without_a_top_level_original_is_misread_by_transformers_4(tmp_path):
    rope = {"rope_type": "longrope", "short_factor": [1.0] * 16, "long_factor": [1.0 + i for i in range(16)]}
    config_json = {**shipped_config_json("a plain model (no rope fields)"), "max_position_embeddings": 16384}
    config_json["rope_scaling"] = {**rope, "original_max_position_embeddings": 4096, "factor": 4.0}
    folder = tmp_path / "longrope"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config_json))
    finding = diagnose_path(str(folder))["readers"]["transformers4"]
    assert finding["verdict"] == "misread" and "top-level original_max_position_embeddings" in finding["why"]


def test_phi3_rope_scaling_with_more_than_its_three_fields_is_refused_by_transformers_4(tmp_path):
    config_json = shipped_config_json("Phi-3 mini 128k (`longrope`)")
    config_json["rope_scaling"] = {**config_json["rope_scaling"], "original_max_position_embeddings": 4096}
    folder = tmp_path / "phi3"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config_json))
    finding = diagnose_path(str(folder))["readers"]["transformers4"]
    assert finding["verdict"] == "refused" and "three fields" in finding["why"]


@pytest.mark.parametrize(
    "method, llamacpp", [("longrope", "misread"), ("dynamic_ntk", "misread"), ("learned", "refused")]
)
def test_llamacpp_verdict_sums_up_its_two_routes(tmp_path, method, llamacpp):
    finding = diagnose_path(str(saved_folder(tmp_path, method, **kwargs_of(method))))["readers"]["llamacpp"]
    assert finding["verdict"] == llamacpp
    assert set(finding["routes"]) == {"converter", "gguf_export"}
    assert finding["verdict"] == finding["routes"]["converter"]["verdict"]  # the converter is the reader
    if method == "longrope":
        assert finding["routes"]["gguf_export"]["verdict"] == "same"


def test_transformers5_is_answered_without_and_with_the_plugin(tmp_path):
    readers = diagnose_path(str(saved_folder(tmp_path, "dynamic_yarn", factor=4)))["readers"]
    assert readers["transformers5"]["verdict"] == "refused"
    assert readers["transformers5_hf_posext"]["verdict"] == "same"


def test_vllm_and_sglang_build_llama3_rope():
    """vLLM 07b12f1 and SGLang 108c36c ``get_rope`` both have a ``llama3`` branch (was: refused, wrongly)."""
    config = AutoConfig.for_model(
        "llama", **{k: v for k, v in shipped_config_json("Llama 3.1 (`llama3`)").items() if k != "model_type"}
    )
    assert vllm.effective_rope(config)["kind"] == "llama3"
    assert sglang.effective_rope(config, 32)["kind"] == "llama3"


def test_a_finding_refuses_a_verdict_outside_the_vocabulary():
    with pytest.raises(ValueError, match="'maybe' is not one of same, misread, refused, unknown"):
        Finding("maybe", "why", "rules", "run here")


def test_per_layer_type_rope_is_answered_as_not_checked_for_the_engines():
    config = LlamaConfig(vocab_size=97, hidden_size=64, num_attention_heads=2, num_hidden_layers=1)
    config.rope_parameters = {
        "full_attention": {"rope_type": "default", "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
    }
    readers = diagnose({"model_type": "llama"}, config)["readers"]
    assert readers["transformers5"]["verdict"] == "same"
    assert {readers[k]["verdict"] for k in ("transformers4", "vllm", "sglang", "llamacpp")} == {"unknown"}


def test_longrope_with_neither_a_top_level_original_nor_a_factor_is_refused_by_transformers_4(tmp_path):
    """4.57.6 compares the missing factor with 1.0: a TypeError while building the rope (run: test_doctor_readers)."""
    rope = {"rope_type": "longrope", "short_factor": [1.0] * 16, "long_factor": [2.0] * 16}
    config_json = {**shipped_config_json("a plain model (no rope fields)"), "max_position_embeddings": 16384}
    config_json["rope_scaling"] = {**rope, "original_max_position_embeddings": 4096}
    folder = tmp_path / "longrope"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config_json))
    finding = diagnose_path(str(folder))["readers"]["transformers4"]
    assert finding["verdict"] == "refused" and "TypeError" in finding["why"]
