"""Switching exact dynamic scaling on and off: the stand-in rotary module, the attention wrapper, hooks."""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn as nn

from ... import integration
from ..guard import check_attention_kept
from ..wrapper import SUPPORTED_KERNELS, install_wrapper
from .attention import exact_dynamic_attention
from .forward_plan import ATTENTION_PREFIX, STATE_ATTR, ExactDynamicRope
from .frequencies import length_dependent

__all__ = [
    "SUPPORTED_KERNELS",
    "ExactDynamicRotaryEmbedding",
    "disable_exact_dynamic_cache",
    "enable_exact_dynamic_cache",
    "exact_rotary_at_init",
]

#: What exact dynamic scaling is called in messages, and what to do instead.
PURPOSE = "exact_cache=True"
FALLBACK = "patch with exact_cache=False (transformers' dynamic behaviour, stale cached keys)"


class ExactDynamicRotaryEmbedding(nn.Module):
    """Stands in for a model's rotary module while exact dynamic scaling is on.

    It returns the identity rotation, so queries and keys reach the cache un-rotated, and plans
    the attention wrapper's rotations from the forward's ``position_ids`` (the layers find that
    plan by the same tensor, `ExactDynamicRope.plan`). When every query has one stable length
    (past saturation; LongRoPE before its switch too) and the cache stores every key rotated with its
    frequencies, it returns the real rotation instead (a plain cached decode).

    Args:
        rotary: the dynamic rotary module it replaces (kept as ``.rotary`` to be put back).
        rope: the model's shared `ExactDynamicRope`.
    """

    def __init__(self, rotary: nn.Module, rope: ExactDynamicRope) -> None:
        super().__init__()
        self.rotary = rotary
        self.rope = rope

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Identity ``(cos, sin)`` for ``position_ids`` ``[batch or 1, seq]``.

        Both are ``[batch, seq, rotary_dim]``, in ``x.dtype``.
        """
        check_attention_kept(
            self.rope.config,
            lambda current: current == self.rope.attention_name,
            what="exact dynamic scaling",
            needs=repr(self.rope.attention_name),
            advice="call hf_posext.patch_model again after changing it",
        )
        length = self.rope.mark_native(position_ids)
        if length is not None:  # the layers rotate, the cache keeps rotated keys: no plan
            return self.rope.rotary_tables(length, position_ids, x.dtype)
        self.rope.plan(position_ids, x.shape[0])
        shape = (x.shape[0], position_ids.shape[-1], self.rope.rotary_dim)
        one = torch.ones((), dtype=x.dtype, device=x.device).expand(shape)
        zero = torch.zeros((), dtype=x.dtype, device=x.device).expand(shape)
        return one, zero


def _install(model: nn.Module, rotary: nn.Module | None, guarded: list[nn.Module]) -> ExactDynamicRope | None:
    """Attach a new `ExactDynamicRope` to ``model``'s attention and select the wrapper kernel.

    ``None`` (nothing done) when the config's rope type is not dynamic. The rotary modules are
    left to the caller; ``rotary`` is the one a base model being built is registering; the
    ``guarded`` modules refuse preallocated caches and tell the state which cache a forward was
    given (at a stable length its keys are kept rotated).

    Raises:
        ValueError: a kernel other than eager/sdpa, or an attention that rotates otherwise than the
            wrapper (`hf_posext.architectures.check_wrappable_attention`).
    """
    config = model.config
    if not length_dependent(config.rope_parameters):
        return None
    rope = install_wrapper(
        model,
        lambda kernel: ExactDynamicRope(config, kernel),
        exact_dynamic_attention,
        prefix=ATTENTION_PREFIX,
        state_attr=STATE_ATTR,
        purpose=PURPOSE,
        fallback=FALLBACK,
        rotary=rotary,
        guarded=guarded,
        needs="exact dynamic scaling (exact_cache=True)",
        alternative=f", or {FALLBACK}",
    )
    for base in guarded:  # the hooks go with the state on disable
        rope.hooks.append(base.register_forward_pre_hook(functools.partial(_note_cache, rope), with_kwargs=True))
    return rope


def _note_cache(rope: ExactDynamicRope, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
    rope.note_cache(kwargs.get("cache", kwargs.get("past_key_values")))


def enable_exact_dynamic_cache(model: nn.Module) -> None:
    """Make a model patched with ``dynamic_ntk`` / ``dynamic_yarn`` exact with a KV cache (see module docs).

    A no-op when the config's rope type is not dynamic (``factor=1`` patches plain RoPE).
    Called by [`hf_posext.patch_model`][hf_posext.patch_model] for ``exact_cache=True``.

    Raises:
        ValueError: an attention implementation other than ``eager``/``sdpa``, or no attention modules.
    """
    disable_exact_dynamic_cache(model)
    rotaries = list(integration.rotary_modules(model))
    rope = _install(model, None, [model.get_submodule(name.rpartition(".")[0]) for name, _ in rotaries])
    if rope is None:
        return
    for name, rotary in rotaries:
        integration.replace_module(model, name, ExactDynamicRotaryEmbedding(rotary, rope))


def exact_rotary_at_init(base_model: nn.Module, rotary: nn.Module) -> nn.Module | None:
    """The stand-in a base model being built from a ``dynamic_*`` config with ``exact_cache=True`` registers.

    Called while the base model registers ``rotary`` in its ``__init__`` (``from_pretrained`` of a
    saved checkpoint), after its attention layers exist and transformers has resolved
    ``config._attn_implementation``: the exact wrapper of that kernel replaces it, so that
    ``attn_implementation="eager"`` or ``"sdpa"`` passed to ``from_pretrained`` selects the
    matching wrapper. ``None`` when the rope type is not dynamic.

    Raises:
        ValueError: as `enable_exact_dynamic_cache`.
    """
    rope = _install(base_model, rotary, [base_model])
    return None if rope is None else ExactDynamicRotaryEmbedding(rotary, rope)


def disable_exact_dynamic_cache(model: nn.Module) -> None:
    """Undo `enable_exact_dynamic_cache` (a no-op if it is not enabled)."""
    stand_ins = [(n, m) for n, m in model.named_modules() if isinstance(m, ExactDynamicRotaryEmbedding)]
    for name, module in stand_ins:
        integration.replace_module(model, name, module.rotary)
    integration.remove_attention_state(model, STATE_ATTR)
