"""Sinusoidal and learned absolute position encodings (baselines): values, padding, cache, checkpoints.

Run: ``.venv/bin/pytest tests/methods/absolute/test_surgery.py -q``.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from tests.helpers.models import tiny_config, tiny_model, tokens, train_steps
from scripts.vanilla import vanilla_load_error
from safetensors import safe_open
from transformers import AutoModelForCausalLM, LlamaForCausalLM

import hf_posext
from hf_posext.methods.absolute.surgery import POSITIONS_ATTR, SinusoidalPositions
from hf_posext.rope_utils import NO_ROPE_TYPE

METHODS = {"sinusoidal": {}, "learned": {"max_length": 48}}


def logits(model, ids, **kwargs):
    with torch.no_grad():
        return model(ids, **kwargs).logits


def vaswani_table(positions: list[int], d_model: int, theta: float = 10000.0) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / theta^(2i/d)), PE(pos, 2i+1) = cos(pos / theta^(2i/d)) (sec. 3.5), float64."""
    table = torch.zeros(len(positions), d_model, dtype=torch.float64)
    for row, pos in enumerate(positions):
        for i in range(d_model // 2):
            angle = pos / theta ** (2 * i / d_model)
            table[row, 2 * i] = math.sin(angle)
            table[row, 2 * i + 1] = math.cos(angle)
    return table


def test_sinusoidal_table_matches_the_paper():
    positions = [0, 1, 2, 7, 100, 1000, 4095]
    got = SinusoidalPositions(16)(torch.tensor([positions]))[0]
    assert got.dtype == torch.float32
    # fp32 angles: absolute error grows with the position (4095 * 2^-24 relative)
    torch.testing.assert_close(got.double(), vaswani_table(positions, 16), rtol=0, atol=2e-4)


def first_layer_input(model, ids, **kwargs):
    captured = {}

    def grab(module, args, kwargs_):
        captured["hidden"] = kwargs_.get("hidden_states", args[0] if args else None)

    handle = model.model.layers[0].register_forward_pre_hook(grab, with_kwargs=True)
    try:
        logits(model, ids, **kwargs)
    finally:
        handle.remove()
    return captured["hidden"]


@pytest.mark.parametrize("method", sorted(METHODS))
def test_the_first_layer_sees_token_plus_position_embeddings(method):
    model = hf_posext.patch_model(tiny_model(), method, **METHODS[method])
    ids = tokens(10, batch=2)
    position_ids = torch.arange(5, 15)[None].expand(2, -1)
    hidden = first_layer_input(model, ids, position_ids=position_ids)
    if method == "sinusoidal":
        table = vaswani_table(list(range(5, 15)), model.config.hidden_size).float()
    else:
        table = getattr(model.model, POSITIONS_ATTR).weight[5:15].detach()
    expected = model.model.embed_tokens(ids) + table
    torch.testing.assert_close(hidden, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_rotary_is_off_and_positions_matter(method):
    model = hf_posext.patch_model(tiny_model(), method, **METHODS[method])
    assert model.config.rope_parameters["rope_type"] == NO_ROPE_TYPE
    ids = tokens(12)
    shifted = torch.arange(3, 15)[None]
    assert not torch.allclose(logits(model, ids, position_ids=shifted), logits(model, ids))


def test_learned_rejects_positions_past_max_length():
    model = hf_posext.patch_model(tiny_model(), "learned", max_length=16)
    assert model.config.max_position_embeddings == 16
    logits(model, tokens(16))
    with pytest.raises(ValueError, match=r"position 16 is outside the learned position table \(max_length=16"):
        logits(model, tokens(17))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("method", sorted(METHODS))
def test_left_padded_rows_equal_rows_alone(method, arch):
    model = hf_posext.patch_model(tiny_model(arch), method, **METHODS[method])
    ids = tokens(14, batch=2)
    mask = torch.ones(2, 14, dtype=torch.bool)
    mask[1, :6] = False
    batched = logits(model, ids, attention_mask=mask)
    torch.testing.assert_close(batched[1, 6:], logits(model, ids[1:, 6:])[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(batched[0], logits(model, ids[:1])[0], rtol=1e-5, atol=1e-5)


@pytest.mark.newest
@pytest.mark.parametrize("method", sorted(METHODS))
def test_cached_generation_equals_full_forward_greedy(method):
    model = hf_posext.patch_model(tiny_model(), method, **METHODS[method])
    model.generation_config.eos_token_id = None
    prompt = tokens(9)
    cached = model.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=0)
    ids = prompt
    for _ in range(8):
        next_token = logits(model, ids, use_cache=False)[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, next_token], dim=-1)
    assert torch.equal(cached, ids)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_saved_checkpoint_reloads_with_identical_logits(method, tmp_path):
    model = hf_posext.patch_model(tiny_model(), method, **METHODS[method])
    if method == "learned":
        with torch.no_grad():  # a table that is not what initialisation would give
            getattr(model.model, POSITIONS_ATTR).weight.add_(1.0)
    ids = tokens(20, batch=2)
    expected = logits(model, ids)
    model.save_pretrained(tmp_path / "a")
    with safe_open(tmp_path / "a" / "model.safetensors", "pt") as f:
        saved_keys = set(f.keys())
    assert (f"model.{POSITIONS_ATTR}.weight" in saved_keys) == (method == "learned")

    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "a", attn_implementation="eager")
    assert hf_posext.patch_info(reloaded)["method"] == method
    assert torch.equal(logits(reloaded, ids), expected)

    reloaded.save_pretrained(tmp_path / "b")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "b", attn_implementation="eager")
    assert torch.equal(logits(again, ids), expected)


