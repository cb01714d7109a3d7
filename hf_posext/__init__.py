"""hf-posext: context-window extension for Hugging Face Transformers models.

    import hf_posext
    hf_posext.patch_model(model, "yarn", factor=4)   # a 4k Llama now reads 16k tokens

    model = hf_posext.from_pretrained("out/llama-yarn-16k")   # a saved patched checkpoint

Importing the package registers its custom rope types and attention with transformers, and the
construction hook that redoes a method's surgery while a patched checkpoint is loaded
(:mod:`hf_posext.loading`).
"""

from ._registration import register_all as _register_all
from .methods import (
    AlibiConfig,
    DynamicNTKConfig,
    DynamicYarnConfig,
    LearnedConfig,
    LinearConfig,
    NTKConfig,
    PositionMethod,
    SinusoidalConfig,
    YarnConfig,
    available_methods,
    canonical_name,
    method_aliases,
    method_class,
)
from .loading import from_pretrained
from .patching import SUPPORTED_MODEL_TYPES, patch_info, patch_model, unpatch_model

__version__ = "0.1.0"

_register_all()

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "AlibiConfig",
    "DynamicNTKConfig",
    "DynamicYarnConfig",
    "LearnedConfig",
    "LinearConfig",
    "NTKConfig",
    "PositionMethod",
    "SinusoidalConfig",
    "YarnConfig",
    "__version__",
    "available_methods",
    "canonical_name",
    "from_pretrained",
    "method_aliases",
    "method_class",
    "patch_info",
    "patch_model",
    "unpatch_model",
]
