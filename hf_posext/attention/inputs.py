"""One call of an attention function: the arguments of transformers' attention interface, as one frozen object.

Both kernels behind hf-posext's wrappers (`remap` and `exact_dynamic`) hand a call's module,
queries, keys, values, mask and keyword arguments down through their helpers; `AttentionInputs`
carries the six as one argument (frozen: a helper that needs other tensors makes a new one). It lives
beside the two packages because both use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True, slots=True)
class AttentionInputs:
    """What transformers passes an attention function: ``fn(module, query, key, value, attention_mask, **kwargs)``.

    Attributes:
        module: the attention module (``scaling``, ``training``, the wrapper's state).
        query: ``[batch, heads, seq, head_dim]``.
        key: ``[batch, kv_heads, kv_len, head_dim]``, the cache's keys first.
        value: ``[batch, kv_heads, kv_len, head_dim]``.
        attention_mask: the kernel's mask ``[batch, 1, seq, kv_len]`` (bool, True: attend, or additive float)
            or ``None``.
        kwargs: the other arguments (``position_ids``, ``scaling``, ``dropout``, ``softcap``, ...).
    """

    module: nn.Module
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    attention_mask: torch.Tensor | None
    kwargs: dict[str, Any]