def test_resize_token_embeddings_keeps_the_position_table_and_its_one_hook():
    # The load hook used to match `embed_tokens` at any time: resizing re-created the table
    # (losing the trained one) and stacked a second pre-hook (positions added twice).
    model = hf_posext.patch_model(tiny_model(), "learned", max_length=32)
    table = getattr(model.model, POSITIONS_ATTR)
    with torch.no_grad():
        table.weight.add_(1.0)
    ids, vocab = tokens(20), model.config.vocab_size
    expected = logits(model, ids)
    model.resize_token_embeddings(vocab + 8)
    assert getattr(model.model, POSITIONS_ATTR) is table
    assert len(model.model._forward_pre_hooks) == 1
    torch.testing.assert_close(logits(model, ids)[..., :vocab], expected, rtol=0, atol=1e-5)


def test_vanilla_transformers_refuses_the_checkpoint_naming_the_package(tmp_path):
    hf_posext.patch_model(tiny_model(), "learned", max_length=32).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["hf_posext"]["method"] == "learned"
    assert "hf_posext_none" in vanilla_load_error(tmp_path)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_unpatch_restores_outputs_bit_exactly(method):
    model = tiny_model()
    ids = tokens(20)
    before = logits(model, ids)
    config_before = model.config.to_dict()
    hf_posext.patch_model(model, method, **METHODS[method])
    assert not torch.allclose(logits(model, ids), before)
    hf_posext.unpatch_model(model)
    assert torch.equal(logits(model, ids), before)
    assert not hasattr(model.model, POSITIONS_ATTR)
    assert model.config.to_dict() == config_before


def test_repatching_replaces_the_position_table():
    model = hf_posext.patch_model(tiny_model(), "learned", max_length=32)
    hf_posext.patch_model(model, "alibi")
    assert not hasattr(model.model, POSITIONS_ATTR)
    expected = hf_posext.patch_model(tiny_model(), "alibi")
    assert torch.equal(logits(model, tokens(20)), logits(expected, tokens(20)))


def test_a_patched_config_builds_a_model_with_the_table():
    config = hf_posext.patch_model(tiny_config(), "learned", max_length=40)
    model = LlamaForCausalLM(config)
    table = getattr(model.model, POSITIONS_ATTR)
    assert table.weight.shape == (40, config.hidden_size)
    assert 0.01 < float(table.weight.detach().std()) < 0.03  # initialised like the token embeddings (std 0.02)


def test_a_tiny_learned_model_trains_its_table():
    torch.manual_seed(0)
    model = hf_posext.patch_model(tiny_model(), "learned", max_length=32).train()
    table = getattr(model.model, POSITIONS_ATTR).weight
    start = table.detach().clone()
    ids = (torch.arange(24) % 5 + 3)[None].repeat(2, 1)
    losses = train_steps(model, ids)
    assert losses[-1] < 0.5 * losses[0], losses
    assert not torch.equal(table.detach(), start)


@pytest.mark.parametrize(
    "method,kwargs,match",
    [
        ("learned", {"max_length": 0}, "max_length must be a positive int"),
        ("learned", {"max_length": 2.5}, "max_length must be a positive int"),
        ("learned", {"factor": 2}, "factor must be 1"),
        ("sinusoidal", {"theta": 1}, "theta must be a number > 1"),
    ],
)
def test_bad_arguments_raise(method, kwargs, match):
    with pytest.raises(ValueError, match=match):
        hf_posext.patch_model(tiny_model(), method, **kwargs)
