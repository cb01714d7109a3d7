"""patch_model / unpatch_model: properties, the advertised context, and every error case."""

from __future__ import annotations

import math
from contextlib import nullcontext
import typing
from dataclasses import dataclass

import pytest
import torch
from tests.helpers.models import ARCHITECTURES, tiny_config, tiny_model, tokens
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

import hf_posext
import hf_posext.patching.patch as patching
from hf_posext import architectures
from hf_posext.methods import method_class
from hf_posext.methods.longrope import pinned_factors
from hf_posext.methods.registry import register_method
from hf_posext.patching import MethodName

L_ORIG = 64
ROPE_METHODS = [m for m in hf_posext.available_methods() if method_class(m).scales_rope]
STATIC_METHODS = [m for m in ROPE_METHODS if not method_class(m).dynamic]


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
@pytest.mark.parametrize("method", ROPE_METHODS)
def test_factor_one_is_a_bit_exact_no_op(arch, method):
    model = tiny_model(arch, max_positions=L_ORIG)
    ids = tokens(3 * L_ORIG)
    before = logits(model, ids)
    hf_posext.patch_model(model, method, factor=1)
    assert torch.equal(logits(model, ids), before)
    assert model.config.max_position_embeddings == L_ORIG


@pytest.mark.newest
@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
@pytest.mark.parametrize("method", ROPE_METHODS)
def test_unpatch_restores_outputs_bit_exactly(arch, method):
    model = tiny_model(arch, max_positions=L_ORIG)
    config_before = model.config.to_dict()
    ids = tokens(3 * L_ORIG)
    before = logits(model, ids)
    hf_posext.patch_model(model, method, factor=4)
    assert not torch.equal(logits(model, ids), before)  # the patch did something
    hf_posext.unpatch_model(model)
    assert torch.equal(logits(model, ids), before)
    assert model.config.to_dict() == config_before


@pytest.mark.parametrize("method", ROPE_METHODS)
def test_patching_twice_equals_patching_once(method):
    ids = tokens(3 * L_ORIG)
    once = hf_posext.patch_model(tiny_model(max_positions=L_ORIG), method, factor=4)
    twice = hf_posext.patch_model(tiny_model(max_positions=L_ORIG), method, factor=4)
    hf_posext.patch_model(twice, method, factor=4)
    assert torch.equal(logits(twice, ids), logits(once, ids))
    assert twice.config.to_dict() == once.config.to_dict()


def test_repatching_replaces_the_previous_patch():
    ids = tokens(3 * L_ORIG)
    direct = hf_posext.patch_model(tiny_model(max_positions=L_ORIG), "yarn", factor=8)
    replaced = tiny_model(max_positions=L_ORIG)
    hf_posext.patch_model(replaced, "linear", factor=2)
    hf_posext.patch_model(replaced, "yarn", factor=8)
    assert torch.equal(logits(replaced, ids), logits(direct, ids))
    assert replaced.config.rope_parameters == direct.config.rope_parameters
    assert replaced.config.max_position_embeddings == 8 * L_ORIG


@pytest.mark.newest
def test_patching_a_config_then_building_equals_patching_the_model():
    ids = tokens(2 * L_ORIG)
    model = hf_posext.patch_model(tiny_model(max_positions=L_ORIG), "yarn", factor=4)
    config = hf_posext.patch_model(tiny_config(max_positions=L_ORIG), "yarn", factor=4)
    built = type(model)(config).eval()
    built.load_state_dict(model.state_dict())
    assert torch.equal(logits(built, ids), logits(model, ids))


@pytest.mark.parametrize("method", ROPE_METHODS)
def test_method_config_object_equals_name_and_kwargs(method):
    by_name = hf_posext.patch_model(tiny_config(max_positions=L_ORIG), method, factor=4)
    by_object = hf_posext.patch_model(tiny_config(max_positions=L_ORIG), method_class(method)(factor=4))
    assert by_name.to_dict() == by_object.to_dict()


