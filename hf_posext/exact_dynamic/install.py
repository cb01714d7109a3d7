"""Switching exact dynamic scaling on and off: the stand-in rotary module, the attention wrapper, hooks."""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn as nn

from .. import integration
from ..architectures import check_exact_dynamic
from .attention import exact_dynamic_attention
from .forward_plan import ATTENTION_PREFIX, STATE_ATTR, ExactDynamicRope, length_dependent

#: The attention kernels the exact wrapper can slice masks for.
SUPPORTED_KERNELS = ("eager", "sdpa")


class ExactDynamicRotaryEmbedding(nn.Module):
    """Stands in for a model's rotary module while exact dynamic scaling is on.

    It returns the identity rotation, so queries and keys reach the cache un-rotated, and plans
    the attention wrapper's rotations from the forward's ``position_ids`` (the layers find that
    plan by the same tensor, :meth:`ExactDynamicRope.plan`). Past saturation, once the cache
    stores its keys rotated, it returns the real rotation instead (a plain cached decode).

    Args:
        rotary: the dynamic rotary module it replaces (kept as ``.rotary`` to be put back).
        rope: the model's shared :class:`ExactDynamicRope`.
    """

    def __init__(self, rotary: nn.Module, rope: ExactDynamicRope) -> None:
        super().__init__()
        self.rotary = rotary
        self.rope = rope

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Identity ``(cos, sin)``, ``[batch, seq, rotary_dim]`` in ``x.dtype``, for ``position_ids`` ``[batch or 1, seq]``."""
        current = self.rope.config._attn_implementation
        if current != self.rope.attention_name:
            raise ValueError(
                f"attn_implementation was changed to {current!r} after exact dynamic scaling was enabled (it needs "
                f"{self.rope.attention_name!r}); call hf_posext.patch_model again after changing it"
            )
        plan = self.rope.plan(position_ids, x.shape[0])
        if self.rope.keys_rotated(plan):  # past the switch: the layers rotate, the cache keeps rotated keys
            plan.native = True
            return self.rope.saturated_cos_sin(plan.positions, x.dtype)
        shape = (x.shape[0], position_ids.shape[-1], self.rope.rotary_dim)
        one = torch.ones((), dtype=x.dtype, device=x.device).expand(shape)
        zero = torch.zeros((), dtype=x.dtype, device=x.device).expand(shape)
        return one, zero


def _install(model: nn.Module, rotary: nn.Module | None = None) -> ExactDynamicRope | None:
    """Attach a new :class:`ExactDynamicRope` to ``model``'s attention and select the wrapper kernel.

    ``None`` (nothing done) when the config's rope type is not dynamic. The rotary modules are
    left to the caller; ``rotary`` is the one a base model being built is registering.

    Raises:
        ValueError: a kernel other than eager/sdpa, or an attention that rotates otherwise than the
            wrapper (:func:`hf_posext.architectures.check_exact_dynamic`).
    """
    config = model.config
    if not length_dependent(config.rope_parameters):
        return None
    # A config that already names the wrapper (a model built from a patched model's config) wraps its kernel.
    kernel = (config._attn_implementation or "eager").removeprefix(ATTENTION_PREFIX)
    if kernel not in SUPPORTED_KERNELS:
        raise ValueError(
            f"exact_cache=True supports attn_implementation in {SUPPORTED_KERNELS}, got {kernel!r}; load the model "
            f"with one of those or patch with exact_cache=False (transformers' behaviour, stale cached keys)"
        )
    attention = check_exact_dynamic(config, model, rotary)
    rope = ExactDynamicRope(config, kernel)
    integration.register_attention_wrapper(rope.attention_name, exact_dynamic_attention, mask_like=kernel)
    for module in attention:
        setattr(module, STATE_ATTR, rope)
    config._attn_implementation = rope.attention_name
    return rope


def enable_exact_dynamic_cache(model: nn.Module) -> None:
    """Make a model patched with ``dynamic_ntk`` / ``dynamic_yarn`` exact with a KV cache (see module docs).

    A no-op when the config's rope type is not dynamic (``factor=1`` patches plain RoPE).
    Called by :func:`hf_posext.patch_model` for ``exact_cache=True``.

    Raises:
        ValueError: an attention implementation other than ``eager``/``sdpa``, or no attention modules.
    """
    disable_exact_dynamic_cache(model)
    rope = _install(model)
    if rope is None:
        return
    for name, rotary in list(integration.rotary_modules(model)):
        integration.replace_module(model, name, ExactDynamicRotaryEmbedding(rotary, rope))
        _guard_cache(model.get_submodule(name.rpartition(".")[0]), rope)


def exact_rotary_at_init(base_model: nn.Module, rotary: nn.Module) -> nn.Module | None:
    """The stand-in a base model being built from a ``dynamic_*`` config with ``exact_cache=True`` registers.

    Called while the base model registers ``rotary`` in its ``__init__`` (``from_pretrained`` of a
    saved checkpoint), after its attention layers exist and transformers has resolved
    ``config._attn_implementation``: the exact wrapper of that kernel replaces it, so that
    ``attn_implementation="eager"`` or ``"sdpa"`` passed to ``from_pretrained`` selects the
    matching wrapper. ``None`` when the rope type is not dynamic.

    Raises:
        ValueError: as :func:`enable_exact_dynamic_cache`.
    """
    rope = _install(base_model, rotary)
    if rope is None:
        return None
    _guard_cache(base_model, rope)
    return ExactDynamicRotaryEmbedding(rotary, rope)


def _note_cache(rope: ExactDynamicRope, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
    rope.note_cache(kwargs.get("cache", kwargs.get("past_key_values")))


def _guard_cache(base_model: nn.Module, rope: ExactDynamicRope) -> None:
    """Refuse preallocated caches in ``base_model``'s forward and tell ``rope`` which cache a forward
    was given (past saturation its keys are kept rotated); the hooks go with ``rope`` on disable."""
    rope.hooks.append(integration.guard_growing_cache(
        base_model, "exact dynamic scaling (exact_cache=True)",
        ", or patch with exact_cache=False (transformers' behaviour, stale cached keys)"))
    rope.hooks.append(base_model.register_forward_pre_hook(functools.partial(_note_cache, rope), with_kwargs=True))


def disable_exact_dynamic_cache(model: nn.Module) -> None:
    """Undo :func:`enable_exact_dynamic_cache` (a no-op if it is not enabled)."""
    stand_ins = [(n, m) for n, m in model.named_modules() if isinstance(m, ExactDynamicRotaryEmbedding)]
    for name, module in stand_ins:
        integration.replace_module(model, name, module.rotary)
    integration.remove_attention_state(model, STATE_ATTR)
