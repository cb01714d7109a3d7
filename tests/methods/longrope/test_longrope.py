"""LongRoPE (``longrope``): transformers' native type, its default factors, and the exact cache across the switch.

References: transformers' own ``longrope`` model built from rope parameters written by hand (the long
factors as YaRN's per-pair ratio, from transformers' own ``yarn`` function), transformers' full
forward of a one-layer model, and the property that cached decoding equals a forward pass at every
step, for the default (transformers' definition, the cache's prefix computed again at the switch: more
in test_switch.py) and for ``factors_by="query"`` (hf-posext's causal definition: docs/methods/longrope.md).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from tests.helpers.models import published_model, tiny_model, tokens
from scripts.registry import tiny_config as registry_config
from transformers import Phi3ForCausalLM, modeling_rope_utils

import hf_posext
from hf_posext.attention.exact_dynamic import ExactDynamicRotaryEmbedding
from hf_posext.methods.longrope import switch

pytestmark = pytest.mark.usefixtures("one_thread")

ARCHS = ("llama", "mistral", "qwen2", "qwen3")
L_ORIG = 16
FACTOR = 4
TOL = 1e-5


def yarn_ratio(theta: float, rotary_dim: int, original: int, factor: float) -> list[float]:
    """Plain frequencies over transformers' own YaRN frequencies: YaRN's per-pair divisors."""
    config = copy.deepcopy(tiny_model("llama", head_dim=rotary_dim, max_positions=original).config)
    config.rope_parameters = {
        "rope_type": "yarn",
        "rope_theta": theta,
        "factor": factor,
        "original_max_position_embeddings": original,
    }
    yarn, _ = modeling_rope_utils.ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    plain = 1.0 / theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    return (plain / yarn.double()).tolist()


def phi3(partial: float = 0.75, **kwargs):
    """A tiny Phi-3 (Phi-4-mini style partial rotary: 3/4 of head_dim 32 rotated, 12 pairs)."""
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": partial}
    config = registry_config(
        "phi3", rope_parameters=rope, max_position_embeddings=L_ORIG, original_max_position_embeddings=L_ORIG, **kwargs
    )
    torch.manual_seed(0)
    model = Phi3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("qkv_proj.weight"):
                param.mul_(4.0)
    return model


def native(model, rope_parameters):
    """transformers' own model of ``model``'s class with these rope parameters and ``model``'s weights."""
    config = copy.deepcopy(model.config)
    if hasattr(config, "hf_posext"):
        del config.hf_posext
    config.rope_parameters = copy.deepcopy(rope_parameters)
    config.max_position_embeddings = FACTOR * L_ORIG
    config._attn_implementation = "eager"
    built = type(model)(config).eval()
    built.load_state_dict(model.state_dict())
    return built


def logits(model, ids):
    with torch.no_grad():
        return model(ids, use_cache=False).logits


def cached_steps(model, ids, prompt):
    """Each decoding step's logits after a ``prompt``-token prefill: ``[batch, seq - prompt, vocab]``."""
    with torch.no_grad():
        out = model(ids[:, :prompt], use_cache=True)
        cache, steps = out.cache, [out.logits[:, -1]]
        for t in range(prompt, ids.shape[1] - 1):
            out = model(ids[:, t : t + 1], cache=cache, use_cache=True)
            cache = out.cache
            steps.append(out.logits[:, -1])
    return torch.stack(steps, dim=1)


@pytest.mark.parametrize("partial", (1.0, 0.75))
def test_default_long_factors_are_yarns_ramp(partial):
    model = phi3(partial)
    hf_posext.patch_model(model, "longrope", factor=FACTOR, exact_cache=False)
    params = model.config.rope_parameters
    rotary_dim = int(32 * partial)
    long = torch.tensor(params["long_factor"], dtype=torch.float64)
    assert long.numel() == rotary_dim // 2 and params["short_factor"] == [1.0] * (rotary_dim // 2)
    assert bool((long.diff() >= 0).all()) and long[0] == 1.0 and long[-1] == FACTOR
    torch.testing.assert_close(
        long,
        torch.tensor(yarn_ratio(params["rope_theta"], rotary_dim, L_ORIG, FACTOR), dtype=torch.float64),
        rtol=1e-6,
        atol=0,
    )
    assert params["factor"] == FACTOR and params["original_max_position_embeddings"] == L_ORIG
    assert model.config.max_position_embeddings == FACTOR * L_ORIG


