"""The recipe trains the dynamic methods (issue 24, item 2), with and without LoRA."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.helpers.finetune import train_config, write_finetune_assets
from hf_posext.train.loop import train

ORIGINAL_CONTEXT = 16

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return write_finetune_assets(
        tmp_path_factory.mktemp("train_dynamic"), context=ORIGINAL_CONTEXT, tokenizer_limit=True
    )


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("method", ["dynamic_ntk", "dynamic_yarn"])
def test_the_recipe_trains_a_dynamic_method(assets, tmp_path, method, lora):
    result = train(
        train_config(assets, tmp_path / "model", method=method, max_train_steps=3, warmup_steps=0, lora=lora, seed=3)
    )
    assert result.steps == 3 and all(math.isfinite(loss) for loss in result.losses)
    saved = json.loads((Path(result.output_dir) / "config.json").read_text())
    assert saved["hf_posext"]["method"] == method