@pytest.mark.parametrize(
    "method,advertised", [("linear", 64), ("ntk", 256), ("yarn", 256), ("dynamic_ntk", 64), ("dynamic_yarn", 64)]
)
def test_advertised_context(method, advertised):
    """ntk and yarn advertise factor x L_orig; dynamic ones must keep L_orig (else transformers never rescales);
    linear keeps L_orig too, as vicuna-13b-v1.5-16k does, because vLLM and SGLang multiply it by the factor."""
    config = hf_posext.patch_model(tiny_config(max_positions=L_ORIG), method, factor=4)
    assert config.max_position_embeddings == advertised
    info = hf_posext.patch_info(config)
    assert info["method"] == method and info["factor"] == 4.0
    assert info["original_max_position_embeddings"] == L_ORIG and info["context_length"] == 4 * L_ORIG


@pytest.mark.parametrize("method", ["dynamic_ntk", "dynamic_yarn"])
def test_dynamic_methods_really_scale(method):
    """Beyond L_orig a dynamic method must change the output; within it, it must not."""
    ids = tokens(3 * L_ORIG)
    plain = tiny_model(max_positions=L_ORIG)
    dynamic = hf_posext.patch_model(tiny_model(max_positions=L_ORIG), method, factor=4)
    assert torch.equal(logits(dynamic, ids[:, :L_ORIG]), logits(plain, ids[:, :L_ORIG]))
    far = (logits(dynamic, ids) - logits(plain, ids))[:, L_ORIG:].abs().max().item()
    assert far > 1e-3


def test_original_length_defaults_and_override():
    config = hf_posext.patch_model(tiny_config(max_positions=L_ORIG), "yarn", factor=4)
    assert config.rope_parameters["original_max_position_embeddings"] == L_ORIG
    config = hf_posext.patch_model(
        tiny_config(max_positions=L_ORIG), "yarn", factor=4, original_max_position_embeddings=32
    )
    assert config.rope_parameters["original_max_position_embeddings"] == 32
    assert config.max_position_embeddings == 128


def test_a_shipped_scaling_is_composed_on_unless_overridden():
    llama3 = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    }
    config = tiny_config(max_positions=256, rope_parameters=llama3)
    hf_posext.patch_model(config, "yarn", factor=4)  # composes (tests/test_composition.py)
    assert config.max_position_embeddings == 4 * 256
    with pytest.raises(ValueError, match=r"already uses rope_type='llama3'.*override=True"):
        hf_posext.patch_model(config, "dynamic_ntk", factor=4)
    hf_posext.patch_model(config, "yarn", factor=4, override=True)
    # the checkpoint's own pretraining context (32) is L_orig, its theta is kept
    assert config.rope_parameters["original_max_position_embeddings"] == 32
    assert config.rope_parameters["rope_theta"] == 500000.0
    assert config.max_position_embeddings == 128


def test_a_reloaded_patched_config_is_recognised_as_ours(tmp_path):
    model = hf_posext.patch_model(tiny_model(max_positions=L_ORIG), "yarn", factor=4)
    model.save_pretrained(tmp_path)
    reloaded = type(model).from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert hf_posext.patch_info(reloaded)["method"] == "yarn"
    hf_posext.patch_model(reloaded, "linear", factor=2)  # not refused as a foreign yarn checkpoint
    assert reloaded.config.rope_parameters["rope_type"] == "linear"
    hf_posext.unpatch_model(reloaded)
    ids = tokens(2 * L_ORIG)
    assert torch.equal(logits(reloaded, ids), logits(hf_posext.unpatch_model(model), ids))


