"""The one guard of a patched model's attention implementation (ALiBi, remapping, exact dynamic scaling).

``model.set_attn_implementation`` can switch a patched model to a kernel that knows nothing of the
method, which would then run without the method's positions, silently: `check_attention_kept`
refuses that forward, run from a forward pre-hook (`install_forward_guard`) or the rotary stand-in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from .. import integration


def check_attention_kept(
    config: Any, accepts: Callable[[str | None], bool], *, what: str, needs: str, advice: str
) -> None:
    """Refuse a forward whose attention implementation was changed after ``what`` was patched in.

    ``accepts(current)`` says whether ``config``'s implementation still is the method's; the message
    says what the method ``needs`` and what to do (``advice``).
    """
    current = integration.attention_implementation(config)
    if not accepts(current):
        raise ValueError(
            f"attn_implementation was changed to {current!r} after {what} was patched in (it needs {needs}); {advice}"
        )


def install_forward_guard(base: nn.Module, name: str, check: Callable[..., Any]) -> None:
    """Run ``check(module, args, kwargs)`` before every forward of ``base`` (once: a second call replaces it).

    The methods whose surgery depends on the attention path use it with `check_attention_kept`
    to refuse a later ``set_attn_implementation`` instead of running without their position scheme.
    """
    remove_forward_guard(base, name)
    base.__dict__[name] = base.register_forward_pre_hook(check, with_kwargs=True)


def remove_forward_guard(base: nn.Module, name: str) -> None:
    """Undo `install_forward_guard` (nothing to do if none is installed)."""
    handle = base.__dict__.pop(name, None)
    if handle is not None:
        handle.remove()
