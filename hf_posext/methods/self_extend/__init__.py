"""Self-Extend (Jin et al. 2024, arXiv:2401.01325): grouped positions beyond a neighbour window, training-free."""

from .config import SelfExtendConfig
from .remap import SelfExtendRemapping

__all__ = ["SelfExtendConfig", "SelfExtendRemapping"]
