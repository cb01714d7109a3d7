"""A record naming a method this process has not registered: which rope types load as transformers loads them.

The loads themselves (a plugin's checkpoint saved in another interpreter) are in tests/test_loading.py.
"""

from __future__ import annotations

import pytest
from transformers import Gemma3TextConfig, LlamaConfig

from hf_posext.methods.registry import rope_types
from hf_posext.validation.unknown_method import (
    is_native_rope_type,
    refuse_unknown_method,
    rope_types_of,
    unknown_method,
)


@pytest.mark.parametrize("rope_type", ["default", "linear", "dynamic", "yarn", "llama3", "longrope"])
def test_transformers_own_rope_types_are_native(rope_type):
    assert is_native_rope_type(rope_type)


def test_the_rope_types_hf_posext_registers_and_unknown_ones_are_not_native():
    assert rope_types()  # hf-posext's own: their code is the package's, not transformers'
    for rope_type in [*rope_types(), "plugin_own_rope", "", None, 3]:
        assert not is_native_rope_type(rope_type), rope_type


def test_a_registered_name_or_alias_is_not_unknown():
    assert unknown_method({"method": "yarn"}) is None and unknown_method({"method": "pi"}) is None
    assert unknown_method({"method": "plugin_slow"}) == "plugin_slow"
    assert unknown_method(None) is None and unknown_method({"method": 3}) is None  # check_record's to refuse


def test_the_rope_types_of_a_config_one_per_layer_type():
    assert rope_types_of(LlamaConfig(rope_parameters={"rope_type": "linear", "factor": 2.0})) == ["linear"]
    gemma = Gemma3TextConfig(
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        }
    )
    assert sorted(rope_types_of(gemma)) == ["default", "linear"]


def test_an_unknown_method_is_refused_unless_every_rope_type_is_transformers_own():
    refuse_unknown_method("plugin_slow", ["linear", "default"])
    for types in (["linear", "plugin_own_rope"], None):
        with pytest.raises(ValueError, match=r"'plugin_slow'.*import the plugin that registers 'plugin_slow'"):
            refuse_unknown_method("plugin_slow", types)
