"""NTK-aware scaling: static ``ntk`` (alias ``ntk_aware``), ``dynamic_ntk`` (alias ``dynamic``); docs/methods/ntk.md."""

from ..dynamic import DynamicSurgery
from ..registry import MethodSpec, register_family
from .config import DynamicNTKConfig, NTKConfig

register_family(
    "ntk",
    methods=[
        MethodSpec("ntk", NTKConfig, aliases=("ntk_aware",)),
        MethodSpec("dynamic_ntk", DynamicNTKConfig, surgery=DynamicSurgery, aliases=("dynamic",)),
    ],
)

__all__ = ["DynamicNTKConfig", "NTKConfig"]
