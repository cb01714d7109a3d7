"""One LongRoPE factor set at every position of a forward (``pinned_factors``: LongRoPE2's mixed-window training).

References: the same weights patched with only the short (resp. long) factors, where nothing
switches (transformers' own ``longrope`` rotary with equal lists), on positions that straddle the
switch as PoSE samples do; for ``keep_first``, the keep-first model without the exact cache, whose
rotary module gives every position of a sequence past L_orig the long set (the kept ones plain).
"""

from __future__ import annotations

import pytest
import torch
from tests.helpers.models import tiny_model, tokens

import hf_posext
from hf_posext.methods.longrope import pinned_factors

pytestmark = pytest.mark.usefixtures("one_thread")

L_ORIG = 16
FACTOR = 4
PAIRS = 16  # head_dim 32
SHORT = [1.0 + 0.5 * i / (PAIRS - 1) for i in range(PAIRS)]  # not ones: the short set is more than plain RoPE
LONG = [1.0 + 3.0 * i / (PAIRS - 1) for i in range(PAIRS)]
ATTENTION = 1.2
#: PoSE-like rows: two chunks, one within L_orig and one past it, and a row within L_orig only.
POSITIONS = torch.tensor([[*range(8), *range(30, 38)], [*range(12), *range(50, 54)], [*range(16)]])


def base():
    return tiny_model("llama", head_dim=32, max_positions=L_ORIG)


def patched(model, short=SHORT, long=LONG, **kwargs):
    return hf_posext.patch_model(
        model, "longrope", factor=FACTOR, short_factor=short, long_factor=long, attention_factor=ATTENTION, **kwargs
    )


def logits(model, ids, positions=POSITIONS):
    with torch.no_grad():
        mask = torch.ones_like(ids)  # skipped positions are no packed-sequence boundaries (as PoSE passes)
        return model(ids, position_ids=positions, attention_mask=mask, use_cache=False).logits


@pytest.mark.parametrize("exact_cache", [True, False], ids=["exact", "native"])
@pytest.mark.parametrize("which", ["short", "long"])
def test_every_position_uses_one_set_as_the_model_with_only_that_set(exact_cache, which):
    ids = tokens(16, batch=3)
    model = patched(base(), exact_cache=exact_cache)
    only = patched(base(), short=SHORT if which == "short" else LONG, long=SHORT if which == "short" else LONG)
    before = logits(model, ids)
    with pinned_factors(model, which):
        got = logits(model, ids)
    torch.testing.assert_close(got, logits(only, ids), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits(model, ids), before, rtol=0, atol=0)  # the model's own rule again


def test_without_the_pin_the_rows_length_picks_the_set():
    """Why the recipe pins: by default a row's largest position picks one set for the row (a PoSE row within
    L_orig gets the short one, whatever target it stands for); factors_by="query" gives a row straddling the
    switch both sets."""
    ids = tokens(16, batch=3)
    model = patched(base())
    short, long = (logits(patched(base(), short=which, long=which), ids) for which in (SHORT, LONG))
    torch.testing.assert_close(logits(model, ids)[:2], long[:2], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits(model, ids)[2:], short[2:], rtol=1e-5, atol=1e-5)
    query = patched(base(), factors_by="query")
    for only in (short, long):
        assert (logits(query, ids) - only).abs().amax(dim=(1, 2))[:2].min() > 1e-3


def test_a_cache_filled_while_pinned_follows_the_pin():
    """Cached decoding inside the block: the cache holds the pinned set and the switch computes nothing again."""
    model, ids = patched(base()), tokens(L_ORIG + 8)
    with pinned_factors(model, "long"), torch.no_grad():
        cache = model(ids[:, : L_ORIG - 4], use_cache=True).cache
        for t in range(L_ORIG - 4, L_ORIG + 8):
            out = model(ids[:, t : t + 1], cache=cache, use_cache=True)
            full = model(ids[:, : t + 1], use_cache=False).logits[:, -1]
            torch.testing.assert_close(out.logits[:, -1], full, rtol=0, atol=1e-5)


@pytest.mark.parametrize("exact_cache", [True, False], ids=["exact", "native"])
def test_long_keeps_the_first_positions_plain(exact_cache):
    ids = tokens(16, batch=3)
    model = patched(base(), keep_first=4, exact_cache=exact_cache)
    with pinned_factors(model, "long"):
        got = logits(model, ids)
    # transformers' rule (every position of a sequence past L_orig long, the kept ones plain) on the rows past it
    reference = logits(patched(base(), keep_first=4, exact_cache=False), ids)
    torch.testing.assert_close(got[:2], reference[:2], rtol=1e-5, atol=1e-5)
    with pinned_factors(model, "short"):
        torch.testing.assert_close(logits(model, ids), logits(patched(base(), long=SHORT), ids), rtol=1e-5, atol=1e-5)


def test_the_backward_recomputation_keeps_the_pinned_set():
    """Activation checkpointing recomputes each layer in the backward: its gradients are the long-only model's."""
    ids = tokens(16, batch=3)
    grads = []
    for model, pinned in ((patched(base()), True), (patched(base(), short=LONG), False)):
        model.train()
        model.activation_checkpointing_enable()
        with pinned_factors(model, "long") if pinned else torch.enable_grad():
            out = model(ids, position_ids=POSITIONS, attention_mask=torch.ones_like(ids), labels=ids, use_cache=False)
            out.loss.backward()
        grads.append({name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name, grad in grads[1].items():
        torch.testing.assert_close(grads[0][name], grad, rtol=1e-4, atol=1e-6)


def test_a_peft_wrapped_model_is_pinned_too():
    peft = pytest.importorskip("peft")
    ids = tokens(16, batch=3)
    model = peft.get_peft_model(patched(base()), peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    with pinned_factors(model, "long"):
        got = logits(model, ids)
    torch.testing.assert_close(got, logits(patched(base(), short=LONG), ids), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("make", "which", "match"),
    [
        (lambda: patched(base()), "middle", r"which must be one of short, long; got 'middle'"),
        (lambda: hf_posext.patch_model(base(), "yarn", factor=2), "long", r"needs a model patched with longrope.*yarn"),
        (lambda: base(), "long", r"needs a model patched with longrope.*default"),
    ],
)
def test_bad_input_is_refused_naming_it(make, which, match):
    model = make()
    with pytest.raises(ValueError, match=match), pinned_factors(model, which):
        pass
