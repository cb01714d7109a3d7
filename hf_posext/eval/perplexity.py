"""Perplexity against context length, in the two modes of the YaRN evaluation: truncated, sliding.

Protocol details (``score_last``, ``end_at``, the same documents at every length, why lengths
run in increasing order): docs/guides/evaluation.md.

    points = truncated_perplexity(model, docs, [2048, 4096, 8192], max_documents=20)
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm.auto import tqdm


@dataclass(frozen=True)
class PerplexityPoint:
    """Perplexity at one context length.

    Attributes:
        length: the context length L (the cut in truncated mode, the window in sliding mode).
        perplexity: exp(nll).
        nll: mean negative log-likelihood per scored token, in nats.
        tokens: how many tokens were scored.
        documents: how many documents were read.
    """

    length: int
    perplexity: float
    nll: float
    tokens: int
    documents: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _check_lengths(lengths: Sequence[int]) -> list[int]:
    if not lengths:
        raise ValueError("lengths must name at least one context length, got an empty list")
    for length in lengths:
        if isinstance(length, bool) or not isinstance(length, int) or length < 2:
            raise ValueError(f"every length must be an int >= 2 (one token of context, one to score), got {length!r}")
    return sorted(set(lengths))


def _as_1d(document: torch.Tensor | Sequence[int]) -> torch.Tensor:
    tensor = torch.as_tensor(document, dtype=torch.long)
    if tensor.dim() != 1:
        raise ValueError(f"each document must be a 1-d sequence of token ids, got shape {tuple(tensor.shape)}")
    return tensor


def _select(documents: Sequence[torch.Tensor], min_tokens: int, max_documents: int | None) -> list[torch.Tensor]:
    if max_documents is not None and (
        isinstance(max_documents, bool) or not isinstance(max_documents, int) or max_documents < 1
    ):
        raise ValueError(f"max_documents must be a positive int or None, got {max_documents!r}")
    long_enough = [d for d in documents if d.numel() >= min_tokens]
    if not long_enough:
        longest = max((d.numel() for d in documents), default=0)
        raise ValueError(
            f"no document has the {min_tokens} tokens this evaluation needs (longest: {longest}); "
            "pass longer or more documents, or shorter lengths"
        )
    return long_enough[:max_documents] if max_documents is not None else long_enough


def _forward_parameters(model: nn.Module) -> frozenset[str]:
    try:
        return frozenset(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return frozenset()


def sequence_nll(model: nn.Module, input_ids: torch.Tensor, n_scored: int) -> torch.Tensor:
    """Summed NLL of the last ``n_scored`` tokens of each row, predicted from everything before them.

    Only ``n_scored + 1`` rows of logits are materialized when the model takes ``logits_to_keep``
    (transformers causal LMs do): fp32 logits of 64k tokens x 128k vocab would need 31 GiB. No KV
    cache is built when the model takes ``use_cache`` (SmolLM2's at 32k tokens: 1.5 GB for nothing).

    Args:
        model: a causal LM returning ``.logits``.
        input_ids: ``[batch, seq]``.
        n_scored: 1 <= n_scored <= seq - 1.

    Returns:
        ``[batch]`` float64 sums, in nats.
    """
    seq = input_ids.shape[-1]
    if not 1 <= n_scored <= seq - 1:
        raise ValueError(f"n_scored must be in [1, {seq - 1}] for a sequence of {seq} tokens, got {n_scored}")
    takes = _forward_parameters(model)
    options = {"use_cache": False} if "use_cache" in takes else {}
    if "logits_to_keep" in takes:
        logits = model(input_ids=input_ids, logits_to_keep=n_scored + 1, **options).logits[:, :-1]
    else:
        logits = model(input_ids=input_ids, **options).logits[:, -n_scored - 1 : -1]
    targets = input_ids[:, -n_scored:]
    # Cross-entropy in fp32 whatever the model dtype: bf16 log-softmax loses ~3 significant digits.
    nll = F.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none")
    return nll.double().sum(dim=-1)


class _Eval:
    """Puts a model in eval mode without gradients, restoring its training flag afterwards."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.was_training = model, model.training
        self.no_grad = torch.inference_mode()

    def __enter__(self) -> torch.device:
        self.model.eval()
        self.no_grad.__enter__()
        return next(self.model.parameters()).device

    def __exit__(self, *exc: Any) -> None:
        self.no_grad.__exit__(*exc)
        self.model.train(self.was_training)


def _point(length: int, nll_sum: float, tokens: int, documents: int) -> PerplexityPoint:
    nll = nll_sum / tokens
    return PerplexityPoint(length=length, perplexity=math.exp(nll), nll=nll, tokens=tokens, documents=documents)


def truncated_perplexity(
    model: nn.Module,
    documents: Sequence[torch.Tensor | Sequence[int]],
    lengths: Sequence[int],
    *,
    score_last: int | None = None,
    end_at: int | None = None,
    same_documents: bool = True,
    max_documents: int | None = None,
    batch_size: int = 1,
    progress: bool = True,
) -> list[PerplexityPoint]:
    """Perplexity of documents cut to each length, one forward pass per cut.

    Args:
        model: a causal LM (``model(input_ids=...).logits``), in any dtype, on any device.
        documents: token ids, ``[seq]`` each (see `hf_posext.data.encode_documents`).
        lengths: the context lengths L to evaluate.
        score_last: score only the last n tokens of each cut (n < min(lengths)); ``None`` scores
            all L - 1 predictable tokens.
        end_at: ``None`` cuts every document's first L tokens (the YaRN protocol); an int E >=
            max(lengths) cuts the L tokens ending at token E instead, so that with ``score_last``
            every length scores the very same tokens and only the amount of context differs
            (documents need E tokens).
        same_documents: use only documents of at least ``max(lengths)`` tokens at every length,
            so columns differ by context only; otherwise each length uses every document long enough.
        max_documents: read at most this many (eligible) documents.
        batch_size: cuts per forward pass (cuts have equal length, so no padding is involved).
        progress: show a tqdm bar.

    Returns:
        One `PerplexityPoint` per length, in increasing length.

    Raises:
        ValueError: a bad length, ``score_last`` or ``batch_size``, or no document long enough.
    """
    lengths = _check_lengths(lengths)
    if score_last is not None and (
        isinstance(score_last, bool) or not isinstance(score_last, int) or not 1 <= score_last < lengths[0]
    ):
        raise ValueError(
            f"score_last must be an int in [1, {lengths[0] - 1}] (below the shortest length) "
            f"or None, got {score_last!r}"
        )
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if end_at is not None and (isinstance(end_at, bool) or not isinstance(end_at, int) or end_at < lengths[-1]):
        raise ValueError(f"end_at must be None or an int >= the longest length {lengths[-1]}, got {end_at!r}")
    docs = [_as_1d(d) for d in documents]

    def needed(length: int) -> int:
        return end_at if end_at is not None else lengths[-1] if same_documents else length

    chosen = {length: _select(docs, needed(length), max_documents) for length in lengths}
    total = sum(math.ceil(len(chosen[length]) / batch_size) for length in lengths)

    def start_of(length: int) -> int:
        return 0 if end_at is None else end_at - length

    points = []
    with _Eval(model) as device, tqdm(total=total, desc="perplexity (truncated)", disable=not progress) as bar:
        for length in lengths:
            n_scored = score_last or length - 1
            nll_sum, group = 0.0, chosen[length]
            for start in range(0, len(group), batch_size):
                cut = slice(start_of(length), start_of(length) + length)
                batch = torch.stack([d[cut] for d in group[start : start + batch_size]]).to(device)
                nll_sum += float(sequence_nll(model, batch, n_scored).sum())
                bar.update(1)
            points.append(_point(length, nll_sum, n_scored * len(group), len(group)))
            bar.set_postfix(L=length, ppl=f"{points[-1].perplexity:.3g}")
    return points


def sliding_windows(n_tokens: int, window: int, stride: int) -> Iterator[tuple[int, int, int]]:
    """The ``(begin, end, n_scored)`` windows covering a document of ``n_tokens`` tokens.

    Window k reads tokens ``[k * stride, end_k)`` with ``end_k = min(k * stride + window, n_tokens)``
    and scores the targets ``[end_{k-1}, end_k)`` (``end_{-1} = 1``: the first token has no
    context), so every token from the second on is scored exactly once.
    """
    if isinstance(stride, bool) or not isinstance(stride, int) or not 1 <= stride < window:
        raise ValueError(
            f"stride must be an int in [1, window - 1 = {window - 1}] (windows must overlap, or the first token "
            f"of each window would be scored without context), got {stride!r}"
        )
    scored_until, begin = 1, 0
    while scored_until < n_tokens:
        end = min(begin + window, n_tokens)
        yield begin, end, end - scored_until
        scored_until, begin = end, begin + stride


def sliding_window_perplexity(
    model: nn.Module,
    documents: Sequence[torch.Tensor | Sequence[int]],
    lengths: Sequence[int],
    stride: int = 256,
    *,
    same_documents: bool = True,
    max_documents: int | None = None,
    document_tokens: int | None = None,
    progress: bool = True,
) -> list[PerplexityPoint]:
    """Perplexity with a sliding window of each length, every token scored exactly once.

    Args:
        model: a causal LM.
        documents: token ids, ``[seq]`` each.
        lengths: the window sizes L.
        stride: how far a window advances, 1 <= stride < min(lengths); every scored token sees at
            least L - stride tokens of context (YaRN: 256).
        same_documents: use only documents of at least ``max(lengths)`` tokens at every length.
        max_documents: read at most this many (eligible) documents.
        document_tokens: cut each document to this many tokens first (>= max(lengths)). ``None``
            cuts to ``max(lengths)``: every window size then scores the very same tokens, and the
            cost stays bounded however long the documents are.
        progress: show a tqdm bar.

    Returns:
        One `PerplexityPoint` per length, in increasing length.

    Raises:
        ValueError: a bad length or stride, or no document long enough.
    """
    lengths = _check_lengths(lengths)
    if isinstance(stride, bool) or not isinstance(stride, int) or not 1 <= stride < lengths[0]:
        raise ValueError(
            f"stride must be an int in [1, {lengths[0] - 1}] (below the shortest window, so that windows overlap "
            f"and every scored token has context), got {stride!r}"
        )
    if document_tokens is not None and (
        isinstance(document_tokens, bool) or not isinstance(document_tokens, int) or document_tokens < lengths[-1]
    ):
        raise ValueError(
            f"document_tokens must be an int >= the longest window {lengths[-1]} or None, got {document_tokens!r}"
        )
    docs = [_as_1d(d)[: document_tokens or lengths[-1]] for d in documents]
    chosen = {length: _select(docs, lengths[-1] if same_documents else length, max_documents) for length in lengths}
    total = sum(len(list(sliding_windows(d.numel(), length, stride))) for length in lengths for d in chosen[length])
    points = []
    with _Eval(model) as device, tqdm(total=total, desc="perplexity (sliding)", disable=not progress) as bar:
        for length in lengths:
            nll_sum, tokens = 0.0, 0
            for doc in chosen[length]:
                for begin, end, n_scored in sliding_windows(doc.numel(), length, stride):
                    nll_sum += float(sequence_nll(model, doc[None, begin:end].to(device), n_scored).sum())
                    tokens += n_scored
                    bar.update(1)
            points.append(_point(length, nll_sum, tokens, len(chosen[length])))
            bar.set_postfix(L=length, ppl=f"{points[-1].perplexity:.3g}")
    return points
