"""Installing an attention wrapper: what remapping (:mod:`.remap_install`) and exact dynamic scaling share.

A wrapper wraps the model's own kernel (one of :data:`SUPPORTED_KERNELS`) under the name
``prefix + kernel``: :func:`install_wrapper` checks the kernel and the attention, registers the
wrapper, hands each attention module the state and refuses preallocated caches. The guard against
a later change of attention implementation is :mod:`.guard`'s.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

import torch
from torch import nn

from .. import integration
from ..architectures import check_wrappable_attention

#: The kernels an hf-posext attention wrapper wraps (whose masks it reads).
SUPPORTED_KERNELS = ("eager", "sdpa")


class WrapperState(Protocol):
    """What the attention modules of a wrapped model hold (:func:`integration.remove_attention_state` undoes it)."""

    kernel: str
    hooks: list[Any]

    @property
    def attention_name(self) -> str: ...


State = TypeVar("State", bound=WrapperState)


def wrapped_kernel(requested: str | None, prefix: str, *, purpose: str, fallback: str, saved: str | None = None) -> str:
    """The kernel a wrapper is to wrap for ``config._attn_implementation = requested``.

    ``None`` is eager; a name that already is ``prefix + kernel`` (a model built from a patched
    model's config) wraps that kernel; ``saved``, the name a saved checkpoint carries, wraps sdpa.

    Raises:
        ValueError: a kernel outside :data:`SUPPORTED_KERNELS`, naming ``purpose`` and ``fallback``.
    """
    kernel = "sdpa" if saved is not None and requested == saved else (requested or "eager").removeprefix(prefix)
    if kernel not in SUPPORTED_KERNELS:
        raise ValueError(
            f"{purpose} supports attn_implementation in {SUPPORTED_KERNELS}, got {kernel!r}; load the "
            f"model with one of those or {fallback}"
        )
    return kernel


def kernel_function(kernel: str, module: nn.Module, kwargs: dict[str, Any]) -> Callable[..., Any]:
    """The attention function of the wrapped ``kernel`` for ``module``: eager's where attention maps are asked for.

    sdpa returns no attention weights (transformers then warns once and ``attentions`` comes back
    empty); eager computes the same attention and returns them. It is given the sdpa mask in its own
    additive form (:func:`additive_mask`).
    """
    if kernel == "sdpa" and integration.attention_maps_requested(module, kwargs):
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


def install_wrapper(
    model: nn.Module,
    make_state: Callable[[str], State],
    attention_fn: Callable[..., Any],
    *,
    prefix: str,
    state_attr: str,
    purpose: str,
    fallback: str,
    rotary: nn.Module | None = None,
    saved: str | None = None,
    guarded: Iterable[nn.Module],
    needs: str,
    alternative: str = "",
) -> State:
    """Wrap the kernel of ``model``'s attention with ``attention_fn`` and hand every attention module the state.

    Args:
        model: a causal LM or its base model (possibly being built: then pass ``rotary``).
        make_state: ``make_state(kernel)``, the state the attention modules share (under ``state_attr``).
        prefix, saved: as :func:`wrapped_kernel`; the wrapper is registered as ``prefix + kernel``.
        purpose, fallback: what needs the wrapper and what to do instead, for the error messages.
        rotary: the rotary module a base model under construction is registering.
        guarded: the modules whose forward then refuses a preallocated cache
            (:func:`integration.guard_growing_cache` with ``needs`` and ``alternative``).

    Raises:
        ValueError: a kernel other than eager/sdpa, or an attention the wrapper cannot rotate for
            (:func:`hf_posext.architectures.check_wrappable_attention`).
    """
    config = model.config
    kernel = wrapped_kernel(
        integration.attention_implementation(config), prefix, purpose=purpose, fallback=fallback, saved=saved
    )
    attention = check_wrappable_attention(config, model, rotary, purpose=purpose, fallback=fallback)
    state = make_state(kernel)
    integration.register_attention_wrapper(state.attention_name, attention_fn, mask_like=kernel)
    for module in attention:
        module.__dict__[state_attr] = state
    integration.set_attention_implementation(config, state.attention_name)
    for base in guarded:
        state.hooks.append(integration.guard_growing_cache(base, needs, alternative))
    return state
