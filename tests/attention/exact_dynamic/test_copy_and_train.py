"""Exact-dynamic models can be copied, pickled, saved whole and trained (issue 24, items 2 and 5)."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from tests.helpers.models import tiny_model, tokens

import hf_posext

METHODS = ("dynamic_ntk", "dynamic_yarn")
L_ORIG = 16
FACTOR = 4

pytestmark = pytest.mark.usefixtures("one_thread")


def patched(method):
    return hf_posext.patch_model(tiny_model(max_positions=L_ORIG), method, factor=FACTOR)


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def round_trip_torch_save(model):
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


@pytest.mark.parametrize(
    "copier",
    [copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m)), round_trip_torch_save],
    ids=["deepcopy", "pickle", "torch.save"],
)
@pytest.mark.parametrize("method", METHODS)
def test_copies_are_equal_models(method, copier):
    model = patched(method)
    ids = tokens(3 * L_ORIG)
    before = logits(model, ids)  # fills the frequency cache and plans the copy must not share
    clone = copier(model)
    assert torch.equal(logits(clone, ids), before)
    assert hf_posext.patch_info(clone) == hf_posext.patch_info(model)
    # the copy is a model of its own: unpatching it leaves the original exact
    hf_posext.unpatch_model(clone)
    assert not torch.equal(logits(clone, ids), before)
    assert torch.equal(logits(model, ids), before)


def loss_and_grads(model, ids):
    model.zero_grad()
    loss = model(ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
@pytest.mark.parametrize("method", METHODS)
def test_a_forward_with_gradients_is_exact_and_differentiable(method, kernel, monkeypatch):
    """Past L_orig every row has its own frequencies; with gradients on they take a differentiable path
    whose logits equal the inference path's and whose gradients equal the kernel reference's."""
    model = hf_posext.patch_model(tiny_model(max_positions=L_ORIG, attn_implementation=kernel), method, factor=FACTOR)
    ids = tokens(3 * L_ORIG, batch=2)
    with torch.no_grad():
        inference = model(ids).logits
    model.train()
    loss, grads = loss_and_grads(model, ids)
    assert torch.allclose(model(ids).logits, inference, atol=2e-5, rtol=0)
    from hf_posext.attention.exact_dynamic import attention

    monkeypatch.setattr(attention, "attend_rowwise", attention.attend_rowwise_by_kernel)  # the reference
    reference_loss, reference = loss_and_grads(model, ids)
    assert torch.allclose(loss, reference_loss, atol=1e-6)
    assert grads.keys() == reference.keys() and len(grads) > 0
    for name, grad in grads.items():
        assert torch.allclose(grad, reference[name], atol=1e-5, rtol=1e-4), name
