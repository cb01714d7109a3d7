"""Switching remapped attention (:mod:`.remap`) on and off in a model: state, kernel name, cache guard."""

from __future__ import annotations

from torch import nn

from .. import integration
from ..architectures import check_exact_dynamic
from ..rope_utils import REMAP_ROPE_TYPE, REMAPPED_TYPE_KEY, rope_parameters_for
from .remap import (
    ATTENTION_PREFIX,
    SAVED_ATTENTION,
    STATE_ATTR,
    SUPPORTED_KERNELS,
    Remapping,
    RemapState,
    remap_attention,
)


def install_remapping(model: nn.Module, remapping: Remapping, rotary: nn.Module | None = None) -> RemapState:
    """Give every attention module of ``model`` the remapping and select the wrapper of its kernel.

    Args:
        model: a causal LM or its base model (possibly being built: then pass ``rotary``).
        remapping: the method's remapping.
        rotary: the rotary module being registered by a base model under construction.

    Raises:
        ValueError: a kernel other than eager/sdpa, several rotary modules, or an attention that
            does not rotate channel pairs ``(i, i + d/2)`` (interleaved pairs, multi-head latent attention).
    """
    uninstall_remapping(model)
    config = model.config
    requested = config._attn_implementation
    kernel = "sdpa" if requested == SAVED_ATTENTION else (requested or "eager").removeprefix(ATTENTION_PREFIX)
    if kernel not in SUPPORTED_KERNELS:
        raise ValueError(f"{remapping.name} supports attn_implementation in {SUPPORTED_KERNELS}, got {kernel!r}; load "
                         f"the model with one of those")
    found = [(name, module) for name, module in integration.rotary_modules(model)]
    if rotary is None:
        if len(found) != 1:
            raise ValueError(f"{remapping.name} needs exactly one rotary module, {type(model).__name__} has "
                             f"{[name for name, _ in found]}")
        rotary = found[0][1]
    purpose = f"{remapping.name} (model_type={getattr(config, 'model_type', None)!r})"
    attention = check_exact_dynamic(config, model, rotary, purpose=purpose,
                                    fallback="use a rope method (yarn, ntk) instead")
    params = rope_parameters_for(config)
    if params.get("rope_type") == REMAP_ROPE_TYPE:
        # transformers' forward switches longrope's factors by the module's rope type: the shipped one
        rotary.rope_type = params.get(REMAPPED_TYPE_KEY, "default")
    state = RemapState(remapping, rotary, kernel)
    integration.register_attention_wrapper(state.attention_name, remap_attention, mask_like=kernel)
    for module in attention:
        module.__dict__[STATE_ATTR] = state
    config._attn_implementation = state.attention_name
    base = model.get_submodule(found[0][0].rpartition(".")[0]) if found else model
    state.hooks.append(integration.guard_growing_cache(base, f"training-free attention ({remapping.name})"))
    return state


def uninstall_remapping(model: nn.Module) -> None:
    """Undo :func:`install_remapping` (a no-op when it is not installed)."""
    integration.remove_attention_state(model, STATE_ATTR)
