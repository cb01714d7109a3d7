"""Installing an attention wrapper: what remapping (`remap.install`) and exact dynamic scaling share.

A wrapper wraps the model's own kernel (one of `SUPPORTED_KERNELS`) under the name
``prefix + kernel``: `install_wrapper` checks the kernel and the attention, registers the
wrapper, hands each attention module the state and refuses preallocated caches. The guard against
a later change of attention implementation is `guard`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

from torch import nn

from .. import integration
from ..architectures import check_wrappable_attention

#: The kernels an hf-posext attention wrapper wraps (whose masks it reads).
SUPPORTED_KERNELS = ("eager", "sdpa")


class WrapperState(Protocol):
    """What the attention modules of a wrapped model hold (`integration.remove_attention_state` undoes it)."""

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
        ValueError: a kernel outside `SUPPORTED_KERNELS`, naming ``purpose`` and ``fallback``.
    """
    kernel = "sdpa" if saved is not None and requested == saved else (requested or "eager").removeprefix(prefix)
    if kernel not in SUPPORTED_KERNELS:
        raise ValueError(
            f"{purpose} supports attn_implementation in {SUPPORTED_KERNELS}, got {kernel!r}; load the "
            f"model with one of those or {fallback}"
        )
    return kernel


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
        prefix, saved: as `wrapped_kernel`; the wrapper is registered as ``prefix + kernel``.
        purpose, fallback: what needs the wrapper and what to do instead, for the error messages.
        rotary: the rotary module a base model under construction is registering.
        guarded: the modules whose forward then refuses a preallocated cache
            (`integration.guard_growing_cache` with ``needs`` and ``alternative``).

    Raises:
        ValueError: a kernel other than eager/sdpa, or an attention the wrapper cannot rotate for
            (`hf_posext.architectures.check_wrappable_attention`).
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