@pytest.mark.parametrize("arch", (*ARCHS, "phi3-partial"))
def test_equals_transformers_longrope_model(arch):
    """transformers' own model bit for bit, with and without the exact cache."""
    make = (lambda: phi3()) if arch == "phi3-partial" else (lambda: tiny_model(arch, max_positions=L_ORIG))
    base = make()
    rotary_dim = 24 if arch == "phi3-partial" else 32
    long = [1.0 + 0.2 * i for i in range(rotary_dim // 2)]
    short = [1.0 + 0.01 * i for i in range(rotary_dim // 2)]
    by_hand = {
        "rope_type": "longrope",
        "rope_theta": base.config.rope_parameters["rope_theta"],
        "factor": FACTOR,
        "original_max_position_embeddings": L_ORIG,
        "long_factor": long,
        "short_factor": short,
        **({"partial_rotary_factor": 0.75} if arch == "phi3-partial" else {}),
    }
    reference = native(base, by_hand)
    ids = tokens(3 * L_ORIG)
    for exact in (False, True):
        model = hf_posext.patch_model(
            make(), "longrope", factor=FACTOR, long_factor=long, short_factor=short, exact_cache=exact
        )
        for length in (L_ORIG, 3 * L_ORIG):
            assert torch.equal(logits(model, ids[:, :length]), logits(reference, ids[:, :length])), (exact, length)
    # the default factors and attention factor, through transformers' own yarn function
    model = hf_posext.patch_model(make(), "longrope", factor=FACTOR, attention_factor=1.5, exact_cache=False)
    by_hand.update(
        long_factor=yarn_ratio(by_hand["rope_theta"], rotary_dim, L_ORIG, FACTOR),
        short_factor=[1.0] * (rotary_dim // 2),
        attention_factor=1.5,
    )
    torch.testing.assert_close(logits(model, ids), logits(native(base, by_hand), ids), rtol=0, atol=TOL)


@pytest.mark.parametrize("arch", ARCHS)  # (transformers' Phi-3 takes only longrope: no YaRN to compare with)
def test_default_factors_with_yarns_attention_factor_are_yarn_past_the_switch(arch):
    """The search's start: past L_orig, the default factors with YaRN's 0.1 ln s + 1 give YaRN's logits."""
    ids = tokens(3 * L_ORIG)
    yarn = logits(hf_posext.patch_model(tiny_model(arch, max_positions=L_ORIG), "yarn", factor=FACTOR), ids)
    longrope = hf_posext.patch_model(
        tiny_model(arch, max_positions=L_ORIG),
        "longrope",
        factor=FACTOR,
        attention_factor=0.1 * math.log(FACTOR) + 1,
        exact_cache=False,
    )
    torch.testing.assert_close(logits(longrope, ids), yarn, rtol=0, atol=TOL)


def last_rows(model, ids, start):
    """The last row of a forward over each prefix ``ids[:, :t + 1]`` from ``t = start - 1``: ``[batch, n, vocab]``."""
    return torch.stack([logits(model, ids[:, : t + 1])[:, -1] for t in range(start - 1, ids.shape[1] - 1)], dim=1)


@pytest.mark.newest
@pytest.mark.parametrize("factors_by", ("sequence", "query"))
@pytest.mark.parametrize("arch", (*ARCHS, "phi3-partial"))
def test_cached_decoding_across_the_switch_equals_full_forward(arch, factors_by):
    model = phi3() if arch == "phi3-partial" else tiny_model(arch, max_positions=L_ORIG)
    hf_posext.patch_model(model, "longrope", factor=FACTOR, factors_by=factors_by)
    ids = tokens(3 * L_ORIG)
    prompt = L_ORIG - 5
    steps = cached_steps(model, ids, prompt)
    expected = last_rows(model, ids, prompt)  # each step is the last row of a forward over its prefix
    torch.testing.assert_close(steps, expected, rtol=0, atol=TOL)
    if factors_by == "query":  # one forward computes every prefix's last row
        torch.testing.assert_close(expected, logits(model, ids)[:, prompt - 1 : -1], rtol=0, atol=TOL)
    # a prompt past the switch, then decoding
    torch.testing.assert_close(
        cached_steps(model, ids, 2 * L_ORIG), expected[:, 2 * L_ORIG - prompt :], rtol=0, atol=TOL
    )


@pytest.mark.parametrize("factors_by", ("sequence", "query"))
@pytest.mark.parametrize("arch", ("llama", "phi3-partial"))
def test_past_the_switch_the_cache_holds_transformers_long_keys(arch, factors_by):
    """Past the switch the cache holds what transformers' own full forward caches (keys rotated with the long
    factors), in every layer by default (the prefix computed again); with factors_by="query" the keys are
    turned once, so only in a one-layer model (deeper layers' keys before L_orig come from hidden states
    that differ by definition)."""
    layers = 2 if factors_by == "sequence" else 1
    make = (
        (lambda: phi3(num_hidden_layers=layers))
        if arch == "phi3-partial"
        else (lambda: tiny_model(arch, max_positions=L_ORIG, layers=layers))
    )
    model = hf_posext.patch_model(make(), "longrope", factor=FACTOR, factors_by=factors_by)
    native_model = hf_posext.patch_model(make(), "longrope", factor=FACTOR, exact_cache=False)
    ids = tokens(2 * L_ORIG + 3, batch=2)
    with torch.no_grad():
        cache = model(ids[:, : L_ORIG - 3], use_cache=True).cache
        for t in range(L_ORIG - 3, ids.shape[1]):
            cache = model(ids[:, t : t + 1], cache=cache, use_cache=True).cache
        reference = native_model(ids, use_cache=True).cache
    for ours, theirs in zip(cache.layers, reference.layers, strict=True):
        torch.testing.assert_close(ours.keys, theirs.keys, rtol=0, atol=TOL)
        torch.testing.assert_close(ours.values, theirs.values, rtol=0, atol=TOL)


def rotations(monkeypatch):
    """The key count of every call of the wrapper's rotating path (the other steps are plain cached decodes)."""
    from hf_posext.attention.exact_dynamic import attention

    calls = []
    rotate = attention._attend_rotated
    monkeypatch.setattr(
        attention, "_attend_rotated", lambda *args: (calls.append(args[2].key.shape[2]), rotate(*args))[1]
    )
    return calls


def test_the_switch_rotates_the_cache_once_and_later_steps_are_plain(monkeypatch):
    calls = rotations(monkeypatch)
    model = hf_posext.patch_model(
        tiny_model("llama", max_positions=L_ORIG), "longrope", factor=FACTOR, factors_by="query"
    )
    ids = tokens(3 * L_ORIG)
    steps = cached_steps(model, ids, L_ORIG - 3)
    # the first cached step rotates the prompt's keys with the short factors (a prefill that makes its own
    # cache stores them un-rotated), the forward that crosses L_orig turns them to the long ones
    assert calls == [L_ORIG - 2] * model.config.num_hidden_layers + [L_ORIG + 1] * model.config.num_hidden_layers
    torch.testing.assert_close(steps[:, -1], logits(model, ids[:, :-1])[:, -1], rtol=0, atol=TOL)


@pytest.mark.parametrize("arch", ("llama", "phi3-partial"))
def test_before_the_switch_the_cache_holds_transformers_short_keys(arch, monkeypatch):
    """Before L_orig the cache stores the keys rotated with the short factors, as transformers' own cache does,
    and a decoding step is a plain one; a cache cropped back from past the switch holds short keys again
    after the next forward, which turns its long keys back (one call), and decoding stays exact."""
    make = (lambda: phi3()) if arch == "phi3-partial" else (lambda: tiny_model(arch, max_positions=L_ORIG))
    model = hf_posext.patch_model(make(), "longrope", factor=FACTOR, factors_by="query")
    native_model = hf_posext.patch_model(make(), "longrope", factor=FACTOR, exact_cache=False)
    layers = model.config.num_hidden_layers
    ids = tokens(2 * L_ORIG, batch=2)

    def short_keys(cache, length):
        with torch.no_grad():
            reference = native_model(ids[:, :length], use_cache=True).cache
        for ours, theirs in zip(cache.layers, reference.layers, strict=True):
            torch.testing.assert_close(ours.keys, theirs.keys, rtol=0, atol=TOL)

    calls = rotations(monkeypatch)
    with torch.no_grad():
        cache = model(ids[:, : L_ORIG - 6], use_cache=True).cache
        for t in range(L_ORIG - 6, L_ORIG):
            cache = model(ids[:, t : t + 1], cache=cache, use_cache=True).cache
        short_keys(cache, L_ORIG)
        assert calls == [L_ORIG - 5] * layers  # the first step only
        for t in range(L_ORIG, L_ORIG + 5):  # past the switch
            cache = model(ids[:, t : t + 1], cache=cache, use_cache=True).cache
        cache.crop(-9)  # back to L_orig - 4 keys
        del calls[:]
        for t in range(L_ORIG - 4, 2 * L_ORIG - 1):
            out = model(ids[:, t : t + 1], cache=cache, use_cache=True)
            cache = out.cache
            torch.testing.assert_close(out.logits[:, -1], logits(model, ids[:, : t + 1])[:, -1], rtol=0, atol=TOL)
            if t == L_ORIG - 2:
                short_keys(cache, L_ORIG - 1)
    assert calls == [L_ORIG - 3] * layers + [L_ORIG + 1] * layers  # the turn back to short keys, the switch again


@pytest.mark.parametrize("kwargs", ({}, {"factors_by": "query"}))
def test_an_autograd_forward_leaves_the_caches_rotated_keys_alone_and_stays_exact(kwargs):
    """A forward under autograd never rotates the cache in place: where it needs un-rotated keys (a forward that
    crosses the switch, or one whose cache holds keys of mixed kinds) it attends to an un-rotated copy of the
    short keys an inference step stored, and the cache stays valid for the next inference steps. By default the
    forward that crosses the switch computes the prefix again under autograd."""
    model = hf_posext.patch_model(tiny_model("llama", max_positions=L_ORIG), "longrope", factor=FACTOR, **kwargs)
    ids = tokens(2 * L_ORIG)
    with torch.no_grad():
        cache = model(ids[:, : L_ORIG - 6], use_cache=True).cache
        cache = model(ids[:, L_ORIG - 6 : L_ORIG - 5], cache=cache, use_cache=True).cache  # short keys stored
    for start, stop in ((L_ORIG - 5, L_ORIG + 1), (L_ORIG + 1, L_ORIG + 2)):  # across the switch, one step past
        out = model(ids[:, start:stop], cache=cache, use_cache=True)
        assert out.logits.requires_grad
        torch.testing.assert_close(out.logits.detach(), logits(model, ids[:, :stop])[:, start:], rtol=0, atol=TOL)
        cache = out.cache
    with torch.no_grad():
        for t in range(L_ORIG + 2, L_ORIG + 6):
            out = model(ids[:, t : t + 1], cache=cache, use_cache=True)
            cache = out.cache
            torch.testing.assert_close(out.logits[:, -1], logits(model, ids[:, : t + 1])[:, -1], rtol=0, atol=TOL)


@pytest.mark.parametrize("factors_by", ("sequence", "query"))
def test_a_cache_cropped_back_before_the_switch_stays_exact(factors_by):
    model = hf_posext.patch_model(
        tiny_model("llama", max_positions=L_ORIG), "longrope", factor=FACTOR, factors_by=factors_by
    )
    ids = tokens(2 * L_ORIG)
    with torch.no_grad():
        cache = model(ids[:, : L_ORIG + 4], use_cache=True).cache
        cache = model(ids[:, L_ORIG + 4 : L_ORIG + 5], cache=cache, use_cache=True).cache  # past the switch
        cache.crop(-11)  # back to L_orig - 6 keys
        for t in range(L_ORIG - 6, 2 * L_ORIG - 1):
            out = model(ids[:, t : t + 1], cache=cache, use_cache=True)
            cache = out.cache
            torch.testing.assert_close(out.logits[:, -1], logits(model, ids[:, : t + 1])[:, -1], rtol=0, atol=TOL)


def test_native_cache_is_not_exact_across_the_switch():
    # Why exact_cache exists: transformers caches keys rotated with the short factors, so past the
    # switch cached decoding leaves its own full forward (exact before it).
    model = hf_posext.patch_model(
        tiny_model("llama", max_positions=L_ORIG), "longrope", factor=FACTOR, exact_cache=False
    )
    ids = tokens(3 * L_ORIG)
    prompt = L_ORIG - 5
    steps = cached_steps(model, ids, prompt)
    gap = {
        length: (steps[:, length - prompt] - logits(model, ids[:, :length])[:, -1]).abs().max().item()
        for length in (L_ORIG, 2 * L_ORIG)
    }
    assert gap[L_ORIG] < TOL and gap[2 * L_ORIG] > 1e-3, gap


def test_one_layer_model_equals_transformers_full_forward_past_the_switch():
    """hf-posext's causal definition and transformers' agree at the last position of a one-layer model."""
    model = hf_posext.patch_model(
        tiny_model("llama", max_positions=L_ORIG, layers=1), "longrope", factor=FACTOR, factors_by="query"
    )
    reference = native(model, {**model.config.rope_parameters})
    ids = tokens(3 * L_ORIG)
    torch.testing.assert_close(logits(model, ids)[:, -1], logits(reference, ids)[:, -1], rtol=0, atol=TOL)


def test_a_shipped_longrope_checkpoint_keeps_its_factors_and_gets_the_exact_cache():
    model = published_model("phi-3-mini-128k")
    shipped = copy.deepcopy(model.config.rope_parameters)
    ids = tokens(40)
    before = logits(model, ids)
    for factors_by, installed in (("sequence", switch.enabled), ("query", exact_dynamic)):
        hf_posext.patch_model(model, "longrope", factors_by=factors_by)
        assert model.config.rope_parameters == shipped
        assert installed(model)
        assert torch.equal(logits(model, ids), before)  # 40 tokens are short of 4096: the short factors, as shipped
        hf_posext.unpatch_model(model)
        assert not switch.enabled(model) and not exact_dynamic(model)


def exact_dynamic(model) -> bool:
    return any(isinstance(m, ExactDynamicRotaryEmbedding) for m in model.modules())


def test_on_a_shipped_scaling_it_composes_and_refuses_absolute_factors():
    model = published_model("phi-3-mini-128k")
    with pytest.raises(ValueError, match="long_factor and short_factor divide plain RoPE.*override=True"):
        hf_posext.patch_model(model, "longrope", factor=2, long_factor=[1.0] * 48)
    hf_posext.patch_model(model, "longrope", factor=2)
    params = model.config.rope_parameters
    assert params["short_factor"] == params["long_factor"]  # a composition: nothing switches
    assert not exact_dynamic(model) and not switch.enabled(model)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"factor": 4, "long_factor": [1.0] * 3}, "long_factor has 3 entries; this model has 16 rotary pairs"),
        ({"factor": 4, "short_factor": [1.0] * 17}, "short_factor has 17 entries"),
        ({"factor": 4, "long_factor": [1.0] * 15 + [-2.0]}, "long_factor must be a non-empty list of positive"),
        ({"factor": 4, "long_factor": "ones"}, "long_factor must be a list of positive numbers"),
        ({"factor": 4, "attention_factor": 0}, "attention_factor must be a positive number"),
        ({"factor": 0.5}, "factor must be >= 1"),
        ({"factor": 4, "exact_cache": "yes"}, "exact_cache must be True or False"),
        ({"factor": 4, "factors_by": "position"}, "factors_by must be one of 'sequence', 'query', got 'position'"),
        ({"factor": 4, "factors_by": "query", "exact_cache": False}, "factors_by='query' .* needs exact_cache=True"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    model = tiny_model("llama", max_positions=L_ORIG)
    with pytest.raises(ValueError, match=message):
        hf_posext.patch_model(model, "longrope", **kwargs)
    assert model.config.rope_parameters["rope_type"] == "default"


def test_saved_checkpoint_reloads_exact_and_loads_in_vanilla_transformers(tmp_path):
    """Each definition reloads as saved; vanilla transformers computes the default's (factors_by="query" is
    hf-posext's own: past L_orig a vanilla reader's logits differ from it)."""
    from scripts.vanilla import vanilla_logits

    ids = tokens(3 * L_ORIG)
    models = {}
    for factors_by, installed in (("sequence", switch.enabled), ("query", exact_dynamic)):
        model = hf_posext.patch_model(
            tiny_model("llama", max_positions=L_ORIG), "longrope", factor=FACTOR, factors_by=factors_by
        )
        model.save_pretrained(tmp_path / factors_by)
        reloaded = hf_posext.from_pretrained(tmp_path / factors_by, attn_implementation="eager")
        assert torch.equal(logits(reloaded, ids), logits(model, ids))
        assert installed(reloaded) and reloaded.config.hf_posext["factors_by"] == factors_by
        models[factors_by] = model
    vanilla = vanilla_logits([tmp_path / "sequence", tmp_path / "query"], [dict(input_ids=ids)], tmp_path)
    assert torch.equal(vanilla[tmp_path / "sequence"][0], logits(models["sequence"], ids))
    assert torch.equal(vanilla[tmp_path / "query"][0], logits(models["sequence"], ids))
    assert not torch.allclose(vanilla[tmp_path / "query"][0], logits(models["query"], ids), atol=1e-3)
