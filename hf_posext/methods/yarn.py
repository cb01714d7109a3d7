"""YaRN and dynamic YaRN.

Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large Language Models",
arXiv 2309.00071 (v2), section 3.2 and eqs. 17-22. What the code implements
(:func:`hf_posext.rope_utils.yarn_inv_freq`, the same as the authors' code and transformers):

* each rotary pair i has wavelength lambda_i = 2 pi theta^(2i/d) and completes
  r_i = L_orig / lambda_i turns over the original context;
* the ramp is linear in the *pair index* i: gamma_i = 1 - clamp((i - low) / (high - low), 0, 1),
  where low and high are the (fractional) pair indices at which r_i = beta_fast = 32 and
  r_i = beta_slow = 1, floored and ceiled to whole pairs (gamma = 1: a fast pair, kept). The paper's eq. 18 ramps linearly in
  r_i instead, gamma(r) = clamp((r - alpha) / (beta - alpha), 0, 1); r falls exponentially with i,
  so the paper's ramp interpolates the middle pairs more (pair 26 of d=128 at s=4, L_orig=4096:
  1.67x in the paper, 1.209x in the code; pair 27 is 1.25x). hf-posext follows the code so that
  its checkpoints mean the same in transformers and vLLM;
* frequencies are blended, not the scales: theta_i' = (1 - gamma_i) * theta_i / s + gamma_i * theta_i
  (eq. 20);
* cos and sin are multiplied by mscale = 0.1 ln(s) + 1, so q.k logits grow by mscale^2 (eq. 22,
  the paper's "sqrt(1/t)" applied to both q and k).

Static YaRN is transformers' native ``rope_type="yarn"``. Dynamic YaRN (section 3.3) uses the
same frequencies with s recomputed from the current length L: s(L) = max(1, L / L_orig). It has
no native type; :func:`~hf_posext.rope_utils.compute_dynamic_yarn_parameters` is registered as the
rope type :data:`~hf_posext.rope_utils.DYNAMIC_YARN_ROPE_TYPE`. Unlike the reference code,
hf-posext bounds s(L) by ``factor``: factor=1 is the identity and from ``factor * L_orig`` tokens
on dynamic YaRN equals static YaRN at ``factor``. (Dynamic NTK is not bounded: its ``factor`` is
the reference's alpha, see :mod:`.ntk`.)

On a checkpoint that ships a static scaling (composition; llama3, linear, yarn, longrope), YaRN
extends what the checkpoint reaches, L0, by s:

* the ramp uses the checkpoint's own (already scaled) frequencies omega_i: r_i = L0 omega_i / (2 pi)
  turns over L0, the ramp between the fractional pairs where r_i crosses beta_fast and beta_slow
  (:func:`~hf_posext.rope_utils.yarn_pair_factors`); fast pairs keep the checkpoint's frequency
  exactly, slow pairs are divided by s, frequencies are blended as in eq. 20;
* temperatures multiply: the checkpoint's attention factor a (its own YaRN mscale, longrope's
  sqrt(1 + ln s / ln L), 1 for llama3) times 0.1 ln(s) + 1. transformers applies each as a
  cos/sin multiplier, so the q.k logits carry a^2 (eq. 22's 1/t); the checkpoint's weights
  expect its a^2 at every position and the new factor corrects the entropy of the further
  s-fold extension, so the logit scalings compose as a product: (a m)^2. This is not
  0.1 ln(s_base s) + 1 (YaRN 4 on YaRN 4: 1.1386^2 = 1.2964 against 1.2773).
  ``attention_factor`` replaces only the new factor m.

A ``longrope`` checkpoint whose short and long factors differ (Phi-3) is composed from its long
factors, the ones that reach L0, and the result is one factor set for every length: sequences
shorter than its original context no longer get its short factors (this holds for every
method, :class:`~hf_posext.methods.base.BaseRope`).

Dynamic YaRN composes the same way with s(L) = min(factor, max(1, L / L0)): up to L0 the
checkpoint runs exactly its own frequencies and attention factor, past L0 it is static YaRN at
s(L) on top of them. It needs its own rope type anyway, so the checkpoint's divisors and attention
factor travel in its entry (``base_factors``, ``base_attention_factor``). Dynamic NTK does not
compose: its native ``dynamic`` type recomputes from theta alone, so it is refused
(``override=True`` replaces the checkpoint's scaling instead).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..rope_utils import DYNAMIC_YARN_ROPE_TYPE, default_inv_freq, yarn_attention_factor, yarn_pair_factors
from .base import BaseRope, PositionMethod, real_number, register
from .dynamic import DynamicScaling

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
            given = getattr(self, field)
            value = real_number(self.name, field, given, "> 0")
            if value <= 0:
                raise ValueError(f"{self.name}: {field} must be a positive number, got {given!r}")
            object.__setattr__(self, field, value)
        if self.beta_fast <= self.beta_slow:
            raise ValueError(
                f"{self.name}: beta_fast must be greater than beta_slow, got beta_fast={self.beta_fast!r} "
                f"and beta_slow={self.beta_slow!r}"
            )
        if self.attention_factor is not None:
            value = real_number(self.name, "attention_factor", self.attention_factor, "> 0 or None")
            if value <= 0:
                raise ValueError(
                    f"{self.name}: attention_factor must be a positive number or None, got {self.attention_factor!r}"
                )
            object.__setattr__(self, "attention_factor", value)

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
    composes = True

    def rope_parameters(self, base: BaseRope) -> dict[str, Any]:
        return self._yarn_parameters(base, "yarn")

    def pair_factors(self, base: BaseRope) -> torch.Tensor | None:
        if base.pair_divisors is None:
            return None
        base_inv_freq = default_inv_freq(base.theta, base.rotary_dim).double() / base.pair_divisors
        return yarn_pair_factors(
            base_inv_freq, base.original_max_position_embeddings, self.factor, self.beta_fast, self.beta_slow
        )

    def temperature(self, base: BaseRope) -> float:
        return yarn_attention_factor(self.attention_factor, self.factor)


@register("dynamic_yarn")
@dataclass(frozen=True)
class DynamicYarnConfig(_YarnFields, DynamicScaling):
    """Dynamic YaRN: YaRN with s = min(factor, max(1, L / L_orig)) from the current length."""

    paper = "Peng et al. 2023, YaRN, arXiv:2309.00071 sec. 3.3"
    composes = True

    def rope_parameters(self, base: BaseRope) -> dict[str, Any]:
        return self._yarn_parameters(base, DYNAMIC_YARN_ROPE_TYPE)

    def composed_rope_parameters(self, base: BaseRope) -> dict[str, Any]:
        params = {k: v for k, v in self._yarn_parameters(base, DYNAMIC_YARN_ROPE_TYPE).items() if k in _DYNAMIC_KEYS}
        params["base_factors"] = [float(c) for c in base.pair_divisors]
        params["base_attention_factor"] = float(base.attention_factor)
        return params


#: What a composed dynamic YaRN entry keeps of the checkpoint's own entry: its scaling is in base_factors.
_DYNAMIC_KEYS = {
    "rope_type", "rope_theta", "partial_rotary_factor", "factor", "original_max_position_embeddings", "beta_fast",
    "beta_slow", "attention_factor",
}
