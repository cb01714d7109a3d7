"""hf_posext.verify: a model in memory against its config (issue 57, item 5).

Agreement for every registered method after patch_model, for plain transformers models of every
registry architecture and shipped scaling; a mismatch for each way a live model leaves its config:
the config edited after construction, frequencies tampered with, the attention not installed.
"""

from __future__ import annotations

import copy

import pytest
import torch
from scripts import registry
from tests.helpers.gguf_files import LLAMA3
from tests.helpers.models import ARCHITECTURES, tiny_model, tokens
from transformers import AutoModelForCausalLM

import hf_posext
from hf_posext.loading import set_construction_hook
from hf_posext.methods import method_class

#: Arguments each method takes on the tiny model (64 positions), reaching 256.
KWARGS = {"learned": {"max_length": 256}, "dynamic_ntk": {"factor": 4, "exact_cache": False}}
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64}
#: Scalings a plain transformers checkpoint ships (no hf-posext record).
SHIPPED = {
    "yarn": YARN,
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
    "llama3": LLAMA3,
    "longrope": {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "short_factor": [1.0] * 16,
        "long_factor": [1.0 + i / 8 for i in range(16)],
        "original_max_position_embeddings": 64,
        "factor": 4.0,
    },
}


def _kwargs(name):
    return KWARGS.get(name, {"factor": 4} if method_class(name).takes_factor else {})


def _fields(mismatches):
    return [m.field for m in mismatches]


@pytest.mark.parametrize("method", hf_posext.available_methods())
def test_every_registered_method_agrees_after_patch_model_and_after_a_long_forward(method):
    model = hf_posext.patch_model(tiny_model(attn_implementation="sdpa"), method, **_kwargs(method))
    assert hf_posext.verify(model) == []
    with torch.no_grad():
        model(tokens(200))  # past L0: dynamic and LongRoPE modules move to their long-context frequencies
    assert hf_posext.verify(model) == []


@pytest.mark.parametrize("method", ["yarn", "self_extend", "alibi", "learned"])
def test_a_reloaded_patched_checkpoint_agrees(method, tmp_path):
    hf_posext.patch_model(tiny_model(), method, **_kwargs(method)).save_pretrained(tmp_path)
    assert hf_posext.verify(hf_posext.from_pretrained(tmp_path)) == []


@pytest.mark.parametrize("model_type", hf_posext.SUPPORTED_MODEL_TYPES)
def test_every_supported_architecture_agrees_plain_and_patched(model_type):
    """Plain transformers models of the registry (per-layer-type rope, partial rotary, MLA...), then yarn on them."""
    model = registry.tiny_model(model_type)
    assert hf_posext.verify(model) == []
    method = "longrope" if model_type in ("phi3", "phimoe") else "yarn"  # their configs accept longrope only
    assert hf_posext.verify(hf_posext.patch_model(model, method, factor=4)) == []


@pytest.mark.parametrize("scaling", sorted(SHIPPED))
@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_plain_models_shipping_a_scaling_agree_also_in_bfloat16(arch, scaling):
    model = tiny_model(arch, rope_parameters=copy.deepcopy(SHIPPED[scaling]))
    assert hf_posext.verify(model) == []
    assert hf_posext.verify(model.to(torch.bfloat16)) == []  # frequencies rounded to bf16: the same rope


def test_a_rope_written_into_the_config_after_construction_is_reported():
    """The rotary caches its frequencies at construction: yarn set afterwards is a no-op, and verify says so."""
    model = tiny_model()
    model.config.rope_parameters = dict(YARN)
    mismatches = hf_posext.verify(model)
    assert _fields(mismatches) == ["rope_type", "inv_freq", "attention_scaling"]
    assert all(m.module == "model.rotary_emb" and m.layer_type is None for m in mismatches)
    assert "'yarn'" in str(mismatches[0]) and "'default'" in str(mismatches[0])
    assert "1.13863" in mismatches[2].expected and mismatches[2].found == "1"  # 0.1 ln 4 + 1


