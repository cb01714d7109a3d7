"""ALiBi as a transformers attention implementation: the mask function and the attention paths.

`alibi_mask` (registered with ``AttentionMaskInterface``) builds, once per forward, the mask
form the chosen backend needs from transformers' own mask functions and absolute cache
positions; `alibi_attention_forward` (``AttentionInterface``) turns it into the per-head
bias -m_h (i - j) and runs the path (eager, sdpa, flex, flash, folded; `select_backend`).
The maths and each backend: docs/methods/alibi.md. Tests: ``tests/methods/alibi/test_attention.py``.

Longer than ~400 lines on purpose: the mask function and the four paths exchange one mask form
per backend (`select_backend`), and each form is built next to the path that reads it.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from typing import Any, Literal

import torch
import torch.nn.functional as F
from ... import integration as masking_utils  # transformers' mask builders, re-exported
from ...attention.head_sharding import held_heads
from ...attention.maps import attention_maps_requested

from .folded import folded_alibi, folded_mask, is_key_padding
from .slopes import alibi_slopes

logger = logging.getLogger("hf_posext")

#: The ``attn_implementation`` name. Vanilla transformers refuses an unknown one with
#: 'Specified `attn_implementation="<name>"` is not supported' before anything of hf-posext can run,
#: so the name itself says what is missing (as the rope types do: hf_posext.readers.transformers5).
ALIBI_ATTENTION = "hf_posext_alibi (requires: import hf_posext)"
#: The name checkpoints carried before it said so; still registered, and upgraded when a model is built.
OLD_ALIBI_ATTENTION = "hf_posext_alibi"

Backend = Literal["auto", "eager", "sdpa", "flex", "flash", "folded"]
BACKENDS: tuple[str, ...] = ("auto", "eager", "sdpa", "flex", "flash", "folded")

#: transformers' own implementation names, mapped to the ALiBi path that replaces them when an
#: ALiBi checkpoint is loaded with ``attn_implementation=...``.
NATIVE_TO_BACKEND = {
    "eager": "eager",
    "sdpa": "sdpa",
    "flex_attention": "flex",
    "flash_attention_2": "flash",
    "flash_attention_3": "flash",
}

#: Compile ``flex_attention`` and the block mask (the point of the path: fused, no L x L tensor).
#: Set to False to debug, or in tests: uncompiled, PyTorch evaluates the same score_mod and
#: mask_mod on materialised [batch, heads, q, kv] scores, in seconds instead of a minute of compiling.
FLEX_COMPILE = True


def flash_attn_available() -> bool:
    """Whether the ``flash_attn`` package (which has ``alibi_slopes``) is importable."""
    return importlib.util.find_spec("flash_attn") is not None


def flex_attention_available() -> bool:
    return importlib.util.find_spec("torch.nn.attention.flex_attention") is not None


def requested_backend(config: Any) -> str:
    """The backend an ALiBi-patched config asks for ("auto" when it says nothing)."""
    record = getattr(config, "hf_posext", None) or {}
    return record.get("backend", "auto") if isinstance(record, dict) else "auto"


def select_backend(requested: str, device: torch.device | str, dtype: torch.dtype) -> str:
    """The path that runs for ``requested`` on ``device`` in ``dtype``.

    The mask function and the attention function both call this with the same arguments within
    one forward, so the mask they exchange always has the form the path expects.

    Raises:
        ValueError: an unknown backend name.
        ImportError: ``flash`` without the flash_attn package or without CUDA.
    """
    if requested not in BACKENDS:
        raise ValueError(f"unknown ALiBi backend {requested!r}; allowed: {', '.join(BACKENDS)}")
    device_type = torch.device(device).type
    if requested == "auto":
        if device_type == "cuda":
            if flash_attn_available() and dtype in (torch.float16, torch.bfloat16):
                return "flash"
            return "flex" if flex_attention_available() else "sdpa"
        return "sdpa"
    if requested == "flash" and (device_type != "cuda" or not flash_attn_available()):
        raise ImportError(
            "ALiBi backend 'flash' needs the flash_attn package and a CUDA device "
            f"(device={device_type}, flash_attn installed={flash_attn_available()}); use 'flex' or 'sdpa' instead"
        )
    if requested == "flex" and not flex_attention_available():
        raise ImportError("ALiBi backend 'flex' needs torch.nn.attention.flex_attention (PyTorch >= 2.5)")
    return requested


def alibi_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int | torch.Tensor = 0,
    kv_offset: int | torch.Tensor = 0,
    mask_function: Any = None,
    attention_mask: torch.Tensor | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    config: Any = None,
    use_vmap: bool = False,
    **kwargs: Any,
) -> Any:
    """transformers' mask-interface contract for ALiBi (see the module docstring).

    Args:
        batch_size, q_length, kv_length: the attention shape.
        q_offset, kv_offset: absolute positions of the first query and the first cached key.
        mask_function: transformers' ``(batch, head, q_idx, kv_idx) -> bool`` pattern (causal,
            sliding window, packed sequences...); ``None``: causal.
        attention_mask: ``[batch, kv_offset + kv_length]`` 2D padding mask (True = real token).
        device, dtype: of the model's inputs; they decide the path with the config's backend.
        config: the model config (its ``hf_posext`` record holds the backend).
        kwargs: transformers' ``allow_is_causal_skip`` and ``local_size`` (read by the folded path).

    Returns:
        eager/SDPA: fp32 ``[batch, 1, q, kv]`` holding ``-(i - j)`` where allowed, ``-inf`` elsewhere;
        flex: a ``BlockMask``; flash: the 2D padding mask or ``None``; folded: ``None`` or a
        ``[batch, 1, 1, kv]`` boolean "key is real" where SDPA's ``is_causal`` is the rest of the
        mask (see `alibi_folded`), else the SDPA form.
    """
    if mask_function is None:
        mask_function = masking_utils.causal_mask_function
    backend = select_backend(requested_backend(config), device, dtype)
    common = dict(
        batch_size=batch_size,
        q_length=q_length,
        kv_length=kv_length,
        q_offset=q_offset,
        kv_offset=kv_offset,
        mask_function=mask_function,
        attention_mask=attention_mask,
        device=device,
    )
    if backend == "flash":
        return masking_utils.flash_attention_mask(**common)
    if backend == "flex":
        return flex_block_mask(**common)
    options = dict(local_size=kwargs.get("local_size"), allow_is_bidirectional_skip=False, use_vmap=use_vmap)
    if backend == "folded":
        folds, mask = folded_mask(common, options, kwargs.get("allow_is_causal_skip", False))
        if folds:
            return mask
    allowed = masking_utils.sdpa_mask(**common, **options, allow_is_causal_skip=False)
    return distance_mask(allowed, q_offset, kv_offset)


def flex_block_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int | torch.Tensor,
    kv_offset: int | torch.Tensor,
    mask_function: Any,
    attention_mask: torch.Tensor | None,
    device: torch.device | str,
) -> Any:
    """The ``BlockMask`` for the flex path (transformers' ``flex_attention_mask``, compile switchable).

    A BlockMask only knows lengths, so the absolute shift of the queries relative to the keys is
    attached as ``hf_posext_query_shift`` for the score modifier (with a static cache it is not
    ``kv_length - q_length``).
    """
    from torch.nn.attention.flex_attention import create_block_mask

    if attention_mask is not None and not bool(attention_mask.all()):
        padding = masking_utils.prepare_padding_mask(attention_mask, kv_length, kv_offset)
        mask_function = masking_utils.and_masks(mask_function, masking_utils.padding_mask_function(padding))
    mask_function = masking_utils.add_offsets_to_mask_function(mask_function, q_offset, kv_offset)
    # torch.compile(create_block_mask) is what its deprecated _compile=True flag ran (PyTorch 2.13).
    make = torch.compile(create_block_mask) if FLEX_COMPILE else create_block_mask
    block_mask = make(mask_function, batch_size, None, q_length, kv_length, device)
    block_mask.hf_posext_query_shift = q_offset - kv_offset
    return block_mask


def distance_mask(
    allowed: torch.Tensor, q_offset: int | torch.Tensor = 0, kv_offset: int | torch.Tensor = 0
) -> torch.Tensor:
    """``-(i - j)`` in fp32 where ``allowed``, ``-inf`` elsewhere.

    Args:
        allowed: ``[batch, 1, q, kv]`` boolean mask.
        q_offset, kv_offset: absolute positions of the first query and key.

    Returns:
        ``[batch, 1, q, kv]`` fp32. fp32 because in bf16 integer distances past 256 are rounded.
    """
    q_length, kv_length = allowed.shape[-2:]
    device = allowed.device
    q_pos = torch.arange(q_length, device=device) + q_offset
    kv_pos = torch.arange(kv_length, device=device) + kv_offset
    negative_distance = (kv_pos[None, :] - q_pos[:, None]).to(torch.float32)
    return torch.where(allowed, negative_distance, float("-inf"))


@functools.lru_cache(maxsize=64)
def _cached_slopes(num_heads: int, device: torch.device) -> torch.Tensor:
    return alibi_slopes(num_heads, device=device)


def head_slopes(module: torch.nn.Module, heads: int, device: torch.device) -> torch.Tensor:
    """``[heads]`` slopes of the query heads ``module`` attends over here: all of them, or under sequence
    parallelism the slice of the heads this process holds (`hf_posext.attention.head_sharding`)."""
    first, total = held_heads(module, heads)
    return _cached_slopes(total, device)[first : first + heads]


def _head_bias(mask: torch.Tensor, slopes: torch.Tensor, floor_dtype: torch.dtype) -> torch.Tensor:
    """``[batch, heads, q, kv]`` fp32 bias -m_h (i - j); masked entries at the dtype's minimum.

    The minimum instead of -inf keeps rows with no allowed key (left-padding queries) finite:
    a NaN there would reach real tokens through the next layer's values.
    """
    if mask.dtype == torch.bool:  # a 4D boolean mask built by the caller: distances from the cache layout
        mask = distance_mask(mask, q_offset=mask.shape[-1] - mask.shape[-2])
    return (mask.to(torch.float32) * slopes.view(1, -1, 1, 1)).clamp_min(torch.finfo(floor_dtype).min)


def _repeat_kv(states: torch.Tensor, groups: int) -> torch.Tensor:
    if groups == 1:
        return states
    batch, kv_heads, length, dim = states.shape
    return (
        states[:, :, None].expand(batch, kv_heads, groups, length, dim).reshape(batch, kv_heads * groups, length, dim)
    )


def eager_alibi(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    scaling: float,
    dropout: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Explicit ALiBi attention: fp32 logits plus bias, fp32 softmax.

    Args:
        query: ``[batch, heads, q, head_dim]``; key, value: ``[batch, kv_heads, kv, head_dim]``.
        mask: `distance_mask` output ``[batch, 1, q, kv]``.

    Returns:
        ``([batch, q, heads, head_dim], weights [batch, heads, q, kv])``.
    """
    groups = query.shape[1] // key.shape[1]
    key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
    logits = torch.matmul(query, key.transpose(2, 3)).to(torch.float32) * scaling
    logits = logits + _head_bias(mask, head_slopes(module, query.shape[1], query.device), torch.float32)
    weights = F.softmax(logits, dim=-1).to(query.dtype)
    weights = F.dropout(weights, p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def sdpa_alibi(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    scaling: float,
    dropout: float = 0.0,
) -> tuple[torch.Tensor, None]:
    """ALiBi through ``scaled_dot_product_attention`` with an additive ``[batch, heads, q, kv]`` bias."""
    bias = _head_bias(mask, head_slopes(module, query.shape[1], query.device), query.dtype).to(query.dtype)
    out = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=bias,
        dropout_p=dropout if module.training else 0.0,
        scale=scaling,
        enable_gqa=query.shape[1] != key.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


_compiled_flex = None
#: Device types on which compiling flex_attention failed in this process: they run it uncompiled.
_FLEX_COMPILE_FAILED: set[str] = set()


def _flex_attention(device_type: str = "cpu"):
    """``flex_attention``, compiled once per process when `FLEX_COMPILE` (and it compiles on ``device_type``)."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention

    if not FLEX_COMPILE or device_type in _FLEX_COMPILE_FAILED:
        return flex_attention
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention)
    return _compiled_flex


def _run_flex(query: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """``flex_attention(query, ...)``; when inductor fails to compile it, the same call uncompiled (with a warning).

    Seen with PyTorch 2.13.0 on CPU: a left-padded batch's decoding steps (one query row per
    sequence) pick inductor's CPU flex-decoding template, whose C++ does not compile
    ("'cur_kvSplitSize0' was not declared"). That template came with PyTorch 2.10 (pytorch#159835),
    so 2.10 and later may be affected; CUDA uses other templates. Uncompiled, PyTorch evaluates the
    same score_mod and mask_mod on materialised scores: the same result, at the memory of an
    unfused path (fine for the CPU, where this backend is for testing; use 'sdpa' or 'folded' there).
    """
    device_type = query.device.type
    try:
        return _flex_attention(device_type)(query, *args, **kwargs)
    except torch._dynamo.exc.BackendCompilerFailed as err:
        if not FLEX_COMPILE or device_type in _FLEX_COMPILE_FAILED:
            raise
        _FLEX_COMPILE_FAILED.add(device_type)
        logger.warning(
            "ALiBi backend 'flex': torch %s could not compile flex_attention on %s (%s); running it uncompiled on %s "
            "from now on (same result, unfused memory). Patch with backend='sdpa' or 'folded' to avoid this.",
            torch.__version__,
            device_type,
            str(err).strip().splitlines()[0][:200],
            device_type,
        )
        return _flex_attention(device_type)(query, *args, **kwargs)


def flex_alibi(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    block_mask: Any,
    scaling: float,
    dropout: float = 0.0,
) -> tuple[torch.Tensor, None]:
    """ALiBi as a FlexAttention ``score_mod``: the bias is computed per score, never stored.

    Raises:
        ValueError: for dropout, or for a CPU forward that records gradients (no CPU backward).
    """
    if dropout and module.training:
        raise ValueError(f"ALiBi backend 'flex' has no attention dropout (got dropout={dropout}); use 'sdpa'")
    if query.device.type == "cpu" and torch.is_grad_enabled() and query.requires_grad:
        raise ValueError(
            "ALiBi backend 'flex' cannot train on CPU (PyTorch's flex_attention has no CPU backward); "
            "patch with backend='sdpa' (or 'auto') to train on CPU, or run under torch.no_grad()"
        )
    slopes = head_slopes(module, query.shape[1], query.device)
    shift = getattr(block_mask, "hf_posext_query_shift", key.shape[-2] - query.shape[-2])
    if not isinstance(shift, torch.Tensor):
        shift = torch.tensor(shift, device=query.device)

    def score_mod(score, batch_idx, head_idx, q_idx, kv_idx):
        return score - slopes[head_idx] * (q_idx + shift - kv_idx).to(torch.float32)

    heads, kv_heads = query.shape[1], key.shape[1]
    enable_gqa = heads != kv_heads
    if enable_gqa and heads & (heads - 1):
        # flex_attention's GQA needs a power-of-two head count (as transformers' own flex path notes)
        key, value = _repeat_kv(key, heads // kv_heads), _repeat_kv(value, heads // kv_heads)
        enable_gqa = False
    out = _run_flex(query, key, value, score_mod=score_mod, block_mask=block_mask, scale=scaling, enable_gqa=enable_gqa)
    return out.transpose(1, 2).contiguous(), None


def flash_alibi(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    padding_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    sliding_window: int | None = None,
) -> tuple[torch.Tensor, None]:
    """ALiBi through flash-attn's ``alibi_slopes`` (CUDA, fp16/bf16).

    flash-attn aligns causal masks and ALiBi distances bottom-right (query t of q attends as
    position kv - q + t), which is where cached queries sit. Padded batches are unpadded into
    variable-length sequences first, so each row's distances start at its first real token.

    Args:
        padding_mask: ``[batch, kv]`` (True/1 = real token) or ``None``.
        sliding_window: Mistral/Qwen2's window (tokens attended including the current one).
    """
    from flash_attn import flash_attn_func, flash_attn_varlen_func

    batch, heads, q_length, head_dim = query.shape
    kv_length = key.shape[-2]
    slopes = head_slopes(module, heads, query.device)
    window = (sliding_window - 1, 0) if sliding_window is not None and kv_length > sliding_window else (-1, -1)
    options = dict(
        dropout_p=dropout if module.training else 0.0,
        softmax_scale=scaling,
        causal=True,
        window_size=window,
        alibi_slopes=slopes,
    )
    # flash-attn wants [batch, seq, heads, head_dim]; GQA is native (heads % kv_heads == 0)
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    if padding_mask is None:
        return flash_attn_func(q, k, v, **options), None
    padding_mask = padding_mask.bool()
    # The query tokens are the last q columns of the 2D mask; a static cache's buffer is longer
    # than the mask, and its unused slots are padding.
    q_keep = padding_mask[:, -q_length:]
    kv_keep = F.pad(padding_mask, (0, kv_length - padding_mask.shape[1]), value=False)[:, -kv_length:]
    kv_lens, q_lens = kv_keep.sum(-1, dtype=torch.int32), q_keep.sum(-1, dtype=torch.int32)
    cu_k = F.pad(kv_lens.cumsum(0, dtype=torch.int32), (1, 0))
    cu_q = F.pad(q_lens.cumsum(0, dtype=torch.int32), (1, 0))
    out = flash_attn_varlen_func(
        q[q_keep],
        k[kv_keep],
        v[kv_keep],
        cu_seqlens_q=cu_q,
        cu_seqlens_k=cu_k,
        max_seqlen_q=int(q_lens.max()),
        max_seqlen_k=int(kv_lens.max()),
        **options,
    )
    padded = out.new_zeros(batch, q_length, heads, head_dim)
    padded[q_keep] = out
    return padded, None


def alibi_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """transformers' attention-interface contract for ALiBi.

    Args:
        module: the attention layer (its ``config`` carries the backend).
        query: ``[batch, heads, q, head_dim]``, rotary already a no-op.
        key, value: ``[batch, kv_heads, kv, head_dim]`` including the cache.
        attention_mask: what `alibi_mask` built for this forward.
        scaling: the logit scale, ``1 / sqrt(head_dim)`` for these models.
        dropout: attention dropout probability (training only).
        sliding_window: the layer's window, used by the flash path (the others get it in the mask).

    Returns:
        ``(output [batch, q, heads, head_dim], attention weights or None)``: the weights where the
        forward asks for them (``output_attentions``; refused by the paths that never hold them).
    """
    scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
    config = getattr(module, "config", None)
    backend = select_backend(requested_backend(config), query.device, query.dtype)
    maps = attention_maps_requested(module, kwargs)  # eager's path returns them, sdpa's mask alike
    if maps and backend in ("flash", "flex", "folded"):
        raise ValueError(
            f"ALiBi backend {backend!r} computes no attention maps (output_attentions=True); patch with "
            "backend='eager' or 'sdpa' for them"
        )
    if backend == "flash":
        return flash_alibi(module, query, key, value, attention_mask, scaling, dropout, sliding_window)
    if attention_mask is None and backend in ("eager", "sdpa"):
        # Sequence parallelism (DeepSpeed Ulysses) drops the model's mask and attends over the whole
        # gathered sequence: causal over it, no cache (as SDPA's is_causal without a mask).
        allowed = torch.ones(query.shape[2], key.shape[2], dtype=torch.bool, device=query.device).tril()
        attention_mask = distance_mask(allowed[None, None])
    if backend == "folded" and attention_mask is None:
        return folded_alibi(module, query, key, value, scaling, dropout)
    if backend == "folded" and is_key_padding(attention_mask, query):
        return folded_alibi(module, query, key, value, scaling, dropout, key_is_real=attention_mask[:, 0, 0, :])
    if attention_mask is None or (isinstance(attention_mask, torch.Tensor) and attention_mask.dim() != 4):
        raise ValueError(
            f"ALiBi backend {backend!r} needs the mask built by hf-posext's mask function, got "
            f"{type(attention_mask).__name__}; was config._attn_implementation changed without patch_model?"
        )
    if backend == "flex":
        return flex_alibi(module, query, key, value, attention_mask, scaling, dropout)
    if backend == "eager" or maps:
        return eager_alibi(module, query, key, value, attention_mask, scaling, dropout)
    # "folded" with a mask that is_causal cannot express runs here
    return sdpa_alibi(module, query, key, value, attention_mask, scaling, dropout)
