"""Position Interpolation (``linear``, alias ``pi``): Chen et al. 2023; docs/methods/linear.md."""

from ..registry import register_method
from .config import LinearConfig

register_method("linear", LinearConfig, aliases=("pi",))

__all__ = ["LinearConfig"]
