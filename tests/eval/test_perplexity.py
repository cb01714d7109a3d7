"""Perplexity evaluation against hand-written references on tiny real models."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from hf_posext import patch_model, unpatch_model
from hf_posext.eval.perplexity import (
    sequence_nll,
    sliding_window_perplexity,
    sliding_windows,
    truncated_perplexity,
)
from tests.helpers.models import tiny_model, tokens


def _next_token_nll(model, context: torch.Tensor, target: int) -> float:
    """-log p(target | context) from one forward over the context alone (float64 log-softmax)."""
    with torch.no_grad():
        logits = model(input_ids=context[None]).logits[0, -1].double()
    return float(-F.log_softmax(logits, dim=-1)[target])


def _window_begin(t: int, window: int, stride: int) -> int:
    """Start of the first window (begins k * stride, ends k * stride + window) that reaches past token t."""
    k = 0
    while k * stride + window <= t:
        k += 1
    return k * stride


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", max_positions=16)


@pytest.mark.parametrize(("window", "stride"), [(8, 3), (8, 7), (5, 1), (16, 15)])
def test_sliding_window_equals_token_by_token_loop(model, window, stride):
    doc = tokens(23, seed=3)[0]
    total = 0.0
    for t in range(1, doc.numel()):
        begin = _window_begin(t, window, stride)
        total += _next_token_nll(model, doc[begin:t], int(doc[t]))
    (point,) = sliding_window_perplexity(model, [doc], [window], stride, document_tokens=23, progress=False)
    assert point.tokens == doc.numel() - 1
    assert point.nll == pytest.approx(total / (doc.numel() - 1), rel=1e-5)
    assert point.perplexity == pytest.approx(math.exp(total / (doc.numel() - 1)), rel=1e-5)


def test_sliding_window_pools_documents_by_token(model):
    docs = [tokens(20, seed=4)[0], tokens(31, seed=5)[0]]
    sums = []
    for doc in docs:
        (p,) = sliding_window_perplexity(model, [doc], [8], 3, document_tokens=31, progress=False)
        sums.append(p.nll * p.tokens)
    (pooled,) = sliding_window_perplexity(model, docs, [8], 3, document_tokens=31, same_documents=False, progress=False)
    assert pooled.tokens == 19 + 30 and pooled.documents == 2
    assert pooled.nll == pytest.approx(sum(sums) / pooled.tokens, rel=1e-6)


@pytest.mark.parametrize("n_tokens", [2, 7, 8, 9, 40])
@pytest.mark.parametrize(("window", "stride"), [(8, 1), (8, 3), (8, 7)])
def test_sliding_windows_score_every_token_once(n_tokens, window, stride):
    scored = []
    for begin, end, n in sliding_windows(n_tokens, window, stride):
        assert 0 <= begin < end <= n_tokens and end - begin <= window and 1 <= n <= end - begin - (begin == 0)
        for t in range(end - n, end):
            assert t - begin >= min(t, window - stride)  # context never shrinks below window - stride
        scored += range(end - n, end)
    assert scored == list(range(1, n_tokens))


def test_truncated_equals_one_forward_per_cut(model):
    docs = [tokens(40, seed=s)[0] for s in (6, 7, 8)]
    lengths = [10, 20, 40]
    points = truncated_perplexity(model, docs, lengths, progress=False)
    for length, point in zip(lengths, points):
        total = 0.0
        for doc in docs:
            with torch.no_grad():
                logits = model(input_ids=doc[None, :length]).logits[0, :-1].double()
            total += float(F.cross_entropy(logits, doc[1:length], reduction="sum"))
        assert point.tokens == 3 * (length - 1) and point.documents == 3
        assert point.nll == pytest.approx(total / point.tokens, rel=1e-5)


def test_truncated_score_last_and_end_at_score_the_same_tokens(model):
    doc = tokens(40, seed=9)[0]
    points = truncated_perplexity(model, [doc], [8, 16, 32], score_last=6, end_at=36, progress=False)
    for point in points:
        context = doc[36 - point.length : 36]
        expected = sum(
            _next_token_nll(model, context[:i], int(context[i])) for i in range(point.length - 6, point.length)
        )
        assert point.tokens == 6
        assert point.nll == pytest.approx(expected / 6, rel=1e-5)


def test_batching_and_logits_to_keep_do_not_change_results(model):
    docs = [tokens(30, seed=s)[0] for s in range(5)]
    one = truncated_perplexity(model, docs, [12, 30], score_last=5, progress=False)
    batched = truncated_perplexity(model, docs, [12, 30], score_last=5, batch_size=2, progress=False)

    class FullLogits(torch.nn.Module):
        """The same model behind a forward without ``logits_to_keep`` (the fallback path)."""

        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids):
            return self.inner(input_ids=input_ids)

    full = truncated_perplexity(FullLogits(model), docs, [12, 30], score_last=5, progress=False)
    for a, b, c in zip(one, batched, full):
        assert a.nll == pytest.approx(b.nll, rel=1e-5) and a.nll == pytest.approx(c.nll, rel=1e-5)


def test_same_documents_uses_only_documents_long_enough_for_every_length(model):
    docs = [tokens(12, seed=1)[0], tokens(30, seed=2)[0]]
    same = truncated_perplexity(model, docs, [10, 30], progress=False)
    each = truncated_perplexity(model, docs, [10, 30], same_documents=False, progress=False)
    assert [p.documents for p in same] == [1, 1]
    assert [p.documents for p in each] == [2, 1]


def test_patched_model_is_evaluated_with_its_patch_and_mode_is_restored(model):
    doc = tokens(64, seed=11)[0]
    plain = truncated_perplexity(model, [doc], [64], progress=False)[0].nll
    model.train()
    patch_model(model, "yarn", factor=4)
    try:
        patched = truncated_perplexity(model, [doc], [64], progress=False)[0].nll
    finally:
        unpatch_model(model)
    assert model.training
    model.eval()
    assert patched != pytest.approx(plain, rel=1e-4)


def test_sequence_nll_matches_cross_entropy(model):
    ids = tokens(12, batch=2, seed=12)
    with torch.no_grad():
        logits = model(input_ids=ids).logits.double()
    expected = F.cross_entropy(logits[:, 7:-1].transpose(1, 2), ids[:, 8:], reduction="none").sum(-1)
    with torch.no_grad():
        got = sequence_nll(model, ids, 4)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", [None, "dynamic_yarn"])
def test_sequence_nll_builds_no_cache_and_scores_as_a_cached_forward(model, method):
    # dynamic_yarn past the model's 16 positions: its exact-cache attention notes the cache (or its absence)
    ids = tokens(40, batch=2, seed=13)
    caches = []
    hook = model.register_forward_hook(lambda module, args, out: caches.append(out.past_key_values))
    if method:
        patch_model(model, method, factor=4)
    try:
        with torch.no_grad():
            logits = model(input_ids=ids, use_cache=True).logits.double()
            got = sequence_nll(model, ids, 5)
    finally:
        hook.remove()
        if method:
            unpatch_model(model)
    assert caches[0] is not None and caches[1] is None
    expected = F.cross_entropy(logits[:, -6:-1].transpose(1, 2), ids[:, -5:], reduction="none").sum(-1)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lengths": []}, "at least one"),
        ({"lengths": [1]}, "got 1"),
        ({"lengths": [8], "score_last": 8}, "got 8"),
        ({"lengths": [8], "batch_size": 0}, "got 0"),
        ({"lengths": [99]}, "99 tokens"),
        ({"lengths": [8], "end_at": 4}, "got 4"),
        ({"lengths": [8], "max_documents": 0}, "got 0"),
    ],
)
def test_truncated_rejects_bad_arguments(model, kwargs, message):
    with pytest.raises(ValueError, match=message):
        truncated_perplexity(model, [tokens(20)[0]], progress=False, **kwargs)


def test_sliding_rejects_bad_stride(model):
    with pytest.raises(ValueError, match="got 9"):
        sliding_window_perplexity(model, [tokens(20)[0]], [8], 9, progress=False)
    with pytest.raises(ValueError, match="overlap"):
        sliding_window_perplexity(model, [tokens(20)[0]], [8], 8, progress=False)
    with pytest.raises(ValueError, match="1-d"):
        sliding_window_perplexity(model, [tokens(20, batch=2)], [8], 4, progress=False)
