"""YaRN and dynamic YaRN.

Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large Language Models",
arXiv 2309.00071 (v2), section 3.2 and eqs. 17-22:

* each rotary pair i has wavelength lambda_i = 2 pi theta^(2i/d) and completes
  r_i = L_orig / lambda_i turns over the original context;
* the ramp gamma_i = clamp((r_i - alpha) / (beta - alpha), 0, 1) with alpha = beta_slow = 1,
  beta = beta_fast = 32 (eq. 18), whose bounds the reference code floors/ceils to whole pairs;
* frequencies are blended, not scales (ERRATA point 1):
  theta_i' = (1 - gamma_i) * theta_i / s + gamma_i * theta_i (eq. 20);
* cos and sin are multiplied by mscale = 0.1 ln(s) + 1, so q.k logits grow by mscale^2
  (eq. 22, "sqrt(1/t)"; ERRATA point 2).

Static YaRN is transformers' native ``rope_type="yarn"``. Dynamic YaRN (section 3.3) uses the
same frequencies with s recomputed from the current length L: s(L) = max(1, L / L_orig). It has
no native type; :func:`compute_dynamic_yarn_parameters` is registered as the rope type
:data:`DYNAMIC_YARN_ROPE_TYPE`. Unlike the reference code, hf-posext bounds s(L) by ``factor``
so that, as for every method, ``factor`` is the reach of the patch: factor=1 is the identity and
from ``factor * L_orig`` tokens on dynamic YaRN equals static YaRN at ``factor``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from .base import BaseRope, PositionMethod, register
from .dynamic import DynamicScaling

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

#: The ``rope_type`` dynamic YaRN registers; named after the package so that a vanilla
#: transformers install that cannot load it names what is missing.
DYNAMIC_YARN_ROPE_TYPE = "hf_posext_dynamic_yarn"


def yarn_mscale(factor: float) -> float:
    """YaRN's attention temperature as a cos/sin multiplier, 0.1 ln(s) + 1 (eq. 22); 1 for s <= 1."""
    return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0


