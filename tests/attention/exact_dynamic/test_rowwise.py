"""The row-wise path of exact dynamic attention (hf_posext.attention.exact_dynamic.rowwise, .complex_rowwise).

Its split of the channel pairs: the leading pairs whose frequency is the same in every row are
rotated once per key and added as one matmul, the others are rotated per row. References: the
same path with every pair rotated per row, and the kernel path (each row a single-query kernel call).
"""

from __future__ import annotations

import pytest
import torch
from tests.helpers.models import tiny_model

import hf_posext
from hf_posext.attention import exact_dynamic
from hf_posext.attention.exact_dynamic import attention as exact_attention
from hf_posext.attention.exact_dynamic import complex_rowwise
from hf_posext.attention.exact_dynamic import rowwise as exact_rowwise
from hf_posext.attention.exact_dynamic.forward_plan import STATE_ATTR

pytestmark = pytest.mark.usefixtures("one_thread")

L_ORIG = 16


def inputs(left_padded: bool):
    """One attention layer's ``(query, key, value, positions, mask)`` over 3x L_orig tokens, 2 batch rows."""
    generator = torch.Generator().manual_seed(0)
    seq = 3 * L_ORIG
    query = torch.randn(2, 4, seq, 32, generator=generator)
    key, value = (torch.randn(2, 2, seq, 32, generator=generator) for _ in range(2))
    real = torch.ones(2, seq, dtype=torch.bool)
    real[1, :5] = not left_padded
    positions = (real.long().cumsum(-1) - 1).clamp(min=0)
    allowed = torch.ones(seq, seq, dtype=torch.bool).tril()[None] & real[:, None, :]
    mask = torch.zeros(2, 1, seq, seq).masked_fill(~allowed[:, None], torch.finfo(torch.float32).min)
    return query, key, value, positions, mask, real


# (method, extra arguments, pairs kept per 16 rotated pairs): YaRN with beta_fast 1/4 keeps its
# 5 fastest pairs at L_orig 16 (rotary 32), 3 of 8 with half the channels rotated
@pytest.mark.parametrize("partial", (1.0, 0.5))
@pytest.mark.parametrize("left_padded", (False, True))
@pytest.mark.parametrize(
    "method, extra, kept",
    [("dynamic_ntk", {}, {1.0: 1, 0.5: 1}), ("dynamic_yarn", {"beta_fast": 0.25, "beta_slow": 0.1}, {1.0: 5, 0.5: 3})],
)
def test_kept_pairs_split_equals_rotating_every_pair(method, extra, kept, left_padded, partial, monkeypatch):
    model = tiny_model(max_positions=L_ORIG, partial_rotary_factor=partial, attn_implementation="sdpa")
    hf_posext.patch_model(model, method, factor=4, **extra)
    attention = model.model.layers[0].self_attn
    rope = getattr(attention, STATE_ATTR)
    query, key, value, positions, mask, real = inputs(left_padded)

    def attend():
        out, _ = exact_dynamic.exact_dynamic_attention(
            attention, query, key, value, mask, scaling=32**-0.5, position_ids=positions.clone()
        )
        return out[real]

    assert complex_rowwise.kept_pairs(rope.plan(positions, batch=2).rowwise) == kept[partial]
    split = attend()
    monkeypatch.setattr(complex_rowwise, "kept_pairs", lambda rowwise: 0)
    every_pair = attend()
    monkeypatch.setattr(exact_attention, "attend_rowwise", exact_rowwise.attend_rowwise_by_kernel)
    by_kernel = attend()
    torch.testing.assert_close(split, every_pair, rtol=0, atol=1e-6)
    torch.testing.assert_close(split, by_kernel, rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64))  # fp32: the complex path; others: real rotation
def test_one_mask_per_head_is_applied_per_head(dtype, monkeypatch):
    # Doge hands attention one mask per query head ([batch, heads, q, keys]); the batched path must
    # not apply the first head's to all (it did: the kernel path, its reference, reads them all).
    model = tiny_model(max_positions=L_ORIG, attn_implementation="sdpa")
    hf_posext.patch_model(model, "dynamic_ntk", factor=4)
    attention = model.model.layers[0].self_attn
    query, key, value, positions, mask, real = inputs(left_padded=False)
    query, key, value = query.to(dtype), key.to(dtype), value.to(dtype)
    generator = torch.Generator().manual_seed(1)
    dropped = torch.rand(2, 4, *mask.shape[2:], generator=generator) < 0.3  # each head loses other keys
    dropped &= ~torch.eye(mask.shape[2], dtype=torch.bool)  # every row keeps itself
    per_head = mask.to(dtype).expand(-1, 4, -1, -1).masked_fill(dropped, torch.finfo(dtype).min)

    def attend():
        out, _ = exact_dynamic.exact_dynamic_attention(
            attention, query, key, value, per_head, scaling=32**-0.5, position_ids=positions.clone()
        )
        return out

    batched = attend()
    monkeypatch.setattr(exact_attention, "attend_rowwise", exact_rowwise.attend_rowwise_by_kernel)
    torch.testing.assert_close(batched, attend(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64))
