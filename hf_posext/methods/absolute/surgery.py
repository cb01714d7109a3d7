"""Surgery of the absolute position encodings (``sinusoidal``, ``learned``): a position table on the base model.

The table lives in the base model as the submodule `POSITIONS_ATTR` (so
``model.model.hf_posext_positions.weight`` is saved in ``model.safetensors``), and a forward
pre-hook on the base model replaces ``input_ids`` by ``embed_tokens(input_ids) + PE(positions)``
(user-given ``inputs_embeds`` get PE added too, as in GPT-2). Positions are ``position_ids`` when
given, else counted from the first real token of the 2D attention mask (left-padded rows see the
positions they would see alone), else continue the cache. [`hf_posext.from_pretrained`][hf_posext.from_pretrained]
re-creates both as the base model is built, so the learned table is loaded from the checkpoint
like any other weight.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn as nn

from ..base import MethodConfig
from ..surgery import Surgery
from .config import LearnedConfig, SinusoidalConfig

#: Name of the position submodule on the base model (``LlamaModel`` etc.).
POSITIONS_ATTR = "hf_posext_positions"
_HOOK_HANDLE = "_hf_posext_position_hook"


class SinusoidalPositions(nn.Module):
    """Vaswani et al.'s fixed table, evaluated at arbitrary positions (no length limit)."""

    def __init__(self, hidden_size: int, theta: float = 10000.0) -> None:
        super().__init__()
        if hidden_size % 2:
            raise ValueError(f"sinusoidal encodings need an even hidden size, got {hidden_size}")
        self.hidden_size = hidden_size
        self.theta = float(theta)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        """``[batch, seq]`` integer positions -> ``[batch, seq, hidden]`` fp32 encodings."""
        exponent = torch.arange(0, self.hidden_size, 2, device=positions.device, dtype=torch.float64) / self.hidden_size
        inv_freq = (1.0 / self.theta**exponent).to(torch.float32)
        angles = positions.to(torch.float32)[..., None] * inv_freq
        table = torch.empty(*positions.shape, self.hidden_size, device=positions.device, dtype=torch.float32)
        table[..., 0::2] = angles.sin()
        table[..., 1::2] = angles.cos()
        return table

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, theta={self.theta}"


class LearnedPositions(nn.Embedding):
    """A trainable position table that refuses positions it has no row for."""

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        """``[batch, seq]`` positions -> ``[batch, seq, hidden]``.

        Raises:
            ValueError: for a position >= ``max_length`` (or < 0).
        """
        if positions.numel():
            high, low = int(positions.max()), int(positions.min())
            if high >= self.num_embeddings or low < 0:
                bad = high if high >= self.num_embeddings else low
                raise ValueError(
                    f"position {bad} is outside the learned position table (max_length={self.num_embeddings}: "
                    f"positions 0..{self.num_embeddings - 1}); shorten the input or patch with a larger max_length"
                )
        return super().forward(positions)


def absolute_positions(
    batch: int,
    length: int,
    position_ids: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    past_length: int,
    device: torch.device,
) -> torch.Tensor:
    """The absolute position of each input token, ``[batch, seq]`` int64.

    Args:
        position_ids: used as given when not ``None``.
        attention_mask: ``[batch, past + seq]`` 2D padding mask; positions count real tokens only.
        past_length: tokens already in the cache.
    """
    if position_ids is not None:
        return position_ids.to(device).expand(batch, -1)
    if attention_mask is not None and attention_mask.dim() == 2:
        counted = attention_mask.to(device=device, dtype=torch.long).cumsum(-1) - 1
        return counted[:, -length:].clamp_min(0)
    return (torch.arange(length, device=device) + past_length).expand(batch, -1)


