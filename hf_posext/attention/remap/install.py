"""Switching remapped attention (`attention`) on and off in a model, with `wrapper.install_wrapper`.

And the guard that refuses a forward after the attention implementation was changed away from it.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ... import integration
from ...rope_utils import REMAP_ROPE_TYPE, REMAPPED_TYPE_KEY, rope_parameters_for
from ..guard import check_attention_kept, install_forward_guard, remove_forward_guard
from ..wrapper import install_wrapper
from .attention import ATTENTION_PREFIX, SAVED_ATTENTION, STATE_ATTR, Remapping, RemapState, remap_attention

#: What to do instead when a model cannot be remapped.
FALLBACK = "use a rope method (yarn, ntk) instead"
#: The attribute of the base model holding the handle of its attention guard.
_GUARD_HANDLE = "_hf_posext_remap_guard"


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
    found = list(integration.rotary_modules(model))
    if rotary is None and len(found) != 1:
        raise ValueError(
            f"{remapping.name} needs exactly one rotary module, {type(model).__name__} has "
            f"{[name for name, _ in found]}"
        )
    used = rotary if rotary is not None else found[0][1]
    base = model.get_submodule(found[0][0].rpartition(".")[0]) if found else model
    state = install_wrapper(
        model,
        lambda kernel: RemapState(remapping, used, kernel),
        remap_attention,
        prefix=ATTENTION_PREFIX,
        state_attr=STATE_ATTR,
        saved=SAVED_ATTENTION,
        rotary=rotary,
        purpose=f"{remapping.name} (model_type={getattr(model.config, 'model_type', None)!r})",
        fallback=FALLBACK,
        guarded=[base],
        needs=f"training-free attention ({remapping.name})",
    )
    params = rope_parameters_for(model.config)
    if params.get("rope_type") == REMAP_ROPE_TYPE:
        # transformers' forward switches longrope's factors by the module's rope type: the shipped one
        used.rope_type = params.get(REMAPPED_TYPE_KEY, "default")
    return state


def uninstall_remapping(model: nn.Module) -> None:
    """Undo `install_remapping` (a no-op when it is not installed)."""
    integration.remove_attention_state(model, STATE_ATTR)


def _is_remapping(implementation: str | None) -> bool:
    return implementation == SAVED_ATTENTION or str(implementation).startswith(ATTENTION_PREFIX)


def _refuse_changed_attention(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
    """Forward pre-hook of a remapped base model: its attention implementation must still be the remapping's."""
    method = module.config.hf_posext["method"]
    check_attention_kept(
        module.config,
        _is_remapping,
        what=method,
        needs=f"the remapping attention {ATTENTION_PREFIX}<kernel>; without it the model runs plain RoPE past its "
        f"context",
        advice=f"to run {method} on another kernel, unpatch, set the implementation, then call "
        f"hf_posext.patch_model(model, {method!r}, ...) again",
    )


def install_remap_guard(base: nn.Module) -> None:
    """Refuse every forward of ``base`` (a remapped base model) once its attention is no longer the remapping's."""
    install_forward_guard(base, _GUARD_HANDLE, _refuse_changed_attention)


def remove_remap_guard(base: nn.Module) -> None:
    """Undo `install_remap_guard` (nothing to do if none is installed)."""
    remove_forward_guard(base, _GUARD_HANDLE)
