"""LongRoPE's rotary module (one factor set per sequence) and its keep-first rope type.

`LongRopeRotaryEmbedding` runs ``longrope`` as transformers does, the sequence's length
picking the short or the long factors for all its positions, per batch or per row. The keep-first
type (the paper's n-hat, Ding et al. 2024, arXiv:2402.13753, sec. 3.2; microsoft/LongRoPE's start
token): once a sequence is past L_orig, positions ``p < n`` rotate by ``p * theta^(-2i/d)`` with
cos/sin multiplier 1 (the pretrained model's own RoPE), the others with the long factors and the
attention factor; up to L_orig every position takes the short factors. Its rope type
(`hf_posext.rope_utils.LONGROPE_KEEP_FIRST_ROPE_TYPE`) gives transformers one frequency set per
length; the kept positions are put in by the rotary module or, with ``factors_by="query"``, by the
exact cache (`hf_posext.attention.exact_dynamic`). docs/methods/longrope.md.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn as nn

from ... import integration
from ...post_import import deprecated_attribute
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
    the kept positions are plain RoPE, which `LongRopeRotaryEmbedding` and the exact cache
    put in per position.
    """
    return integration.rope_init_function("longrope")(config, device, seq_len=seq_len, layer_type=layer_type)


def validate_keep_first_parameters(
    config: Any, rope_parameters: dict[str, Any], ignore_keys: set[str] | None = None
) -> None:
    """transformers' validator for the keep-first type: the keys it needs, its values as the method checks them.

    Raises:
        KeyError: a required key missing (an unknown one is warned about).
        ValueError: a value [`LongRopeConfig`][hf_posext.LongRopeConfig] refuses, or ``keep_first``
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


class LongRopeRotaryEmbedding(nn.Module):
    """A model's rotary module running ``longrope`` (and the keep-first type) with one factor set per sequence.

    The sequence's length (its largest position + 1) picks the short or the long factors for every
    position of it, as transformers' ``longrope`` update does; past L_orig the positions below
    ``keep_first`` get plain RoPE's cos/sin, multiplier 1. With ``per_row=False`` one length picks for the
    whole batch (transformers' update bit for bit, ``exact_cache=False``); with ``per_row=True`` each batch
    row is its own sequence (a left-padded row as if alone; the default cache, `switch`, which also
    makes a recompute of a prefix take the factors of the length it continues to, `forcing`). The
    wrapped module computes the tables (its ``inv_freq`` is set to each set in turn, in place, as
    transformers' own update does), so any layout of its tables works whose second dimension is the sequence.

    Args:
        rotary: the model's rotary module built from the patched config (kept as ``.rotary``).
        per_row: pick the factors per batch row rather than per batch.
    """

    def __init__(self, rotary: nn.Module, per_row: bool = False) -> None:
        super().__init__()
        self.rotary = rotary
        self.per_row = per_row
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

    def long_rows(self, positions: torch.Tensor) -> torch.Tensor:
        """``[batch or 1]`` bool: the rows of ``positions`` ``[batch or 1, seq]`` that take the long factors."""
        forced = getattr(_forced, "rows", None)
        if forced is not None:
            return forced.to(positions.device)
        if self.pinned is not None:  # pinned_factors: one set whatever the positions
            return torch.tensor([self.pinned], device=positions.device)
        if self.per_row:
            return positions.amax(dim=-1) + 1 > self.original
        return (positions.max() + 1 > self.original).reshape(1)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> Any:
        """What the wrapped module returns (``(cos, sin)``, or a complex table), the kept positions' rows on plain RoPE.

        Multimodal (3D) ``position_ids`` ``[sections, batch, seq]`` take a row's length and kept positions from
        its first (text) section.
        """
        rotary = self.rotary
        buffer = rotary.inv_freq
        short, long, plain = self.frequency_sets(buffer.device)
        positions = position_ids[0] if position_ids.dim() == 3 else position_ids
        past = self.long_rows(positions)
        _forced.used, _forced.pinned = past, self.pinned is not None
        if past.numel() == 1:  # one set for the whole forward: no host sync, as transformers' own update
            buffer.copy_(torch.where(past.to(buffer.device), long, short))
            tables = integration.rotary_tables(rotary, x, position_ids)
        elif bool(past.all()) or not bool(past.any()):
            buffer.copy_(long if bool(past[0]) else short)
            tables = integration.rotary_tables(rotary, x, position_ids)
        else:  # rows of both kinds: both tables, each row from its own
            buffer.copy_(short)
            short_tables = integration.rotary_tables(rotary, x, position_ids)
            buffer.copy_(long)
            tables = _select(
                past[:, None].expand_as(positions),
                integration.rotary_tables(rotary, x, position_ids),
                short_tables,
                rotary,
            )
        if not self.keep_first:
            return tables
        keep = (positions < self.keep_first) & past[:, None]
        if not bool(keep.any()):
            return tables
        current = buffer.clone()
        scaling = rotary.attention_scaling
        buffer.copy_(plain)
        rotary.attention_scaling = 1.0
        try:
            plain_tables = integration.rotary_tables(rotary, x, position_ids)
        finally:
            rotary.attention_scaling = scaling
            buffer.copy_(current)
        return _select(keep, plain_tables, tables, rotary)


#: Per thread: ``rows``, the factor set a recompute forces (`forcing`); ``used``, the rows the last
#: forward of a `LongRopeRotaryEmbedding` took the long factors for (`last_long_rows`).
_forced = threading.local()


@contextlib.contextmanager
def forcing(rows: torch.Tensor) -> Iterator[None]:
    """Within the block, this thread's `LongRopeRotaryEmbedding` forwards take the long factors for the
    batch rows where ``rows`` ``[batch]`` holds and the short ones elsewhere, whatever their positions."""
    _forced.rows = rows
    try:
        yield
    finally:
        _forced.rows = None


def last_long_rows() -> tuple[torch.Tensor | None, bool]:
    """``([batch or 1] bool, pinned)``: the rows this thread's last `LongRopeRotaryEmbedding` forward took
    the long factors for (``None`` before any), and whether `pinned.pinned_factors` chose them; read and
    cleared."""
    used, _forced.used = getattr(_forced, "used", None), None
    return used, bool(getattr(_forced, "pinned", False))


def _select(rows: torch.Tensor, chosen: Any, other: Any, rotary: nn.Module) -> Any:
    """``chosen``'s table rows where ``rows`` ``[batch or 1, seq]`` holds, else ``other``'s (a table or a tuple)."""
    if isinstance(chosen, torch.Tensor):
        return _rows_where(rows, chosen, other, rotary)
    return type(chosen)(_rows_where(rows, c, o, rotary) for c, o in zip(chosen, other, strict=True))


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


def wrap_rotary_modules(model: nn.Module, per_row: bool = False) -> None:
    """Put a `LongRopeRotaryEmbedding` around each rotary module of ``model`` (once)."""
    for name, rotary in list(integration.rotary_modules(model)):
        parent = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
        if not isinstance(parent, LongRopeRotaryEmbedding):
            integration.replace_module(model, name, LongRopeRotaryEmbedding(rotary, per_row))


def unwrap_rotary_modules(model: nn.Module) -> None:
    """Undo `wrap_rotary_modules` (a no-op without wrappers)."""
    wrapped = [(name, m) for name, m in model.named_modules() if isinstance(m, LongRopeRotaryEmbedding)]
    for name, module in wrapped:
        integration.replace_module(model, name, module.rotary)


def __getattr__(name: str) -> object:
    return deprecated_attribute(__name__, name)
