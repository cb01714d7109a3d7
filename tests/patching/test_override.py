"""``override=True`` on a checkpoint that ships a scaling keeps what it shipped (issue 24, item 1).

The record of an override patch holds the checkpoint's own llama3 / yarn rope, so unpatch gives
it back (and save_pretrained writes it), and a later normal patch composes on it as on a fresh model.
"""

from __future__ import annotations

import json

import pytest
import torch
from tests.helpers.models import tiny_model, tokens
from transformers import LlamaForCausalLM

import hf_posext
from hf_posext.commands.main import main

L_ORIG = 64
SHIPPED = {
    "llama3": {
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
    "yarn": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16},
}


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("shipped", sorted(SHIPPED))
def test_override_then_unpatch_gives_back_the_shipped_scaling(shipped, tmp_path):
    model = tiny_model(max_positions=L_ORIG, rope_parameters=SHIPPED[shipped])
    ids = tokens(2 * L_ORIG)
    model.save_pretrained(tmp_path / "never_patched")
    before, config_before = logits(model, ids), model.config.to_dict()
    hf_posext.patch_model(model, "yarn", factor=2, override=True)
    assert model.config.hf_posext["base_rope_parameters"] == SHIPPED[shipped]
    hf_posext.unpatch_model(model)
    assert model.config.rope_parameters == SHIPPED[shipped]
    assert torch.equal(logits(model, ids), before)
    assert model.config.to_dict() == config_before
    model.save_pretrained(tmp_path / "unpatched")
    reloaded = (
        logits(LlamaForCausalLM.from_pretrained(tmp_path / name).eval(), ids) for name in ("unpatched", "never_patched")
    )
    assert torch.equal(*reloaded)


@pytest.mark.parametrize("shipped", sorted(SHIPPED))
def test_a_normal_patch_after_an_override_composes_on_the_shipped_scaling(shipped):
    ids = tokens(2 * L_ORIG)
    fresh = hf_posext.patch_model(tiny_model(max_positions=L_ORIG, rope_parameters=SHIPPED[shipped]), "yarn", factor=2)
    model = tiny_model(max_positions=L_ORIG, rope_parameters=SHIPPED[shipped])
    hf_posext.patch_model(model, "linear", factor=2, override=True)
    hf_posext.patch_model(model, "yarn", factor=2)
    assert hf_posext.patch_info(model) == hf_posext.patch_info(fresh)
    assert hf_posext.patch_info(model)["composed_on"] == shipped
    assert torch.equal(logits(model, ids), logits(fresh, ids))


def test_cli_override_then_patch_again_composes_on_the_shipped_scaling(tmp_path):
    base = tmp_path / "base"
    tiny_model(max_positions=L_ORIG, rope_parameters=SHIPPED["llama3"]).save_pretrained(base)
    assert main(["patch", str(base), str(tmp_path / "over"), "--method", "linear", "--factor", "2", "--override"]) == 0
    assert main(["patch", str(tmp_path / "over"), str(tmp_path / "again"), "--method", "yarn", "--factor", "2"]) == 0
    assert main(["patch", str(base), str(tmp_path / "direct"), "--method", "yarn", "--factor", "2"]) == 0
    again, direct = (json.loads((tmp_path / name / "config.json").read_text()) for name in ("again", "direct"))
    assert again["rope_parameters"] == direct["rope_parameters"]
    assert again["hf_posext"] == direct["hf_posext"]