@pytest.mark.parametrize("method", STATIC_METHODS)
def test_static_scores_depend_only_on_relative_position(method):
    model = hf_posext.patch_model(tiny_model(max_positions=L_ORIG), method, factor=8)
    rotary = model.model.rotary_emb
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 1, 32, generator=generator)
    k = torch.randn(1, 1, 1, 32, generator=generator)

    def score(m, n):
        cos, sin = rotary(q, torch.tensor([[m, n]]))
        q_rot, _ = apply_rotary_pos_emb(q, q, cos[:, :1], sin[:, :1])
        k_rot, _ = apply_rotary_pos_emb(k, k, cos[:, 1:], sin[:, 1:])
        return (q_rot * k_rot).sum().item()

    # LongRoPE picks its factor set by the sequence's length: relative within each set
    sets = [pinned_factors(model, which) for which in ("short", "long")] if method == "longrope" else [nullcontext()]
    for factor_set in sets:
        with factor_set:
            for m, n in [(5, 0), (100, 37), (300, 299)]:
                for shift in [1, 64, 200]:
                    assert score(m + shift, n + shift) == pytest.approx(score(m, n), rel=1e-4, abs=1e-4)


@pytest.mark.newest
@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
@pytest.mark.parametrize("method", STATIC_METHODS)
def test_cached_greedy_generation_equals_full_forward(arch, method):
    model = hf_posext.patch_model(tiny_model(arch, max_positions=L_ORIG), method, factor=4)
    prompt = tokens(L_ORIG // 2)
    new = 2 * L_ORIG
    out = model.generate(
        prompt, max_new_tokens=new, do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0
    )
    sequence = out.sequences
    if method == "longrope":  # its factor set is the sequence's: each step against a full forward of its prefix
        full = torch.stack(
            [logits(model, sequence[:, :end])[:, -1] for end in range(prompt.shape[1], sequence.shape[1])], 1
        )
    else:
        full = logits(model, sequence[:, :-1])[:, prompt.shape[1] - 1 :]
    cached = torch.stack(out.logits, dim=1)
    torch.testing.assert_close(cached, full, atol=1e-5, rtol=0)
    assert torch.equal(full.argmax(-1), sequence[:, prompt.shape[1] :])


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(method="rope_magic", factor=2), r"unknown method 'rope_magic'; available methods: .*yarn"),
        (dict(method="yarn", factor=0.5), r"yarn: factor must be >= 1.*got 0\.5"),
        (dict(method="linear", factor=float("nan")), r"linear: factor must be a finite number >= 1, got nan"),
        (dict(method="linear", factor="4"), r"factor must be a finite number >= 1, got '4'"),
        (dict(method="yarn", factor=4, beta_fast=1, beta_slow=2), r"beta_fast must be greater than beta_slow"),
        (dict(method="yarn", factor=4, beta_slow=0), r"beta_slow must be a positive number, got 0"),
        (dict(method="yarn", factor=4, attention_factor=-1.0), r"attention_factor must be a positive number"),
        (
            dict(method="ntk", factor=4, original_max_position_embeddings=0),
            r"original_max_position_embeddings must be a positive int",
        ),
        (
            dict(method="linear", factor=4, beta_fast=3),
            r"method 'linear' does not take \['beta_fast'\]; its arguments are: factor",
        ),
    ],
)
def test_bad_arguments_raise_naming_the_value(kwargs, message):
    config = tiny_config(max_positions=L_ORIG)
    before = config.to_dict()
    with pytest.raises(ValueError, match=message):
        hf_posext.patch_model(config, **kwargs)
    assert config.to_dict() == before  # nothing half-patched


def test_unsupported_architecture_lists_supported_ones():
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))
    message = r"unsupported architecture 'gpt2': its config has no rope_parameters .*; tested on: .*llama, .*qwen3"
    with pytest.raises(ValueError, match=message):
        hf_posext.patch_model(model, "yarn", factor=4)


def test_not_a_model_raises():
    with pytest.raises(TypeError, match="expected a transformers model or config, got dict"):
        hf_posext.patch_model({"model_type": "llama"}, "yarn", factor=4)


def test_unpatching_an_unpatched_model_raises():
    with pytest.raises(ValueError, match="carries no hf-posext patch"):
        hf_posext.unpatch_model(tiny_model())


def test_invalid_custom_rope_parameters_fail_at_config_validation():
    config = hf_posext.patch_model(tiny_config(max_positions=L_ORIG), "dynamic_yarn", factor=4)
    config.rope_parameters["factor"] = 0.25
    with pytest.raises(ValueError, match=r"dynamic_yarn: factor must be >= 1.*got 0\.25"):
        config.validate_rope()


