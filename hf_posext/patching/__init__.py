"""Patching: ``patch_model`` / ``unpatch_model`` / ``patch_info`` (`patch`), and what they stand on.

`patch` patches a transformers model (or its config) in place; `shipped_rope` says what
the rope a checkpoint ships with is (the base a method composes on); `transaction` holds the
snapshot a failed patch restores (a patch is all or nothing).
"""

from ..architectures import SUPPORTED_MODEL_TYPES
from ..methods.base import MAX_CONTEXT as MAX_CONTEXT  # importable from here, as before
from .shipped_rope import CONFIG_KEY
from .patch import MethodName, patch_info, patch_model, patched_method, unpatch_model
from .patch import method_from_record as method_from_record  # for hf_posext's own modules, not in __all__
from .patch import snapshot_model as snapshot_model

__all__ = [
    "CONFIG_KEY",
    "SUPPORTED_MODEL_TYPES",
    "MethodName",
    "patch_info",
    "patch_model",
    "patched_method",
    "unpatch_model",
]
