"""patch_model is all or nothing: checks first, then surgery, undone on failure."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tests.helpers.models import tiny_config, tiny_model, tokens
from transformers import AutoModelForCausalLM

import hf_posext
from hf_posext.methods import method_class
from hf_posext.methods.absolute.surgery import POSITIONS_ATTR
from hf_posext.methods.registry import surgery_for

L_ORIG = 64


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def state(model):
    """Everything a failed patch must leave alone: config, weights, module objects, attention path."""
    return (
        model.config.to_dict(),
        model.config._attn_implementation,
        {name: id(module) for name, module in model.named_modules()},
        {name: tensor.clone() for name, tensor in model.state_dict().items()},
        len(model.model._forward_pre_hooks),
    )


def assert_same_state(before, after):
    assert after[:3] == before[:3]
    assert after[3].keys() == before[3].keys()
    assert all(torch.equal(after[3][k], before[3][k]) for k in before[3])
    assert after[4] == before[4]


BAD_PATCHES = [
    (("yarn", 4), {"beta_fast": float("nan")}, r"beta_fast must be a finite number > 0, got nan"),
    (("yarn", 4), {"attention_factor": float("nan")}, r"attention_factor must be a finite number > 0 or None, got nan"),
    (("dynamic_yarn", 4), {"attention_factor": float("inf")}, r"attention_factor must be a finite number"),
    (("yarn", 1e308), {}, r"factor=1e\+308 times the original context 64 is inf tokens"),
    (("linear", 4e7), {}, r"beyond the 2147483647 positions"),
    (("learned",), {"max_length": 0}, r"max_length must be a positive int"),
]


@pytest.mark.parametrize("first", [None, ("learned",), ("alibi",), ("dynamic_yarn", 2)])
@pytest.mark.parametrize("args,kwargs,message", BAD_PATCHES)
def test_a_rejected_patch_changes_nothing(first, args, kwargs, message):
    model = tiny_model(max_positions=L_ORIG)
    if first is not None:
        hf_posext.patch_model(model, *first)
    ids = tokens(20)
    before, expected = state(model), logits(model, ids)
    with pytest.raises(ValueError, match=message):
        hf_posext.patch_model(model, *args, **kwargs)
    assert_same_state(before, state(model))
    assert torch.equal(logits(model, ids), expected)


@pytest.mark.parametrize("first", [None, ("yarn", 2), ("dynamic_yarn", 2)])
@pytest.mark.parametrize("method", ["learned", "alibi", "dynamic_yarn"])
def test_a_failure_during_module_surgery_is_undone(monkeypatch, first, method):
    # Validation cannot foresee every fault (out of memory, a bug in a surgery): whatever the
    # surgery did before it failed is rolled back.
    model = tiny_model(max_positions=L_ORIG)
    if first is not None:
        hf_posext.patch_model(model, *first)
    ids = tokens(20)
    before, expected = state(model), logits(model, ids)
    surgery_cls = type(surgery_for(method_class(method)))
    surgery = surgery_cls.patch_modules

    def fail_after_surgery(self, *args, **kwargs):
        surgery(self, *args, **kwargs)
        raise RuntimeError("simulated fault during module surgery")

    monkeypatch.setattr(surgery_cls, "patch_modules", fail_after_surgery)
    with pytest.raises(RuntimeError, match="simulated fault"):
        hf_posext.patch_model(model, method, 2 if method == "dynamic_yarn" else None)
    monkeypatch.undo()
    assert_same_state(before, state(model))
    assert torch.equal(logits(model, ids), expected)
    hf_posext.patch_model(model, method, 2 if method == "dynamic_yarn" else None)  # still patchable
    if first is None:
        hf_posext.unpatch_model(model)
        assert torch.equal(logits(model, ids), expected)


@pytest.mark.parametrize("method,factor", [("alibi", None), ("dynamic_yarn", 4), ("yarn", 4), ("learned", None)])
def test_a_config_shared_by_two_models_changes_only_the_patched_one(method, factor):
    config = tiny_config(max_positions=L_ORIG)
    torch.manual_seed(0)
    other = AutoModelForCausalLM.from_config(config).eval()
    patched = AutoModelForCausalLM.from_config(config).eval()
    assert other.config is patched.config  # the situation of the bug
    ids = tokens(3 * L_ORIG)
    expected, saved = logits(other, ids), config.to_dict()
    hf_posext.patch_model(patched, method, factor)
    assert hf_posext.patch_info(patched)["method"] == method
    assert hf_posext.patch_info(other)["method"] is None
    assert config.to_dict() == saved and other.config is config
    assert torch.equal(logits(other, ids), expected)
    logits(patched, ids[:, :L_ORIG])  # and the patched one runs
    hf_posext.unpatch_model(patched)
    assert torch.equal(logits(other, ids), expected)


@pytest.mark.parametrize("method,factor", [("alibi", None), ("dynamic_yarn", 4), ("yarn", 4)])
def test_unpatching_one_of_two_models_built_from_a_patched_config_leaves_the_other(method, factor):
    config = hf_posext.patch_model(tiny_config(max_positions=L_ORIG), method, factor)
    torch.manual_seed(0)
    other = AutoModelForCausalLM.from_config(config).eval()
    unpatched = AutoModelForCausalLM.from_config(config).eval()
    assert unpatched.config is other.config  # the situation of the bug
    ids = tokens(3 * L_ORIG)
    expected, saved = logits(other, ids), config.to_dict()
    hf_posext.unpatch_model(unpatched)
    assert config.to_dict() == saved and hf_posext.patch_info(other)["method"] == method
    assert torch.equal(logits(other, ids), expected)


def test_a_patched_config_is_patched_in_place_and_only_when_valid():
    config = tiny_config(max_positions=L_ORIG)
    saved = config.to_dict()
    with pytest.raises(ValueError, match="beta_fast"):
        hf_posext.patch_model(config, "yarn", 4, beta_fast=float("nan"))
    assert config.to_dict() == saved
    assert hf_posext.patch_model(config, "yarn", 4) is config
    assert config.rope_parameters["rope_type"] == "yarn"


@pytest.mark.parametrize(
    "factor,length", [(np.float32(4.0), np.int64(32)), (np.float64(4.0), np.int32(32)), (np.int64(4), 32)]
)
def test_numpy_scalars_are_numbers(factor, length):
    by_numpy = hf_posext.patch_model(tiny_config(), "yarn", factor, original_max_position_embeddings=length)
    by_python = hf_posext.patch_model(tiny_config(), "yarn", 4.0, original_max_position_embeddings=32)
    assert by_numpy.to_dict() == by_python.to_dict()
    assert type(by_numpy.hf_posext["factor"]) is float
    assert type(by_numpy.hf_posext["original_max_position_embeddings"]) is int


@pytest.mark.parametrize("max_length", [48, 24])
def test_repatching_learned_keeps_the_trained_rows(max_length):
    model = hf_posext.patch_model(tiny_model(), "learned", max_length=32)
    trained = torch.randn(32, model.config.hidden_size)
    with torch.no_grad():
        getattr(model.model, POSITIONS_ATTR).weight.copy_(trained)
    hf_posext.patch_model(model, "learned", max_length=max_length)
    table = getattr(model.model, POSITIONS_ATTR).weight
    assert table.shape[0] == max_length
    rows = min(32, max_length)
    assert torch.equal(table[:rows], trained[:rows])


def test_repatching_learned_on_a_loaded_checkpoint_extends_its_table(tmp_path):
    model = hf_posext.patch_model(tiny_model(), "learned", max_length=32)
    with torch.no_grad():
        getattr(model.model, POSITIONS_ATTR).weight.add_(1.0)
    trained = getattr(model.model, POSITIONS_ATTR).weight.detach().clone()
    model.save_pretrained(tmp_path)
    loaded = hf_posext.from_pretrained(tmp_path, attn_implementation="eager")
    hf_posext.patch_model(loaded, "learned", max_length=64)
    assert torch.equal(getattr(loaded.model, POSITIONS_ATTR).weight[:32], trained)
    logits(loaded, tokens(60))  # positions 32..59 have rows now
