"""Attention kernels shared by method families (no registration here): remapped positions, `remap`."""
