"""Next-token loss without the ``[tokens x vocabulary]`` logits: the LM head applied chunk by chunk.

`causal_lm_loss` equals transformers' ``ForCausalLMLoss`` and its gradients while holding
the logits of ``chunk_size`` tokens at a time; how, and which models it refuses:
docs/notes/training.md.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
from accelerate.utils import extract_model_from_parallel
from torch.distributed.fsdp import FSDPModule
from torch.utils.checkpoint import checkpoint

IGNORE_INDEX = -100


def chunked_head_loss(
    head: nn.Module,
    hidden: torch.Tensor,
    shift_labels: torch.Tensor,
    chunk_size: int,
    softcap: float | None = None,
    ignore_index: int = IGNORE_INDEX,
    recompute: bool = False,
) -> torch.Tensor:
    """Mean cross-entropy of ``head(hidden)`` against ``shift_labels``, ``chunk_size`` tokens at a time.

    Args:
        head: the LM head module, ``[..., hidden] -> [..., vocab]``.
        hidden: final hidden states ``[batch, seq, hidden]`` (or ``[tokens, hidden]``).
        shift_labels: the target of every position ``[batch, seq]`` (already shifted),
            ``ignore_index`` where there is none.
        chunk_size: tokens whose logits exist at once (forward and backward).
        softcap: the model's ``final_logit_softcapping``: ``logits = cap * tanh(logits / cap)``.
        ignore_index: targets that do not count.
        recompute: ``False``: each chunk's gradients are computed in the forward and handed out by
            the backward (no second matmul with the head; holds the head's gradient, ``[vocab,
            hidden]``, in between). ``True``: each chunk runs under non-reentrant checkpointing and
            its logits are recomputed in the backward (for heads whose parameters exist only inside
            their own forward, as under ZeRO-3).

    Returns:
        A 0-dim fp32 tensor: the sum of the tokens' losses over the number of counted tokens
        (NaN when no token counts, as in transformers).

    Raises:
        ValueError: a ``chunk_size`` below 1, or labels that do not match the hidden states.
    """
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an integer >= 1, got {chunk_size!r}")
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    flat_labels = shift_labels.reshape(-1).to(flat_hidden.device)
    if flat_labels.numel() != flat_hidden.shape[0]:
        raise ValueError(
            f"shift_labels {tuple(shift_labels.shape)} do not match the hidden states {tuple(hidden.shape)}: "
            "one label per position is needed"
        )
    count = (flat_labels != ignore_index).sum()
    params = [p for p in head.parameters() if p.requires_grad]
    pieces = list(zip(flat_hidden.split(chunk_size), flat_labels.split(chunk_size)))
    if not torch.is_grad_enabled() or not (hidden.requires_grad or params):
        return sum(_chunk_loss_sum(head, h, y, softcap, ignore_index) for h, y in pieces) / count
    if recompute:
        # Non-reentrant checkpointing keeps only the chunk's inputs (a view of ``hidden``); the
        # RNG state is kept too, for a head with LoRA dropout.
        return (
            sum(checkpoint(_chunk_loss_sum, head, h, y, softcap, ignore_index, use_reentrant=False) for h, y in pieces)
            / count
        )

    grad_hidden = torch.empty(hidden.shape, dtype=hidden.dtype, device=hidden.device) if hidden.requires_grad else None
    flat_grad = grad_hidden.view(-1, hidden.shape[-1]) if grad_hidden is not None else None
    param_grads: list[torch.Tensor | None] = [None] * len(params)
    total = torch.zeros((), dtype=torch.float32, device=flat_hidden.device)
    start = 0
    for h, y in pieces:
        h = h.detach().requires_grad_(hidden.requires_grad)
        with torch.enable_grad():
            # Scaled before the backward, as the mean reduction of the plain loss is.
            loss = _chunk_loss_sum(head, h, y, softcap, ignore_index) / count
        wrt = ([h] if flat_grad is not None else []) + params
        grads = list(torch.autograd.grad(loss, wrt, allow_unused=True))
        if flat_grad is not None:
            flat_grad[start : start + len(h)] = grads.pop(0)
        for i, grad in enumerate(grads):
            if grad is not None:  # accumulated in fp32 whatever the parameter's dtype
                param_grads[i] = grad.float() if param_grads[i] is None else param_grads[i].add_(grad)
        total += loss.detach()
        start += len(h)
    return _GradientsFromForward.apply(total, [grad_hidden, *param_grads], hidden, *params)


class _GradientsFromForward(torch.autograd.Function):
    """``loss`` itself; its backward hands out the gradients computed in the forward, scaled by
    the incoming gradient (a loss scale, an accumulation divisor), one per tensor in ``inputs``."""

    @staticmethod
    def forward(ctx, loss: torch.Tensor, grads: list[torch.Tensor | None], *inputs: torch.Tensor) -> torch.Tensor:
        ctx.grads = grads
        ctx.dtypes = [tensor.dtype for tensor in inputs]
        return loss.clone()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output: torch.Tensor):
        grads = [None if grad is None else (grad * grad_output).to(dtype) for grad, dtype in zip(ctx.grads, ctx.dtypes)]
        ctx.grads = None
        return (None, None, *grads)


def _chunk_loss_sum(
    head: nn.Module, hidden: torch.Tensor, labels: torch.Tensor, softcap: float | None, ignore_index: int
) -> torch.Tensor:
    logits = _head_logits(head, hidden, softcap).float()
    return nn.functional.cross_entropy(logits, labels, ignore_index=ignore_index, reduction="sum")


def _head_logits(head: nn.Module, hidden: torch.Tensor, softcap: float | None) -> torch.Tensor:
    # The same operations, in the same dtype and order, as the models that soft-cap (Gemma 2/3).
    logits = head(hidden)
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    return logits


def causal_lm_of(model: nn.Module) -> nn.Module:
    """The transformers ``*ForCausalLM`` inside DDP / DeepSpeed / ``torch.compile`` / PEFT wrappers."""
    inner = extract_model_from_parallel(model, keep_fp32_wrapper=True)
    if hasattr(inner, "get_base_model"):  # PEFT
        inner = inner.get_base_model()
    return inner


def causal_lm_loss(
    model: nn.Module,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    shift_labels: torch.Tensor,
    chunk_size: int,
    **model_kwargs: Any,
) -> torch.Tensor:
    """The loss ``model(..., labels=shift_labels, shift_labels=shift_labels).loss`` computes, chunked.

    Args:
        model: a transformers causal LM, possibly wrapped (accelerate, DDP, FSDP2, PEFT).
        input_ids: ``[batch, seq]``.
        position_ids: ``[batch or 1, seq]``, passed to the model unchanged (PoSE positions too).
        shift_labels: ``[batch, seq]``, the target of every position, ``-100`` where none.
        chunk_size: tokens whose logits exist at once; see `chunked_head_loss`.
        **model_kwargs: further model inputs (``attention_mask``...).

    Returns:
        The mean loss, a 0-dim fp32 tensor.

    Raises:
        ValueError: a model whose logits are not its head's output (up to soft-capping), so that
            the chunked loss would differ from the model's own.
    """
    lm = causal_lm_of(model)
    decoder, head = lm.get_decoder(), lm.get_output_embeddings()
    if decoder is lm or head is None:
        raise ValueError(
            f"{type(lm).__name__} has no separate decoder and LM head; the chunked loss needs both "
            "(set loss_chunk_size=0 to use the model's own loss)"
        )
    captured: list[torch.Tensor] = []
    handle = decoder.register_forward_hook(lambda module, args, output: captured.append(output[0]))
    try:
        outputs = model(
            input_ids=input_ids, position_ids=position_ids, use_cache=False, logits_to_keep=1, **model_kwargs
        )
    finally:
        handle.remove()
    hidden = captured[-1]
    softcap = getattr(lm.config, "final_logit_softcapping", None)
    with torch.no_grad():
        ours = _head_logits(head, hidden[:, -1:], softcap).float()
        theirs = outputs.logits.float()
        # non-finite logits are a diverged model, not a different head: the loss says so (NaN)
        finite = bool(torch.isfinite(theirs).all())
        if ours.shape != theirs.shape or (finite and not torch.allclose(ours, theirs, rtol=1e-3, atol=1e-5)):
            raise ValueError(
                f"the logits of {type(lm).__name__} are not its LM head's output (soft-capped by "
                f"final_logit_softcapping={softcap}); a transform the chunked loss does not know would change "
                "the loss: set loss_chunk_size=0 to use the model's own loss"
            )
    # ZeRO-3 frees a partitioned parameter when its module's forward returns (``ds_id`` marks one).
    # Under FSDP2 a backward run inside the forward fires the head's FSDP post-backward hook, which
    # reshards its group (the final norm too): the real backward then reads freed parameters
    # (a segfault with LoRA, tests/train/test_fsdp2.py). Recomputing in the real backward runs the
    # hooks once, in order.
    partitioned = any(hasattr(p, "ds_id") for p in head.parameters()) or any(
        isinstance(module, FSDPModule) for module in (model, lm, head)
    )
    return chunked_head_loss(head, hidden, shift_labels, chunk_size, softcap=softcap, recompute=partitioned)
