"""Float64 references of the training-free methods, written from the authors' code, run inside a tiny model.

The reference model is a copy of the model whose rotary module is switched off (hf-posext's
no-rope type: q and k reach attention un-rotated); its attention function then rotates them in
float64 at the positions each method prescribes, with the checkpoint's frequencies and attention
factor, and merges as the authors do:

* Self-Extend (LongLM ``self_extend_patch/Llama_4_40.py``): neighbour logits at true positions,
  grouped logits with keys at ``j // G`` and queries at ``i // G + W - W // G``, chosen by
  ``i - j < W`` before one softmax;
* DCA (ChunkLlama ``chunkllama_attn_replace.py``): keys at ``j mod c``, queries at ``i mod c``
  (own chunk), ``min(i mod c + c, S)`` (previous chunk), ``min(2c - 1, S)`` (older chunks);
* STRING (HKUNLP/STRING ``string_for_llama.py``, decode path) and ReRoPE (bojone/rerope
  ``rerope_patch.py``, ``leaky_rerope_patch.py``): each pair scored at an explicit relative position
  rel(i - j), the query turned by rel and the key left at 0, one query row at a time.
"""

from __future__ import annotations

import copy
import math

import torch

from hf_posext import integration
from hf_posext.rope_utils import NO_ROPE_TYPE

REFERENCE_ATTENTION = "test_training_free_reference"


def _rotate(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, factor: float) -> torch.Tensor:
    """Rotate-half RoPE of float64 ``x`` [b, h, s, d] at float ``positions`` [s] (callers handle [q, k] grids)."""
    half = inv_freq.shape[0]
    angles = positions.double()[:, None] * inv_freq.double()[None, :]
    cos, sin = angles.cos() * factor, angles.sin() * factor
    first, second, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    return torch.cat((first * cos - second * sin, second * cos + first * sin, rest), dim=-1)


def _scores(q, k, q_pos, k_pos, inv_freq, factor, groups):
    qr, kr = _rotate(q, q_pos, inv_freq, factor), _rotate(k, k_pos, inv_freq, factor)
    return qr @ kr.repeat_interleave(groups, dim=1).transpose(-1, -2)


def self_extend_scores(q, k, inv_freq, factor, groups, group_size, window_size):
    window = window_size
    i = torch.arange(q.shape[2])
    j = torch.arange(k.shape[2])
    neighbour = _scores(q, k, i, j, inv_freq, factor, groups)
    grouped = _scores(q, k, i // group_size + window - window // group_size, j // group_size, inv_freq, factor, groups)
    near = (i[:, None] - j[None, :]) < window
    return torch.where(near, neighbour, grouped)


def dca_scores(q, k, inv_freq, factor, groups, chunk_size, local_size):
    c = chunk_size - local_size
    i = torch.arange(q.shape[2])
    j = torch.arange(k.shape[2])
    intra = _scores(q, k, i % c, j % c, inv_freq, factor, groups)
    succ = _scores(q, k, ((i % c) + c).clamp(max=chunk_size), j % c, inv_freq, factor, groups)
    inter = _scores(q, k, torch.full_like(i, min(2 * c - 1, chunk_size)), j % c, inv_freq, factor, groups)
    relation = (i // c)[:, None] - (j // c)[None, :]
    return torch.where(relation == 0, intra, torch.where(relation == 1, succ, inter))


def relative_scores(q, k, inv_freq, factor, groups, rel):
    """``R(rel(i - j)) q_i . k_j`` for every pair (float64), ``rel`` mapping distances to positions."""
    keys = _rotate(k, torch.zeros(k.shape[2]), inv_freq, factor).repeat_interleave(groups, dim=1)
    distances = torch.arange(k.shape[2])
    rows = []
    for i in range(q.shape[2]):
        positions = rel((i - distances).clamp(min=0).double())
        turned = _rotate(q[:, :, i : i + 1].expand(-1, -1, k.shape[2], -1), positions, inv_freq, factor)
        rows.append((turned * keys).sum(-1))
    return torch.stack(rows, dim=2)


def string_scores(q, k, inv_freq, factor, groups, shift, local_window, qk_scale=False):
    """STRING: distance d below the shift S kept, d >= S scored at d - S + W (the key at d = S at W).

    ``qk_scale``: the authors' cos/sin multiplied by ``0.1 ln 2 + 1`` (``replace_with_string``), q and k both.
    """
    if qk_scale:
        factor = factor * (0.1 * math.log(2) + 1)
    return relative_scores(
        q, k, inv_freq, factor, groups, lambda d: torch.where(d < shift, d, d - shift + local_window)
    )


def rerope_scores(q, k, inv_freq, factor, groups, window, leak=None, log_scale=None):
    """ReRoPE: min(d, w); leaky ReRoPE: w + (d - w) / k beyond the window w.

    ``log_scale`` (the trained context L0): queries times ``max(1, ln(i + 1) / ln L0)``, as the authors' code.
    """
    if log_scale is not None:
        positions = torch.arange(q.shape[2], dtype=torch.float64)
        q = q * (torch.log(positions + 1) / math.log(log_scale)).clamp(min=1)[:, None]
    beyond = (lambda d: torch.full_like(d, float(window))) if leak is None else (lambda d: window + (d - window) / leak)
    return relative_scores(q, k, inv_freq, factor, groups, lambda d: torch.where(d < window, d, beyond(d)))


def reference_model(model, scores_fn, **params):
    """A ``model`` copy attending with the float64 reference ``scores_fn(q, k, inv_freq, factor, groups, **params)``."""
    rotary = model.model.rotary_emb
    inv_freq, factor = rotary.inv_freq.clone(), float(rotary.attention_scaling)
    reference = copy.deepcopy(model)
    config = reference.config
    config.rope_parameters = {**config.rope_parameters, "rope_type": NO_ROPE_TYPE}
    reference.model.rotary_emb = type(rotary)(config=config)

    def attention(module, query, key, value, attention_mask, **kwargs):
        q, k, v = query.double(), key.double(), value.double()
        groups = q.shape[1] // k.shape[1]
        scores = scores_fn(q, k, inv_freq, factor, groups, **params) * kwargs["scaling"]
        seq = q.shape[2]
        allowed = torch.ones(seq, seq, dtype=torch.bool).tril()
        if attention_mask is not None:
            allowed = allowed & attention_mask.bool()
        # the lowest finite value, as transformers' masks: a fully masked (padding) row is uniform, not NaN
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores, dim=-1)
        out = probs @ v.repeat_interleave(groups, dim=1)
        return out.transpose(1, 2).to(query.dtype), probs.to(query.dtype)  # the maps, as eager returns them

    integration.register_attention_wrapper(REFERENCE_ATTENTION, attention, mask_like="sdpa")
    config._attn_implementation = REFERENCE_ATTENTION
    return reference
