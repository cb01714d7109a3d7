"""Attention maps (``output_attentions=True``) through the wrappers hf-posext installs.

sdpa returns no attention weights (transformers then gives ``attentions = ()``): a wrapper of sdpa
runs eager's kernel for a forward that asks for maps (`kernel_function`), on eager's additive
form of the sdpa mask (`additive_mask`). Tests: ``tests/attention/test_wrapper.py``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .. import integration


def attention_maps_requested(module: nn.Module, kwargs: dict[str, Any]) -> bool:
    """Whether the forward running ``module`` collects attention maps (``output_attentions``).

    transformers 5.24's ``capture_outputs`` reads ``output_attentions`` from the forward's arguments,
    else from the config, and records the second output of each attention module; the argument
    reaches the attention function among its keyword arguments, the config's setting does not.
    """
    if "output_attentions" in kwargs:
        return bool(kwargs["output_attentions"])
    return bool(getattr(getattr(module, "config", None), "output_attentions", False))


def kernel_function(kernel: str, module: nn.Module, kwargs: dict[str, Any]) -> Callable[..., Any]:
    """The attention function of the wrapped ``kernel`` for ``module``: eager's where attention maps are asked for.

    sdpa returns no attention weights (transformers then warns once and ``attentions`` comes back
    empty); eager computes the same attention and returns them. It is given the sdpa mask in its own
    additive form (`additive_mask`).
    """
    if kernel == "sdpa" and attention_maps_requested(module, kwargs):
        return functools.partial(_eager_on_any_mask, integration.attention_function("eager", module))
    return integration.attention_function(kernel, module)


def additive_mask(mask: torch.Tensor | None, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """Eager's additive float mask (0 or the dtype's minimum) for a kernel's mask.

    ``None`` (sdpa's plain causal) is causal with the queries as the last rows (``[1, 1, q, kv]``), a
    boolean mask (True attends) is turned, a float one is returned as it is.
    """
    rows, keys = query.shape[2], key.shape[2]
    if mask is None:
        columns = torch.arange(keys, device=query.device)
        mask = (columns[None, :] <= torch.arange(keys - rows, keys, device=query.device)[:, None])[None, None]
    if mask.dtype != torch.bool:
        return mask
    additive = torch.zeros(mask.shape, dtype=query.dtype, device=query.device)
    return additive.masked_fill_(~mask, torch.finfo(query.dtype).min)


def _eager_on_any_mask(
    eager: Callable[..., Any],
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    return eager(module, query, key, value, additive_mask(attention_mask, query, key), **kwargs)


__all__ = ["additive_mask", "attention_maps_requested", "kernel_function"]
