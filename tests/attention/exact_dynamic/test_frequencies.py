"""The frequencies of many lengths at once (attention/exact_dynamic/frequencies.py) against the rope-init functions.

Reference: transformers' ``ROPE_INIT_FUNCTIONS[rope_type](config, device, seq_len=L)``, one call
per length; the batched rows must equal it bit for bit (the cached-decoding step uses the same rows).
"""

from __future__ import annotations

import pytest
import torch
from tests.helpers.models import tiny_model
from transformers import modeling_rope_utils

import hf_posext
from hf_posext.attention.exact_dynamic.frequencies import frequency_rows
from hf_posext.attention.exact_dynamic.forward_plan import STATE_ATTR

pytestmark = pytest.mark.usefixtures("one_thread")


# L_orig, rope_theta, factor, head_dim, partial rotary
SHAPES = ((16, 10_000.0, 4.0, 32, 1.0), (128, 500_000.0, 8.0, 64, 1.0), (100, 1e6, 3.7, 96, 0.5))
CASES = (
    [("dynamic_ntk", *shape, {}) for shape in SHAPES]
    + [("dynamic_yarn", *shape, {}) for shape in SHAPES]
    + [
        ("dynamic_yarn", 64, 10_000.0, 16.0, 32, 1.0, {"beta_fast": 4.0, "beta_slow": 0.5}),
        ("dynamic_yarn", 64, 10_000.0, 2.5, 32, 1.0, {"attention_factor": 1.3}),
    ]
)


@pytest.mark.parametrize("method, original, theta, factor, head_dim, partial, extra", CASES)
def test_rows_equal_the_init_function_bit_for_bit(method, original, theta, factor, head_dim, partial, extra):
    model = tiny_model(max_positions=original, head_dim=head_dim, rope_theta=theta, partial_rotary_factor=partial)
    hf_posext.patch_model(model, method, factor=factor, **extra)
    rope = getattr(model.model.layers[0].self_attn, STATE_ATTR)
    init = modeling_rope_utils.ROPE_INIT_FUNCTIONS[rope.rope_type]
    lengths = list(range(1, int(2 * factor * original) + 3))  # before L_orig, the stretch, past saturation
    rows, multipliers = frequency_rows(rope.config, rope.rope_type, lengths, "cpu")
    assert rows.shape == (len(lengths), rope.rotary_dim // 2) and rows.dtype == torch.float32
    for k, length in enumerate(lengths):
        inv_freq, attention_factor = init(rope.config, "cpu", seq_len=length)
        assert torch.equal(rows[k], inv_freq), length
        assert multipliers[k] == attention_factor, length
    # the per-length accessor and the table the plans use give the same rows
    table, scales = rope.frequency_table(lengths[::7], "cpu")
    assert torch.equal(table, rows[::7]) and scales == multipliers[::7]
    assert torch.equal(rope.frequencies(lengths[-1], "cpu")[0], rows[-1])


def test_unhandled_rope_types_fall_back_to_the_init_function():
    model = tiny_model(max_positions=16)
    hf_posext.patch_model(model, "dynamic_yarn", factor=4)
    rope = getattr(model.model.layers[0].self_attn, STATE_ATTR)
    assert frequency_rows(rope.config, "yarn", [20], "cpu") is None
    rope.config.rope_parameters["base_factors"] = [1.0] * (rope.rotary_dim // 2)  # a composed dynamic YaRN
    assert frequency_rows(rope.config, rope.rope_type, [20], "cpu") is None
    table, scales = rope.frequency_table([20, 40], "cpu")
    for row, scale, length in zip(table, scales, (20, 40), strict=True):
        inv_freq, attention_factor = modeling_rope_utils.ROPE_INIT_FUNCTIONS[rope.rope_type](
            rope.config, "cpu", seq_len=length
        )
        assert torch.equal(row, inv_freq) and scale == attention_factor