def test_a_layer_with_other_kv_heads_in_the_same_forward(dtype, monkeypatch):
    # The layers of one forward share its plan and the tables it keeps per chunk of rows; a layer
    # with fewer KV heads chunks its rows otherwise (the budget counts key elements) and must get
    # its own tables, not another chunking's (it got tables of the wrong number of rows).
    model = tiny_model(max_positions=L_ORIG, attn_implementation="sdpa")
    hf_posext.patch_model(model, "dynamic_yarn", factor=4)
    attention = model.model.layers[0].self_attn
    query, key, value, positions, mask, _ = inputs(left_padded=False)
    query, key, value, mask = query.to(dtype), key.to(dtype), value.to(dtype), mask.to(dtype)
    monkeypatch.setattr(exact_rowwise, "ROWWISE_BUDGET", 4 * key.numel())  # 4 rows per chunk, 8 with one KV head

    def attend(keys, values, position_ids):
        out, _ = exact_dynamic.exact_dynamic_attention(
            attention, query, keys, values, mask, scaling=32**-0.5, position_ids=position_ids
        )
        return out

    attend(key, value, positions)  # the first layer plans the forward
    monkeypatch.setattr(attention, "num_key_value_groups", 4)  # the next layer has one KV head for 4 query heads
    shared = attend(key[:, :1], value[:, :1], positions)
    alone = attend(key[:, :1], value[:, :1], positions.clone())  # a forward of its own
    torch.testing.assert_close(shared, alone, rtol=0, atol=0)


def test_chunks_off_the_cpu_take_the_accelerator_budget():
    # On a GPU each chunk costs dozens of kernel launches: the CPU's cache-sized budget made a
    # 4k-token prompt one row per chunk there (1800x transformers' prefill on an H200). The meta
    # device stands in for the GPU: only the device type decides.
    every_row = torch.ones(1, 1, dtype=torch.bool)
    rowwise = exact_rowwise.RowWise(8, 8 + 4096, torch.zeros(1, 1, 1), torch.zeros(1, 1), every_row)
    shape = (1, 4, 4096, 128)  # 2^21 key elements: the whole CPU budget
    cpu_chunks = list(exact_rowwise._row_chunks(rowwise, torch.empty(shape)))
    gpu_chunks = list(exact_rowwise._row_chunks(rowwise, torch.empty(shape, device="meta")))
    assert len(cpu_chunks) == 4096 and cpu_chunks[0] == (8, 9)
    rows = exact_rowwise.ACCELERATOR_ROWWISE_BUDGET // (4 * 4096 * 128)
    assert rows == 64 and gpu_chunks[0] == (8, 8 + rows) and len(gpu_chunks) == 4096 // rows
    assert [stop - start for start, stop in gpu_chunks] == [rows] * (4096 // rows)


def test_a_row_wise_prefill_off_the_cpu_warns_once(monkeypatch, caplog):
    # No GPU here: the check reads the query's device type, so a CPU query that reports another
    # device type stands in. The warning names the fast alternative.
    model = tiny_model(max_positions=L_ORIG, attn_implementation="sdpa")
    hf_posext.patch_model(model, "dynamic_yarn", factor=4)
    attention = model.model.layers[0].self_attn
    query, key, value, positions, mask, _ = inputs(left_padded=False)

    class OtherDevice(torch.Tensor):
        @property
        def device(self):
            return torch.device("meta")

    def attend():
        exact_dynamic.exact_dynamic_attention(
            attention, query, key, value, mask, scaling=32**-0.5, position_ids=positions.clone()
        )

    monkeypatch.setattr(exact_attention, "attend_rowwise", lambda *args: None)
    with caplog.at_level("WARNING", logger="hf_posext"):
        attend()
        assert not caplog.records  # on the CPU: no warning
        query = query.as_subclass(OtherDevice)
        attend()
        attend()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "exact_cache=False" in messages[0] and "meta" in messages[0]