def test_a_config_replaced_on_the_model_after_construction_is_reported():
    model = tiny_model()
    replaced = copy.deepcopy(model.config)
    replaced.rope_parameters = dict(YARN)
    model.config = replaced
    (mismatch,) = hf_posext.verify(model)
    assert mismatch.field == "config" and "'yarn'" in mismatch.expected and "'default'" in mismatch.found


def test_a_dynamic_type_written_after_construction_is_reported_by_its_type():
    """dynamic's initial frequencies are plain RoPE's: only the type says that it never grows."""
    model = tiny_model()
    model.config.rope_parameters = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0}
    assert _fields(hf_posext.verify(model)) == ["rope_type"]


def test_a_patch_undone_in_the_config_by_another_script_is_reported():
    model = hf_posext.patch_model(tiny_model(), "yarn", factor=4)
    model.config.rope_parameters["factor"] = 8.0
    assert _fields(hf_posext.verify(model)) == ["inv_freq", "attention_scaling"]


def test_tampered_frequencies_and_scaling_are_reported():
    model = hf_posext.patch_model(tiny_model(), "yarn", factor=4)
    with torch.no_grad():
        model.model.rotary_emb.inv_freq[3] *= 1.001
    model.model.rotary_emb.attention_scaling = 1.0
    assert _fields(hf_posext.verify(model)) == ["inv_freq", "attention_scaling"]


def test_partial_rotary_agrees_and_a_changed_fraction_is_reported():
    model = registry.tiny_model("phi")  # partial_rotary_factor 0.5 of head_dim 32
    assert model.model.rotary_emb.inv_freq.numel() == 8 and hf_posext.verify(model) == []
    model.config.rope_parameters["partial_rotary_factor"] = 1.0
    assert _fields(hf_posext.verify(model)) == ["inv_freq"]


def test_per_layer_type_rope_is_checked_per_layer_type():
    per_type = [t for t in hf_posext.SUPPORTED_MODEL_TYPES if t.startswith("gemma3")]
    if not per_type:
        pytest.skip("no per-layer-type registry model in this transformers")
    model = registry.tiny_model(per_type[0])
    assert hf_posext.verify(model) == []
    layer_type = next(iter(model.config.rope_parameters))
    model.config.rope_parameters[layer_type]["rope_theta"] *= 2
    (mismatch,) = hf_posext.verify(model)
    assert (mismatch.layer_type, mismatch.field) == (layer_type, "inv_freq") and f"[{layer_type}]" in str(mismatch)


def test_an_attention_implementation_changed_after_the_patch_is_reported():
    model = hf_posext.patch_model(tiny_model(), "alibi")
    model.set_attn_implementation("sdpa")
    (mismatch,) = hf_posext.verify(model)
    assert mismatch.field == "surgery" and "ALiBi attention" in str(mismatch)


@pytest.mark.parametrize("method", ["self_extend", "dca", "string", "rerope", "learned"])
def test_a_recorded_method_whose_surgery_is_not_installed_is_reported(method, tmp_path):
    """Built by plain transformers without the construction hook: the record says the method, the model lacks it."""
    hf_posext.patch_model(tiny_model(), method, **_kwargs(method)).save_pretrained(tmp_path)
    set_construction_hook(False)
    try:
        model = AutoModelForCausalLM.from_pretrained(tmp_path)
    finally:
        set_construction_hook(True)
    mismatches = hf_posext.verify(model)
    assert _fields(mismatches) == ["surgery"] and repr(method) in str(mismatches[0])


def test_a_peft_model_is_looked_through():
    peft = pytest.importorskip("peft")
    model = tiny_model()
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj"]))
    assert hf_posext.verify(wrapped) == []
    model.config.rope_parameters = dict(YARN)
    assert "inv_freq" in _fields(hf_posext.verify(wrapped))
