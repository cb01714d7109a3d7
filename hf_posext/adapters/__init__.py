"""Adapters: what each method family does to a model beyond its rope parameters (model surgery).

:mod:`hf_posext.patching` is the entry point; one module here per family that needs surgery,
registered for its config class with :func:`~.base.register_adapter`. RoPE-only methods
(``linear``, ``ntk``, ``yarn``) have none.
"""

from . import absolute, alibi, dynamic, remap  # noqa: F401  (importing a family registers its adapter)
from .base import Adapter, adapter_for, needs_surgery, register_adapter

__all__ = ["Adapter", "adapter_for", "needs_surgery", "register_adapter"]