def _add_positions(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """Forward pre-hook of the base model: input embeddings plus the position encoding."""
    if args:
        names = list(inspect.signature(module.forward).parameters)
        kwargs = {**dict(zip(names, args)), **kwargs}
    embeds = kwargs.get("inputs_embeds")
    if embeds is None:
        if kwargs.get("input_ids") is None:
            return (), kwargs  # the model's own "specify input_ids or inputs_embeds" error follows
        embeds = module.embed_tokens(kwargs["input_ids"])
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    past = int(cache.get_seq_length()) if cache is not None and hasattr(cache, "get_seq_length") else 0
    positions = absolute_positions(
        embeds.shape[0], embeds.shape[1], kwargs.get("position_ids"), kwargs.get("attention_mask"), past, embeds.device
    )
    kwargs["inputs_embeds"] = embeds + getattr(module, POSITIONS_ATTR)(positions).to(embeds.dtype)
    kwargs["input_ids"] = None
    return (), kwargs


def _base_module(model: nn.Module) -> nn.Module:
    """The module that owns ``embed_tokens`` (``model.model`` for a ``...ForCausalLM``)."""
    owners = [m for _, m in model.named_modules() if isinstance(getattr(m, "embed_tokens", None), nn.Embedding)]
    if len(owners) != 1:
        raise ValueError(
            f"{type(model).__name__}: expected one module with an `embed_tokens` embedding, found {len(owners)}"
        )
    return owners[0]


class _AbsoluteSurgery(Surgery):
    def positions_module(self, method: Any, config: Any) -> nn.Module:
        raise NotImplementedError

    def _install(self, method: MethodConfig, base: nn.Module, config: Any) -> None:
        positions = self.positions_module(method, config)
        embed = getattr(base, "embed_tokens", None)
        if isinstance(embed, nn.Embedding):
            positions.to(device=embed.weight.device, dtype=embed.weight.dtype)
        base.add_module(POSITIONS_ATTR, positions)
        base.__dict__[_HOOK_HANDLE] = base.register_forward_pre_hook(_add_positions, with_kwargs=True)

    def patch_modules(self, method: MethodConfig, model: nn.Module) -> None:
        self._install(method, _base_module(model), model.config)

    def unpatch_modules(self, method: MethodConfig, model: nn.Module) -> None:
        base = _base_module(model)
        handle = base.__dict__.pop(_HOOK_HANDLE, None)
        if handle is not None:
            handle.remove()
        if POSITIONS_ATTR in base._modules:
            delattr(base, POSITIONS_ATTR)

    def on_model_init(self, method: MethodConfig, base_model: nn.Module) -> None:
        self._install(method, base_model, base_model.config)

    def missing(self, method: MethodConfig, model: nn.Module) -> str | None:
        if not any(POSITIONS_ATTR in m._modules for m in model.modules()):
            return f"the position table ({POSITIONS_ATTR})"
        return None


class SinusoidalSurgery(_AbsoluteSurgery):
    def positions_module(self, method: SinusoidalConfig, config: Any) -> nn.Module:
        return SinusoidalPositions(config.hidden_size, method.theta)


class LearnedSurgery(_AbsoluteSurgery):
    def positions_module(self, method: LearnedConfig, config: Any) -> nn.Module:
        table = LearnedPositions(method.max_length or config.max_position_embeddings, config.hidden_size)
        nn.init.normal_(table.weight, mean=0.0, std=getattr(config, "initializer_range", 0.02))
        return table

    def inherit_modules(self, method: LearnedConfig, model: nn.Module, before: dict[str, nn.Module]) -> None:
        """A re-patch keeps the trained rows: a longer table extends the old one, a shorter one keeps its first rows."""
        base = _base_module(model)
        new = getattr(base, POSITIONS_ATTR)
        prefix = next(name for name, module in model.named_modules() if module is base)
        old = before.get(f"{prefix}.{POSITIONS_ATTR}" if prefix else POSITIONS_ATTR)
        if isinstance(old, LearnedPositions) and old.embedding_dim == new.embedding_dim:
            rows = min(old.num_embeddings, new.num_embeddings)
            with torch.no_grad():
                new.weight[:rows] = old.weight[:rows].to(new.weight)