def default_inv_freq(theta: float, rotary_dim: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Plain RoPE frequencies theta^(-2i/d), ``[rotary_dim // 2]``, computed in fp32.

    fp32 whatever the model dtype: in bf16, positions beyond 256 already lose integer precision.
    """
    exponent = torch.arange(0, rotary_dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / rotary_dim
    return 1.0 / (theta**exponent)


def yarn_inv_freq(
    theta: float,
    rotary_dim: int,
    factor: float,
    original_max_position_embeddings: int,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    truncate: bool = True,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """YaRN's blended frequencies (eqs. 17-20), ``[rotary_dim // 2]``, fp32.

    The ramp is expressed over pair indices: pair i makes r_i = L_orig / (2 pi theta^(2i/d))
    turns, so r_i = beta exactly at i = d ln(L_orig / (2 pi beta)) / (2 ln theta).
    """

    def pair_where_turns_equal(turns: float) -> float:
        return rotary_dim * math.log(original_max_position_embeddings / (2 * math.pi * turns)) / (2 * math.log(theta))

    low, high = pair_where_turns_equal(beta_fast), pair_where_turns_equal(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # a one-pair ramp would divide by zero; the reference code nudges it too
    # extrapolate = gamma_i: 1 for fast pairs (r_i > beta_fast, kept), 0 for slow ones (interpolated)
    extrapolate = 1 - torch.clamp((torch.arange(rotary_dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolate = extrapolate.to(device)
    inv_freq = default_inv_freq(theta, rotary_dim, device)
    return (inv_freq / factor) * (1 - extrapolate) + inv_freq * extrapolate


def _rope_dict(config: PreTrainedConfig, layer_type: str | None) -> dict[str, Any]:
    params = config.rope_parameters
    return params[layer_type] if layer_type is not None and layer_type in params else params


def rotary_dim_of(config: PreTrainedConfig, rope_parameters: dict[str, Any] | None = None) -> int:
    """The number of rotated channels per head: head_dim times the partial rotary factor."""
    params = rope_parameters if rope_parameters is not None else config.rope_parameters
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return int(head_dim * params.get("partial_rotary_factor", 1.0))


def dynamic_yarn_scale(seq_len: int | torch.Tensor | None, factor: float, original_max_position_embeddings: int) -> float:
    """s(L) = min(factor, max(1, L / L_orig)); 1 before any sequence is seen."""
    if seq_len is None:
        return 1.0
    return min(float(factor), max(1.0, int(seq_len) / original_max_position_embeddings))


def compute_dynamic_yarn_parameters(
    config: PreTrainedConfig,
    device: torch.device | str | None = None,
    seq_len: int | torch.Tensor | None = None,
    layer_type: str | None = None,
) -> tuple[torch.Tensor, float]:
    """transformers' rope-init contract for dynamic YaRN.

    Args:
        config: a model config whose ``rope_parameters`` has ``rope_type`` =
            :data:`DYNAMIC_YARN_ROPE_TYPE`, ``factor`` and ``original_max_position_embeddings``.
        device: where to build ``inv_freq``.
        seq_len: the current sequence length L; ``None`` at construction (s = 1).
        layer_type: the key of per-layer-type rope parameters, when the config nests them.

    Returns:
        ``(inv_freq [rotary_dim // 2], attention_factor)``; at s = 1 exactly plain RoPE.
    """
    params = _rope_dict(config, layer_type)
    theta = float(params["rope_theta"])
    rotary_dim = rotary_dim_of(config, params)
    original = int(params["original_max_position_embeddings"])
    scale = dynamic_yarn_scale(seq_len, params["factor"], original)
    if scale == 1.0:
        return default_inv_freq(theta, rotary_dim, device), 1.0
    inv_freq = yarn_inv_freq(
        theta,
        rotary_dim,
        scale,
        original,
        beta_fast=params.get("beta_fast", 32.0),
        beta_slow=params.get("beta_slow", 1.0),
        truncate=params.get("truncate", True),
        device=device,
    )
    attention_factor = params.get("attention_factor")
    return inv_freq, float(attention_factor) if attention_factor is not None else yarn_mscale(scale)


@dataclass(frozen=True)
class _YarnFields(PositionMethod):
    """YaRN's hyper-parameters (eqs. 18 and 22), shared by the static and dynamic methods.

    Args:
        beta_fast: pairs making more than this many turns over L_orig are not interpolated (32).
        beta_slow: pairs making fewer turns are fully interpolated (1).
        attention_factor: a fixed cos/sin multiplier replacing 0.1 ln(s) + 1.
    """

    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        for field in ("beta_fast", "beta_slow"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{self.name}: {field} must be a positive number, got {value!r}")
        if self.beta_fast <= self.beta_slow:
            raise ValueError(
                f"{self.name}: beta_fast must be greater than beta_slow, got beta_fast={self.beta_fast!r} "
                f"and beta_slow={self.beta_slow!r}"
            )
        value = self.attention_factor
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            raise ValueError(f"{self.name}: attention_factor must be a positive number or None, got {value!r}")

    def _yarn_parameters(self, base: BaseRope, rope_type: str) -> dict[str, Any]:
        params = {
            **base.rope_parameters,
            "rope_type": rope_type,
            "factor": self.factor,
            "original_max_position_embeddings": base.original_max_position_embeddings,
            "beta_fast": float(self.beta_fast),
            "beta_slow": float(self.beta_slow),
        }
        if self.attention_factor is not None:
            params["attention_factor"] = float(self.attention_factor)
        return params


@register("yarn")
@dataclass(frozen=True)
class YarnConfig(_YarnFields):
    """YaRN: NTK-by-parts frequency ramp plus 0.1 ln(s) + 1 attention temperature (native ``yarn``)."""

    paper = "Peng et al. 2023, YaRN, arXiv:2309.00071"

    def rope_parameters(self, base: BaseRope) -> dict[str, Any]:
        return self._yarn_parameters(base, "yarn")


@register("dynamic_yarn")
@dataclass(frozen=True)
class DynamicYarnConfig(_YarnFields, DynamicScaling):
    """Dynamic YaRN: YaRN with s = min(factor, max(1, L / L_orig)) from the current length."""

    paper = "Peng et al. 2023, YaRN, arXiv:2309.00071 sec. 3.3"

    def rope_parameters(self, base: BaseRope) -> dict[str, Any]:
        return self._yarn_parameters(base, DYNAMIC_YARN_ROPE_TYPE)
