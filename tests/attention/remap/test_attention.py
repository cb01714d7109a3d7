"""Remapped attention (:mod:`hf_posext.attention.remap`) in low precision: bf16/fp16 autocast and half models.

Every remapping method, training and inference, left padding (the mask path) and none (the fused
path): as close to its own fp32 result as the unpatched model's low precision is to its fp32.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch

import hf_posext
from tests.helpers.models import tiny_model, tokens

#: Every remapping method, with windows well inside the 100-token inputs so that most pairs are remapped.
CASES = {
    "self_extend": {"group_size": 4, "window_size": 16},
    "dca": {"chunk_size": 48, "local_size": 8},
    "string": {"shift": 24, "local_window": 8},
    "rerope": {"window": 16},
    "rerope-leaky": {"window": 16, "leak": 16},
}
HALF = [torch.bfloat16, torch.float16]
PAD = 7

pytestmark = pytest.mark.usefixtures("one_thread")


@functools.cache
def native(kernel: str):
    return tiny_model(attn_implementation=kernel)


def patched(model, case):
    return hf_posext.patch_model(copy.deepcopy(model), case.split("-")[0], **CASES[case])


def batch(padded: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    ids = tokens(100, batch=2)
    if not padded:
        return ids, None
    mask = torch.ones_like(ids)
    mask[0, :PAD] = 0
    return ids, mask


def logits(model, ids, mask, dtype=None) -> torch.Tensor:
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        return model(ids, attention_mask=mask).logits.float()[:, PAD:]  # the padded row's real tokens


@functools.cache
def native_error(kernel: str, dtype: torch.dtype, padded: bool) -> float:
    return error(native(kernel), *batch(padded), dtype)


def error(model, ids, mask, dtype) -> float:
    return (logits(model, ids, mask, dtype) - logits(model, ids, mask)).abs().max().item()


@pytest.mark.parametrize("padded", [True, False], ids=["left-padded", "unpadded"])
@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("case", CASES)
def test_autocast_inference_is_as_close_to_fp32_as_the_native_model(case, dtype, kernel, padded):
    model = patched(native(kernel), case)
    ids, mask = batch(padded)
    got = error(model, ids, mask, dtype)
    assert got <= 2 * native_error(kernel, dtype, padded), (got, native_error(kernel, dtype, padded))


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("case", CASES)
def test_a_half_precision_model_with_left_padding_is_as_close_to_fp32_as_the_native_model(case, dtype):
    model = patched(native("sdpa"), case)
    ids, mask = batch(padded=True)
    plain = native("sdpa")
    native_error = (logits(copy.deepcopy(plain).to(dtype), ids, mask) - logits(plain, ids, mask)).abs().max()
    got = (logits(copy.deepcopy(model).to(dtype), ids, mask) - logits(model, ids, mask)).abs().max()
    assert got <= 2 * native_error, (got, native_error)


def gradients(model, ids, mask, dtype=None) -> torch.Tensor:
    model = copy.deepcopy(model).train()
    labels = ids.masked_fill(mask == 0, -100)
    with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        loss = model(ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@functools.cache
def native_gradient_error(kernel: str, dtype: torch.dtype) -> float:
    return gradient_error(native(kernel), *batch(padded=True), dtype)


def gradient_error(model, ids, mask, dtype) -> float:
    want = gradients(model, ids, mask)
    return ((gradients(model, ids, mask, dtype) - want).norm() / want.norm()).item()


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("case", CASES)
def test_an_autocast_training_step_with_left_padding_is_as_close_to_fp32_as_the_native_one(case, dtype, kernel):
    model = patched(native(kernel), case)
    got = gradient_error(model, *batch(padded=True), dtype)
    assert got <= 2 * native_gradient_error(kernel, dtype), (got, native_gradient_error(kernel, dtype))
