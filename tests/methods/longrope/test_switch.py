"""LongRoPE's default: transformers' own ``longrope``, and a cache that recomputes its prefix at the switch.

References: transformers' own ``longrope`` model with the same rope parameters and weights (in this
process, and vanilla transformers reading the saved checkpoint in a fresh interpreter without the
plugin), and the property that cached decoding (a manual loop, ``generate`` with left padding and
beams, a cache cropped back) equals a full forward over the sequence so far at every step.
docs/methods/longrope.md.
"""

from __future__ import annotations

import copy

import pytest
import torch
from tests.helpers.models import tiny_model, tokens
from transformers import DynamicCache

import hf_posext
from hf_posext.methods.longrope import switch

pytestmark = pytest.mark.usefixtures("one_thread")

L_ORIG = 64
FACTOR = 4
LENGTH = 160
TOL = 1e-5
ARCHS = ("llama", "qwen2", "mistral")  # mistral's window (2 L_orig) is shorter than LENGTH


def transformers_longrope(model):
    """transformers' own model of ``model``'s class with ``model``'s rope parameters and weights (no plugin)."""
    config = copy.deepcopy(model.config)
    del config.hf_posext
    built = type(model)(config).eval()
    built.load_state_dict(model.state_dict())
    return built


def logits(model, ids, **kwargs):
    with torch.no_grad():
        return model(ids, use_cache=False, **kwargs).logits


def recomputes(monkeypatch):
    """The prefix length of every recompute the switch runs."""
    calls = []
    run = switch.recompute_prefix
    monkeypatch.setattr(switch, "recompute_prefix", lambda *a, **k: (calls.append(a[2]), run(*a, **k))[1])
    return calls


@pytest.mark.parametrize("arch", ARCHS)
def test_default_full_forward_is_transformers_longrope(arch):
    model = hf_posext.patch_model(tiny_model(arch, max_positions=L_ORIG), "longrope", factor=FACTOR)
    reference = transformers_longrope(model)
    ids = tokens(LENGTH, batch=2)
    for length in (L_ORIG, L_ORIG + 1, LENGTH):
        assert torch.equal(logits(model, ids[:, :length]), logits(reference, ids[:, :length])), length


def test_the_saved_checkpoint_means_the_same_model_to_vanilla_transformers(tmp_path):
    from scripts.vanilla import vanilla_logits

    model = hf_posext.patch_model(tiny_model("llama", max_positions=L_ORIG), "longrope", factor=FACTOR)
    model.save_pretrained(tmp_path / "lr")
    ids = tokens(LENGTH)
    vanilla = vanilla_logits([tmp_path / "lr"], [dict(input_ids=ids)], tmp_path)
    assert torch.equal(vanilla[tmp_path / "lr"][0], logits(model, ids))
    reloaded = hf_posext.from_pretrained(tmp_path / "lr", attn_implementation="eager")
    assert torch.equal(logits(reloaded, ids), logits(model, ids))


def decode(model, ids, prompt, cache=None, chunk=1):
    """Logits of the last token of each forward of a manual cached loop: a ``prompt`` prefill, then ``chunk``s."""
    out = []
    with torch.no_grad():
        result = model(ids[:, :prompt], cache=cache, use_cache=True)
        cache, ends = result.cache, [prompt]
        out.append(result.logits[:, -1])
        for start in range(prompt, ids.shape[1], chunk):
            result = model(ids[:, start : start + chunk], cache=cache, use_cache=True)
            cache = result.cache
            out.append(result.logits[:, -1])
            ends.append(min(start + chunk, ids.shape[1]))
    return torch.stack(out, dim=1), ends, cache


@pytest.mark.parametrize("arch", (*ARCHS, "qwen3"))
def test_cached_decoding_across_the_switch_equals_the_full_forward(arch, monkeypatch):
    calls = recomputes(monkeypatch)
    model = hf_posext.patch_model(tiny_model(arch, max_positions=L_ORIG), "longrope", factor=FACTOR)
    ids = tokens(LENGTH - 40, batch=2)
    steps, ends, _ = decode(model, ids, L_ORIG - 4)
    for index, end in enumerate(ends):
        expected = logits(model, ids[:, :end])[:, -1]
        torch.testing.assert_close(steps[:, index], expected, rtol=0, atol=TOL, msg=f"{arch}, {end} tokens")
    assert calls == [L_ORIG]  # the step to L_orig + 1 tokens recomputes the L_orig before it, once


