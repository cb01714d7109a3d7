"""Switching remapped attention (:mod:`.remap`) on and off in a model, with :func:`.wrapper.install_wrapper`."""

from __future__ import annotations

from torch import nn

from .. import integration
from ..rope_utils import REMAP_ROPE_TYPE, REMAPPED_TYPE_KEY, rope_parameters_for
from .remap import ATTENTION_PREFIX, SAVED_ATTENTION, STATE_ATTR, Remapping, RemapState, remap_attention
from .wrapper import install_wrapper

#: What to do instead when a model cannot be remapped.
FALLBACK = "use a rope method (yarn, ntk) instead"


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
    """Undo :func:`install_remapping` (a no-op when it is not installed)."""
    integration.remove_attention_state(model, STATE_ATTR)
