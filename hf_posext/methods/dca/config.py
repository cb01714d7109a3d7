"""Dual Chunk Attention's config: chunk size and local window (ChunkLlama's defaults from L0).

An et al. 2024, "Training-Free Long-Context Scaling of Large Language Models", arXiv:2402.17463,
section 3 (code: HKUNLP/ChunkLlama ``chunkllama_attn_replace.py``). Qwen2.5-1M checkpoints ship it as
``dual_chunk_attention_config``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..base import whole_number
from ..remapping import AttentionRemapMethod
from .remap import DualChunkRemapping


@dataclass(frozen=True)
class DualChunkConfig(AttentionRemapMethod):
    """Dual Chunk Attention (An et al. 2024): keys at j mod c; intra-, successive- and inter-chunk queries.

    Args:
        factor: the context the patched config advertises, ``factor * L0`` (DCA itself has no reach
            limit: no distance ever exceeds ``chunk_size``).
        chunk_size: an int <= L0; default ``3 * L0 // 4``.
        local_size: an int >= 1 below ``chunk_size``; default ``L0 // 8``.
    """

    paper: ClassVar[str] = "An et al. 2024, DCA (ChunkLlama), arXiv:2402.17463"

    chunk_size: int | None = None
    local_size: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_whole("chunk_size", 2, "an int >= 2, at most L0 (or None: 3 L0 // 4)")
        self._check_whole("local_size", 1, "an int >= 1 below chunk_size (or None: L0 // 8)")

    def needs_factor(self) -> bool:
        """Without a factor or a ``chunk_size`` DCA advertises no longer context, yet its default chunks
        (``3 L0 // 4``) already change the logits inside L0: nothing asked for, something changed."""
        return self.chunk_size is None

    def resolve(self, original: int) -> tuple[int, int]:
        """``(chunk_size, local_size)`` for the checkpoint's context ``original`` (L0).

        Raises:
            ValueError: ``chunk_size > L0`` or ``local_size >= chunk_size``.
        """
        chunk = self.chunk_size if self.chunk_size is not None else 3 * original // 4
        local = self.local_size if self.local_size is not None else max(1, original // 8)
        chunk = self._fit("chunk_size", chunk, 2, original, f"the original context L0={original}", at_most=True)
        return chunk, self._fit("local_size", local, 1, chunk, f"chunk_size={chunk}")

    def config_fields(self, original: int) -> dict[str, Any]:
        """vLLM's ``dual_chunk_attention_config`` (as Qwen2.5-1M ships it), which vLLM runs for the Qwen2 family."""
        chunk, local = self.resolve(original)
        return {
            "dual_chunk_attention_config": {
                "chunk_size": chunk,
                "local_size": local,
                "original_max_position_embeddings": original,
            }
        }

    def remapping(self, original: int) -> DualChunkRemapping:
        return DualChunkRemapping(*self.resolve(original))


FIELD = "dual_chunk_attention_config"


def shipped_dual_chunk_config(config: Any) -> DualChunkConfig | None:
    """DCA from a config that ships vLLM's ``dual_chunk_attention_config`` (the family's load-time hook).

    Qwen2.5-7B/14B-Instruct-1M (and Qwen3 2507's 1M configs) carry
    ``{chunk_size, local_size, original_max_position_embeddings}``, which transformers ignores: the
    model would run plain RoPE far past its chunk size. The method keeps the config's advertised
    context (``factor = max_position_embeddings / original_max_position_embeddings``). ``None`` for a
    config without the field (or without its ``chunk_size``).

    Raises:
        ValueError: a field that is not a whole number in range (named ``dual_chunk_attention_config.<field>``),
            or sizes DCA refuses (``local_size >= chunk_size``...; the fields shown).
    """
    fields = getattr(config, FIELD, None)
    if not isinstance(fields, dict) or "chunk_size" not in fields:
        return None
    chunk = whole_number("", f"{FIELD}.chunk_size", fields["chunk_size"], minimum=2, allowed="an int >= 2")
    original = fields.get("original_max_position_embeddings")
    if original is None:
        original = chunk
    else:
        allowed = "an int >= 1 (or absent: chunk_size)"
        original = whole_number("", f"{FIELD}.original_max_position_embeddings", original, minimum=1, allowed=allowed)
    local = fields.get("local_size")
    if local is not None:
        local = whole_number("", f"{FIELD}.local_size", local, minimum=1, allowed="an int >= 1 below chunk_size")
    factor = max(1.0, int(config.max_position_embeddings) / original)
    method = DualChunkConfig(
        factor=factor, original_max_position_embeddings=original, chunk_size=chunk, local_size=local
    )
    try:
        method.resolve(original)
    except ValueError as error:  # e.g. local_size >= chunk_size: name the field the values came from
        raise ValueError(f"{FIELD} {fields!r}: {error}") from error
    return method
