"""hf-posext: context-window extension for Hugging Face Transformers models.

    import hf_posext
    hf_posext.patch_model(model, "yarn", factor=4)   # a 4k Llama now reads 16k tokens

Importing the package registers its custom rope types with transformers and does nothing else.
"""

from ._registration import register_all as _register_all
from .methods import (
    DynamicNTKConfig,
    DynamicYarnConfig,
    LinearConfig,
    NTKConfig,
    PositionMethod,
    YarnConfig,
    available_methods,
)
from .patching import SUPPORTED_MODEL_TYPES, patch_info, patch_model, unpatch_model

__version__ = "0.1.0"

_register_all()

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "DynamicNTKConfig",
    "DynamicYarnConfig",
    "LinearConfig",
    "NTKConfig",
    "PositionMethod",
    "YarnConfig",
    "__version__",
    "available_methods",
    "patch_info",
    "patch_model",
    "unpatch_model",
]
