"""LongRoPE with its first n positions on plain RoPE (``keep_first``): its rope type and rotary module.

The paper's n-hat (Ding et al. 2024, arXiv:2402.13753, sec. 3.2; microsoft/LongRoPE's start
token): once a sequence is past L_orig, positions ``p < n`` rotate by ``p * theta^(-2i/d)`` with
cos/sin multiplier 1 (the pretrained model's own RoPE), positions ``p >= n`` with the long factors
and the attention factor; up to L_orig every position takes the short factors, as in
transformers' ``longrope``. The rope type (:data:`~hf_posext.rope_utils.LONGROPE_KEEP_FIRST_ROPE_TYPE`)
gives transformers one frequency set per length, as ``longrope``'s does; the per-position choice
is made by :class:`KeepFirstRotaryEmbedding` (``exact_cache=False``) or by the exact cache
(:mod:`hf_posext.attention.exact_dynamic`). docs/methods/longrope.md.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from ... import integration
from ...rope_utils import KEEP_FIRST_KEY, default_inv_freq, kept_positions, rotary_dim_of
from .config import LongRopeConfig, check_keep_first

#: What a keep-first entry must have and may have (transformers' ``longrope`` keys plus ``keep_first``).
_REQUIRED_KEYS = {"rope_type", "short_factor", "long_factor", "original_max_position_embeddings", KEEP_FIRST_KEY}
_OPTIONAL_KEYS = {"rope_theta", "attention_factor", "factor", "short_mscale", "long_mscale"}


def compute_keep_first_parameters(
    config: Any,
    device: torch.device | str | None = None,
    seq_len: int | torch.Tensor | None = None,
    layer_type: str | None = None,
) -> tuple[torch.Tensor, float]:
    """transformers' rope-init contract: ``longrope``'s ``(inv_freq, attention_factor)`` for ``seq_len``.

    Those of the positions from ``keep_first`` on (short factors up to L_orig, long ones past it);
    the kept positions are plain RoPE, which :class:`KeepFirstRotaryEmbedding` and the exact cache
    put in per position.
    """
    return integration.rope_init_function("longrope")(config, device, seq_len=seq_len, layer_type=layer_type)


def validate_keep_first_parameters(
    config: Any, rope_parameters: dict[str, Any], ignore_keys: set[str] | None = None
) -> None:
    """transformers' validator for the keep-first type: the keys it needs, its values as the method checks them.

    Raises:
        KeyError: a required key missing (an unknown one is warned about).
        ValueError: a value :class:`~hf_posext.methods.longrope.LongRopeConfig` refuses, or ``keep_first``
            outside ``[0, original_max_position_embeddings)``.
    """
    integration.check_received_keys(config, rope_parameters, _REQUIRED_KEYS, _OPTIONAL_KEYS, ignore_keys)
    method = LongRopeConfig(
        factor=rope_parameters.get("factor") or 1.0,
        long_factor=rope_parameters["long_factor"],
        short_factor=rope_parameters["short_factor"],
        attention_factor=rope_parameters.get("attention_factor"),
        keep_first=rope_parameters[KEEP_FIRST_KEY],
    )
    check_keep_first(method.name, method.keep_first, int(rope_parameters["original_max_position_embeddings"]))


class KeepFirstRotaryEmbedding(nn.Module):
    """A model's rotary module running the keep-first type as transformers runs ``longrope`` (``exact_cache=False``).

    Per forward, the sequence's length (its largest position + 1) picks the short or the long
    factors for every position, as transformers' ``longrope`` update does (cached keys keep the
    set they were rotated with); past L_orig the positions below ``keep_first`` get plain RoPE's
    cos/sin, multiplier 1. The wrapped module computes both tables (its ``inv_freq`` is set to each
    set in turn, in place, as transformers' own update does), so any layout of its tables works
    whose second dimension is the sequence.

    Args:
        rotary: the model's rotary module built from the keep-first config (kept as ``.rotary``).
    """

    def __init__(self, rotary: nn.Module) -> None:
        super().__init__()
        self.rotary = rotary
        params = rotary.config.rope_parameters
        self.original = int(params["original_max_position_embeddings"])
        self.keep_first = kept_positions(params)
        self.pinned: bool | None = None  # past the switch (True) or not, whatever the length: pinned.py
        self._sets: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def frequency_sets(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(short, long, plain)`` fp32 ``inv_freq`` on ``device``, computed once per device."""
        key = str(device)
        if key not in self._sets:
            config = self.rotary.config
            init = integration.rope_init_function("longrope")
            short, _ = init(config, device)
            long, _ = init(config, device, seq_len=self.original + 1)
            plain = default_inv_freq(float(config.rope_parameters["rope_theta"]), rotary_dim_of(config), device)
            self._sets[key] = (short.float(), long.float(), plain)
        return self._sets[key]

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> Any:
        """What the wrapped module returns (``(cos, sin)``, or a complex table), the kept positions' rows on plain RoPE.

        Multimodal (3D) ``position_ids`` ``[sections, batch, seq]`` keep a row by its first (text) section.
        """
        rotary = self.rotary
        buffer = rotary.inv_freq
        short, long, plain = self.frequency_sets(buffer.device)
        # one set for the whole forward, as transformers' longrope
        past = (
            position_ids.max() + 1 > self.original
            if self.pinned is None
            else torch.tensor(self.pinned, device=position_ids.device)
        )
        buffer.copy_(torch.where(past.to(buffer.device), long, short))
        tables = rotary(x, position_ids)
        positions = position_ids[0] if position_ids.dim() == 3 else position_ids
        keep = (positions < self.keep_first) & past
        if not self.keep_first or not bool(keep.any()):
            return tables
        scaling = rotary.attention_scaling
        buffer.copy_(plain)
        rotary.attention_scaling = 1.0
        try:
            plain_tables = rotary(x, position_ids)
        finally:
            rotary.attention_scaling = scaling
            buffer.copy_(long)
        if isinstance(tables, torch.Tensor):
            return _rows_where(keep, plain_tables, tables, rotary)
        return type(tables)(_rows_where(keep, p, t, rotary) for p, t in zip(plain_tables, tables, strict=True))


def _rows_where(keep: torch.Tensor, plain: torch.Tensor, scaled: torch.Tensor, rotary: nn.Module) -> torch.Tensor:
    """``plain``'s rows where ``keep`` ``[batch or 1, seq]`` holds, else ``scaled``'s (tables ``[batch, seq, ...]``)."""
    if scaled.dim() < 2 or scaled.shape[1] != keep.shape[1] or scaled.shape[0] not in (1, keep.shape[0]):
        raise ValueError(
            f"keep_first needs a rotary module whose tables are [batch, seq, ...] for position_ids [batch, seq]; "
            f"{type(rotary).__name__} gave {tuple(scaled.shape)} for {tuple(keep.shape)}: patch with exact_cache=True "
            "or without keep_first"
        )
    keep = keep.to(scaled.device).reshape(*keep.shape, *(1,) * (scaled.dim() - 2))
    return torch.where(keep, plain, scaled)


def wrap_rotary_modules(model: nn.Module) -> None:
    """Put a :class:`KeepFirstRotaryEmbedding` around each rotary module of a model patched with ``keep_first``."""
    if not kept_positions(model.config.rope_parameters):
        return
    for name, rotary in list(integration.rotary_modules(model)):
        if not isinstance(
            model.get_submodule(name.rpartition(".")[0]) if "." in name else model, KeepFirstRotaryEmbedding
        ):
            integration.replace_module(model, name, KeepFirstRotaryEmbedding(rotary))


def unwrap_rotary_modules(model: nn.Module) -> None:
    """Undo :func:`wrap_rotary_modules` (a no-op without wrappers)."""
    wrapped = [(name, m) for name, m in model.named_modules() if isinstance(m, KeepFirstRotaryEmbedding)]
    for name, module in wrapped:
        integration.replace_module(model, name, module.rotary)
