"""hf-posext: context-window extension for Hugging Face Transformers models.

    import hf_posext
    hf_posext.patch_model(model, "yarn", factor=4)   # a 4k Llama now reads 16k tokens

    model = hf_posext.from_pretrained("out/llama-yarn-16k")   # a saved patched checkpoint

The public API, and what importing the package changes in a process (each change, why, and how to do
without it), are stated once, on docs/import_effects.md; `hf_posext.import_effects` lists and makes
those changes.
"""

from importlib import import_module as _import_module
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from . import methods as _methods
from .import_effects import install as _install
from .loading import AutoPatchedModelForCausalLM, from_pretrained
from .post_import import deprecated_attribute as _deprecated_attribute
from .methods import (
    NO_ROPE_TYPES,
    AttentionFunctions,
    BaseRope,
    DynamicScaling,
    DynamicSurgery,
    MethodConfig,
    MethodSpec,
    NoRopeMethod,
    RopeType,
    Surgery,
    Training,
    TrainingOption,
    available_methods,
    canonical_name,
    method_aliases,
    method_class,
    method_config,
    needs_surgery,
    register_family,
    register_method,
)
from .integration import check_received_keys
from .patching import SUPPORTED_MODEL_TYPES, patch_info, patch_model, patched_method, unpatch_model
from .rope_utils import default_inv_freq, rope_parameters_for, rotary_dim_of
from .validation import real_number, whole_number
from .verification import Mismatch, verify

if _TYPE_CHECKING:
    from .longrope_search import LongRopeSearchResult, search_longrope

__version__ = "0.1.0"

# Every registered method's config class at the top level (hf_posext.YarnConfig...), found, not listed.
globals().update(_methods.config_classes())

_install()  # every change to the process: docs/import_effects.md


#: Public names whose module ``import hf_posext`` does not load: LongRoPE's search scores with
#: `hf_posext.eval`, which patching does not need (tests/test_import_cost.py). Loaded on first use.
_ON_FIRST_USE = {"LongRopeSearchResult": "longrope_search", "search_longrope": "longrope_search"}


def __getattr__(name: str) -> _Any:  # the names loaded on first use, and the deprecated names (post_import.py)
    if name in _ON_FIRST_USE:
        return getattr(_import_module(f"{__name__}.{_ON_FIRST_USE[name]}"), name)
    return _deprecated_attribute(__name__, name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_ON_FIRST_USE})


__all__ = [
    "NO_ROPE_TYPES",
    "SUPPORTED_MODEL_TYPES",
    "AttentionFunctions",
    "AutoPatchedModelForCausalLM",
    "BaseRope",
    "DynamicScaling",
    "DynamicSurgery",
    "LongRopeSearchResult",
    "MethodConfig",
    "Mismatch",
    "MethodSpec",
    "NoRopeMethod",
    "RopeType",
    "Surgery",
    "Training",
    "TrainingOption",
    "__version__",
    "available_methods",
    "canonical_name",
    "check_received_keys",
    "default_inv_freq",
    "from_pretrained",
    "method_aliases",
    "method_class",
    "method_config",
    "needs_surgery",
    "patch_info",
    "patch_model",
    "patched_method",
    "real_number",
    "register_family",
    "register_method",
    "rope_parameters_for",
    "rotary_dim_of",
    "search_longrope",
    "unpatch_model",
    "verify",
    "whole_number",
    *sorted(_methods.config_classes()),
]
