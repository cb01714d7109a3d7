"""Position-encoding methods: one folder per family, each registering itself with one call.

Every sub-folder (package) here is a family; importing this package imports each of them, and
each ``<family>/__init__.py`` (imported by `folders`) calls [`register_method`][hf_posext.register_method] or
[`register_family`][hf_posext.register_family]. Adding a method is adding a folder. The modules beside the
folders (`base`, `registry`, `surgery`, `training`, `dynamic`, `norope`) are what
families share; a family imports only those and lower layers, never another family.
"""

from typing import Any

from ..method_names import available_methods, method_aliases
from ..post_import import deprecated_attribute
from .base import BaseRope, MethodConfig
from .dynamic import DynamicScaling, DynamicSurgery
from .norope import NO_ROPE_TYPES, NoRopeMethod
from .registry import (
    AttentionFunctions,
    Family,
    MethodSpec,
    RopeType,
    canonical_name,
    composable_methods,
    config_classes,
    families,
    method_class,
    method_config,
    needs_surgery,
    register_family,
    register_method,
    register_with_transformers,
    surgery_for,
)
from .surgery import NO_SURGERY, Surgery
from .training import NO_TRAINING, Training, TrainingOption, split_method_kwargs, training_for
from .folders import FAMILY_MODULES  # last: the family folders register themselves on what is above

# The config classes are attributes of this package (hf_posext.methods.YarnConfig), found, not listed.
globals().update(config_classes())


def __getattr__(name: str) -> Any:  # the deprecated names (hf_posext.post_import)
    return deprecated_attribute(__name__, name)


__all__ = [
    "NO_ROPE_TYPES",
    "NO_SURGERY",
    "NO_TRAINING",
    "AttentionFunctions",
    "BaseRope",
    "DynamicScaling",
    "DynamicSurgery",
    "FAMILY_MODULES",
    "Family",
    "MethodConfig",
    "MethodSpec",
    "NoRopeMethod",
    "RopeType",
    "Surgery",
    "Training",
    "TrainingOption",
    "available_methods",
    "canonical_name",
    "composable_methods",
    "config_classes",
    "families",
    "method_aliases",
    "method_class",
    "method_config",
    "needs_surgery",
    "register_family",
    "register_method",
    "register_with_transformers",
    "split_method_kwargs",
    "surgery_for",
    "training_for",
    *sorted(config_classes()),
]
