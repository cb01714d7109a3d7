"""Every rope type hf-posext registers follows transformers' validation contract (issue 24, item 10).

The checks of transformers 5.x' own ``RopeTest::test_rope_validation`` (its ``utils/test_modeling_rope_utils.py``)
(flat, nested per layer type, nested with the same entry for every layer type), run over the rope types
``import hf_posext`` registers: a type's entry without its required keys raises ``KeyError``, a key
that belongs to another type's parameters raises too (the required ones are still missing), and an
unknown key in an otherwise valid entry is warned about by name.
"""

from __future__ import annotations

import contextlib
import logging

import pytest
from transformers import Gemma3TextConfig, LlamaConfig, modeling_rope_utils

import hf_posext  # noqa: F401  (registers the rope types under test)
from hf_posext.readers.transformers5 import custom_rope_types
from hf_posext.rope_utils import (
    LONGROPE_KEEP_FIRST_ROPE_TYPE,
    NO_ROPE_TYPE,
    PROPORTIONAL_ROPE_TYPE,
    REMAP_ROPE_TYPE,
    REMAPPED_TYPE_KEY,
)

#: transformers' own list: parameters that belong to other rope types than ours.
OTHER_TYPES_PARAMETERS = ("factor", "attention_factor", "beta_fast", "beta_slow", "short_factor", "long_factor")
LAYOUTS = [(True, True), (True, False), (False, False)]  # (nested, same entry for every layer type)


def config_with(rope_parameters, nested, same, **extra):
    """transformers' get_config_with_rope_parameters, with extra config attributes (an hf-posext record)."""
    if nested:
        config = Gemma3TextConfig(**extra)
        config.layer_types = ["full_attention", "sliding_attention"]
        sliding = dict(rope_parameters) if same else {"rope_type": "default", "rope_theta": 10000.0}
        config.rope_parameters = {"full_attention": rope_parameters, "sliding_attention": sliding}
    else:
        config = LlamaConfig(**extra)
        config.layer_types = None
        config.rope_parameters = rope_parameters
    return config


def valid_entry(rope_type):
    """A complete entry of ``rope_type`` and the config attributes it needs, as a patch writes them."""
    if rope_type in (NO_ROPE_TYPE, "hf_posext_none"):
        return {"rope_type": rope_type, "rope_theta": 10000.0}, {"hf_posext": {"method": "alibi"}}
    if rope_type == REMAP_ROPE_TYPE:  # the shipped entry under the remapping's type (plain RoPE here)
        return {"rope_type": rope_type, "rope_theta": 10000.0, REMAPPED_TYPE_KEY: "default"}, {}
    if rope_type == LONGROPE_KEEP_FIRST_ROPE_TYPE:
        return {
            "rope_type": rope_type,
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "short_factor": [1.0] * 64,
            "long_factor": [4.0] * 64,
            "attention_factor": 1.2,
            "keep_first": 4,
        }, {}
    if rope_type == PROPORTIONAL_ROPE_TYPE:  # p-RoPE's divisors, one per pair of head_dim
        return {
            "rope_type": rope_type,
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
            "factors": [4.0] * 32,
            "attention_factor": 1.2,
            "factor": 4.0,
            "original_max_position_embeddings": 64,
        }, {}
    return {"rope_type": rope_type, "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64}, {}


@contextlib.contextmanager
def rope_warnings(caplog):
    """caplog hears each of transformers' rope warnings once: some releases' library logger propagates to the
    root one (where caplog listens) and some (5.25) does not, so it listens on the rope logger alone."""
    rope_logger = logging.getLogger("transformers.modeling_rope_utils")
    propagate = rope_logger.propagate
    rope_logger.addHandler(caplog.handler)
    rope_logger.propagate = False
    try:
        with caplog.at_level(logging.WARNING, logger=rope_logger.name):
            yield
    finally:
        rope_logger.propagate = propagate
        rope_logger.removeHandler(caplog.handler)


def test_every_custom_rope_type_is_registered():
    assert set(custom_rope_types()) <= set(modeling_rope_utils.ROPE_INIT_FUNCTIONS)


@pytest.mark.newest
@pytest.mark.parametrize(("nested", "same"), LAYOUTS)
@pytest.mark.parametrize("rope_type", custom_rope_types())
def test_transformers_rope_validation_rules_hold_for_every_registered_type(rope_type, nested, same, caplog):
    with pytest.raises(KeyError):
        config_with({"rope_type": rope_type, "rope_theta": 10000.0}, nested, same).validate_rope()
    for param in OTHER_TYPES_PARAMETERS:
        with pytest.raises(KeyError):
            config_with({"rope_type": rope_type, "rope_theta": 10000.0, param: True}, nested, same).validate_rope()
    entry, extra = valid_entry(rope_type)
    config = config_with(dict(entry), nested, same, **extra)
    with rope_warnings(caplog):
        caplog.clear()
        config.validate_rope()
        assert not caplog.records, [r.getMessage() for r in caplog.records]
        config = config_with({**entry, "mrope_sections": True}, nested, same, **extra)
        config.validate_rope()
    unknown = [r.getMessage() for r in caplog.records if "mrope_sections" in r.getMessage()]
    assert len(unknown) == (2 if same else 1), [r.getMessage() for r in caplog.records]