@pytest.mark.parametrize("prompt", (L_ORIG // 2, L_ORIG + 10))
def test_a_prefill_that_continues_a_cache_across_or_past_the_switch(prompt, monkeypatch):
    calls = recomputes(monkeypatch)
    model = hf_posext.patch_model(tiny_model("mistral", max_positions=L_ORIG), "longrope", factor=FACTOR)
    ids = tokens(LENGTH)
    steps, ends, _ = decode(model, ids, prompt, chunk=50)
    for index, end in enumerate(ends):
        torch.testing.assert_close(steps[:, index], logits(model, ids[:, :end])[:, -1], rtol=0, atol=TOL)
    assert calls == ([prompt] if prompt <= L_ORIG else [])


def test_a_cache_given_before_the_prefill_and_one_cropped_back_stay_exact(monkeypatch):
    calls = recomputes(monkeypatch)
    model = hf_posext.patch_model(tiny_model("llama", max_positions=L_ORIG), "longrope", factor=FACTOR)
    ids = tokens(LENGTH)
    _, _, cache = decode(model, ids[:, : L_ORIG + 8], L_ORIG - 2, cache=DynamicCache(config=model.config))
    assert calls == [L_ORIG]
    cache.crop(-14)  # back to L_orig - 6 tokens, computed with the long factors
    with torch.no_grad():
        for t in range(L_ORIG - 6, L_ORIG + 4):
            out = model(ids[:, t : t + 1], cache=cache, use_cache=True)
            torch.testing.assert_close(out.logits[:, -1], logits(model, ids[:, : t + 1])[:, -1], rtol=0, atol=TOL)
    assert calls == [L_ORIG, L_ORIG - 6, L_ORIG]  # back to the short factors, then the switch again


def test_a_copied_cache_keeps_its_own_prefix(monkeypatch):
    model = hf_posext.patch_model(tiny_model("llama", max_positions=L_ORIG), "longrope", factor=FACTOR)
    ids, other = tokens(L_ORIG + 4, seed=1), tokens(L_ORIG + 4, seed=2)
    other[:, : L_ORIG // 2] = ids[:, : L_ORIG // 2]
    with torch.no_grad():
        shared = model(ids[:, : L_ORIG // 2], use_cache=True).cache
        for sequence in (ids, other):
            cache = copy.deepcopy(shared)
            for t in range(L_ORIG // 2, L_ORIG + 4):
                out = model(sequence[:, t : t + 1], cache=cache, use_cache=True)
            torch.testing.assert_close(out.logits[:, -1], logits(model, sequence)[:, -1], rtol=0, atol=TOL)


def generate(model, ids, **kwargs):
    kwargs = dict(do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0, **kwargs)
    with torch.no_grad():
        return model.generate(ids, **kwargs)


@pytest.mark.parametrize("arch", ("llama", "mistral"))
def test_left_padded_batched_generate_equals_each_row_alone(arch):
    model = hf_posext.patch_model(tiny_model(arch, max_positions=L_ORIG), "longrope", factor=FACTOR)
    ids = tokens(L_ORIG - 8, batch=2)
    ids[1, :5] = 0
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    batched = generate(model, ids, attention_mask=mask, max_new_tokens=24)
    for row, start in ((0, 0), (1, 5)):
        alone = generate(model, ids[row : row + 1, start:], max_new_tokens=24)
        torch.testing.assert_close(
            torch.stack(batched.logits, 1)[row], torch.stack(alone.logits, 1)[0], rtol=0, atol=TOL
        )
        prompt = ids.shape[1] - start
        for step, scores in enumerate(alone.logits):  # each step: the last row of a forward over its sequence
            full = logits(model, alone.sequences[:, : prompt + step])[:, -1]
            torch.testing.assert_close(scores, full, rtol=0, atol=TOL, msg=f"row {row}, step {step}")


def test_beam_search_with_the_cache_equals_beam_search_without():
    model = hf_posext.patch_model(tiny_model("llama", max_positions=L_ORIG), "longrope", factor=FACTOR)
    ids = tokens(L_ORIG - 6)
    kwargs = dict(max_new_tokens=14, num_beams=3, num_return_sequences=3, output_scores=True)
    cached = generate(model, ids, **kwargs)
    uncached = generate(model, ids, use_cache=False, **kwargs)
    assert torch.equal(cached.sequences, uncached.sequences)
    torch.testing.assert_close(cached.sequences_scores, uncached.sequences_scores, rtol=0, atol=1e-4)


def test_a_prompt_given_as_embeddings_is_computed_again_from_them():
    """generate from inputs_embeds (then token ids) across the switch: the recompute replays both kinds."""
    model = hf_posext.patch_model(tiny_model("llama", max_positions=L_ORIG), "longrope", factor=FACTOR)
    ids = tokens(L_ORIG - 3)
    embeds = model.get_input_embeddings()(ids).detach()
    from_ids = generate(model, ids, max_new_tokens=8)
    from_embeds = generate(model, None, inputs_embeds=embeds, max_new_tokens=8)
    assert torch.equal(from_embeds.sequences, from_ids.sequences[:, ids.shape[1] :])
    torch.testing.assert_close(torch.stack(from_embeds.logits), torch.stack(from_ids.logits), rtol=0, atol=TOL)
