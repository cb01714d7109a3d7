"""Dual Chunk Attention (An et al. 2024, arXiv:2402.17463): chunked positions, training-free."""

from .config import DualChunkConfig
from .remap import DualChunkRemapping

__all__ = ["DualChunkConfig", "DualChunkRemapping"]
