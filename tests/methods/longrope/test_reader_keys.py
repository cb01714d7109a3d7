"""The keys hf-posext writes into ``longrope`` entries for vLLM and SGLang raise no warning once the plugin is loaded.

``short_mscale`` / ``long_mscale`` (read by vLLM's and SGLang's Phi-3 LongRoPE) are unknown to transformers'
own validator, which warned once per config built: eight times for one ``hf-posext demo`` row.
"""

from __future__ import annotations

import logging
import tempfile

import pytest
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

import hf_posext

ROPE_LOGGER = "transformers.modeling_rope_utils"


@pytest.fixture
def rope_warnings():
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger(ROPE_LOGGER)
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


def tiny() -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config)


def test_patching_saving_and_loading_longrope_warns_nothing(rope_warnings):
    model = tiny()
    hf_posext.patch_model(model, method="longrope", factor=4)
    assert {"short_mscale", "long_mscale"} <= set(model.config.rope_parameters)
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        AutoModelForCausalLM.from_pretrained(folder)
    assert [r.getMessage() for r in rope_warnings if "Unrecognized keys" in r.getMessage()] == []


def test_other_unknown_longrope_keys_still_warn(rope_warnings):
    params = {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "short_factor": [1.0] * 4,
        "long_factor": [2.0] * 4,
        "original_max_position_embeddings": 64,
        "short_mscale": 1.0,
        "long_mscale": 1.0,
        "typo_factor": 3.0,
    }
    LlamaConfig(hidden_size=32, num_attention_heads=4, max_position_embeddings=256, rope_parameters=params)
    unknown = [r.getMessage() for r in rope_warnings if "Unrecognized keys" in r.getMessage()]
    assert len(unknown) == 1 and "typo_factor" in unknown[0] and "mscale" not in unknown[0]
