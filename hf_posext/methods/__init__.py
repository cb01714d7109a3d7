"""Position-encoding methods: one module per family, each registered by name in :mod:`.base`."""

from . import linear, ntk, yarn  # noqa: F401  (importing a family registers its methods)
from .base import BaseRope, PositionMethod, available_methods, make_method, method_class, register
from .linear import LinearConfig
from .ntk import DynamicNTKConfig, NTKConfig
from .yarn import DynamicYarnConfig, YarnConfig

__all__ = [
    "BaseRope",
    "DynamicNTKConfig",
    "DynamicYarnConfig",
    "LinearConfig",
    "NTKConfig",
    "PositionMethod",
    "YarnConfig",
    "available_methods",
    "make_method",
    "method_class",
    "register",
]
