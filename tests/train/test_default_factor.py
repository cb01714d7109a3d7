"""A method that takes no factor gets none by default (issue 24, item 8)."""

from __future__ import annotations

import pytest

from hf_posext.methods import available_methods, method_class
from hf_posext.train.config import DEFAULT_FACTOR, TrainConfig

NO_FACTOR = [name for name in available_methods() if not method_class(name).takes_factor]


def settings(**values):
    return TrainConfig(model="m", output_dir="out", dataset=["d.txt"], **values)


@pytest.mark.parametrize("method", NO_FACTOR)
def test_a_method_without_a_factor_defaults_to_none(method):
    assert settings(method=method).factor == 1


def test_a_method_with_a_factor_keeps_the_recipe_default_and_a_typed_factor_wins():
    assert settings(method="yarn").factor == DEFAULT_FACTOR == 16
    assert settings(method="yarn", factor=4).factor == 4
    with pytest.raises(ValueError, match="factor must be 1"):
        settings(method="alibi", factor=2)  # typed by the user: still refused


def test_the_finetune_flags_give_alibi_no_factor_and_yarn_the_default():
    from hf_posext.commands.finetune import config_from_args

    common = ["--model", "m", "--output-dir", "out", "--dataset", "d.txt"]
    assert config_from_args([*common, "--method", "alibi"]).factor == 1
    assert config_from_args([*common, "--method", "yarn"]).factor == DEFAULT_FACTOR
    assert config_from_args([*common, "--method", "yarn", "--factor", "4"]).factor == 4