def test_ntk_theta_uses_the_rotary_dimension():
    config = hf_posext.patch_model(tiny_config(head_dim=64, max_positions=L_ORIG), "ntk", factor=16)
    assert config.rope_parameters["rope_theta"] == pytest.approx(10000 * 16 ** (64 / 62))
    assert math.isclose(hf_posext.patch_info(config)["context_length"], 16 * L_ORIG)


def test_registry_rejects_duplicate_names():
    with pytest.raises(ValueError, match="'yarn' is already registered"):
        register_method("yarn", hf_posext.YarnConfig, family="dup")
    with pytest.raises(ValueError, match="lower-case"):
        register_method("YaRN2", hf_posext.YarnConfig, family="dup")
    assert "dup" not in hf_posext.methods.families() and hf_posext.YarnConfig.name == "yarn"


def test_method_name_literal_lists_every_registered_name_and_alias():
    assert set(typing.get_args(MethodName)) == set(hf_posext.available_methods()) | set(hf_posext.method_aliases())


def test_canonical_name_resolves_aliases_and_names_unknown_ones():
    assert [hf_posext.canonical_name(n) for n in ("pi", "linear", "dynamic", "ntk_aware")] == [
        "linear",
        "linear",
        "dynamic_ntk",
        "ntk",
    ]
    with pytest.raises(ValueError, match="unknown method 'rope2'.*available methods: alibi"):
        hf_posext.canonical_name("rope2")


def test_takes_factor_is_false_exactly_for_methods_that_refuse_a_factor():
    for name in hf_posext.available_methods():
        cls = method_class(name)
        if cls.takes_factor:
            cls(factor=2.0)
        else:
            with pytest.raises(ValueError, match="factor must be 1"):
                cls(factor=2.0)


def test_patched_method_is_the_config_object_patch_info_describes():
    model = tiny_model(max_positions=L_ORIG)
    assert hf_posext.patched_method(model) is None
    hf_posext.patch_model(model, "pi", factor=4)
    method = hf_posext.patched_method(model)
    assert method == hf_posext.method_config("linear", factor=4, original_max_position_embeddings=L_ORIG)  # resolved
    assert hf_posext.patch_info(model)["method"] == method.name == "linear"
    assert hf_posext.patched_method(hf_posext.unpatch_model(model)) is None


def test_a_patch_checks_and_writes_the_config_once(monkeypatch):
    """Patch once (issue 48 item 6): the config checks run once, the method's config is computed once (on the copy
    that becomes the model's private config), whatever the model carried before."""
    model = hf_posext.patch_model(tiny_model("llama", max_position_embeddings=L_ORIG), "linear", factor=2)
    calls = {"check_config": 0, "_patch_config": 0}
    for owner, name in ((architectures, "check_config"), (patching, "_patch_config")):
        original = getattr(owner, name)

        def counted(*args, _original=original, _name=name, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)
    reference = tiny_model("llama", max_position_embeddings=L_ORIG)
    reference.load_state_dict(model.state_dict())
    hf_posext.patch_model(model, "yarn", factor=4)
    assert calls == {"check_config": 1, "_patch_config": 1}
    hf_posext.patch_model(reference, "yarn", factor=4)
    assert model.config.to_dict() == reference.config.to_dict()
    ids = tokens(1, 3 * L_ORIG)
    torch.testing.assert_close(logits(model, ids), logits(reference, ids), rtol=0, atol=0)


def test_the_context_a_method_reaches_is_computed_in_one_place():
    """factor x L_orig is MethodConfig.context_length's: the advertised context and the record's follow it."""

    @dataclass(frozen=True)
    class OneShort(hf_posext.YarnConfig):
        def context_length(self, base):
            return super().context_length(base) - 1

    config = tiny_config("llama", max_position_embeddings=L_ORIG)
    hf_posext.patch_model(config, OneShort(factor=4))
    assert config.max_position_embeddings == hf_posext.patch_info(config)["context_length"] == 4 * L_ORIG - 1
