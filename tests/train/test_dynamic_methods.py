"""The recipe trains the dynamic methods (issue 24, item 2), with and without LoRA."""

from __future__ import annotations

import json
import math
import sysconfig
from pathlib import Path

import pytest

from hf_posext.testing import byte_tokenizer, make_tiny_model
from hf_posext.train.config import TrainConfig
from hf_posext.train.loop import train

ORIGINAL_CONTEXT = 16

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("train_dynamic")
    make_tiny_model(
        root / "llama", hidden_size=32, num_heads=2, num_kv_heads=1, max_position_embeddings=ORIGINAL_CONTEXT
    )
    byte_tokenizer(model_max_length=ORIGINAL_CONTEXT).save_pretrained(root / "llama")
    (root / "data.txt").write_text((Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py").read_text())
    return root


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("method", ["dynamic_ntk", "dynamic_yarn"])
def test_the_recipe_trains_a_dynamic_method(assets, tmp_path, method, lora):
    result = train(
        TrainConfig(
            model=str(assets / "llama"),
            method=method,
            factor=2,
            dataset=[str(assets / "data.txt")],
            output_dir=str(tmp_path / "model"),
            max_train_steps=3,
            learning_rate=3e-3,
            warmup_steps=0,
            global_batch_size=2,
            micro_batch_size=2,
            mixed_precision="no",
            cache_dir=str(assets / "cache"),
            lora=lora,
            seed=3,
        )
    )
    assert result.steps == 3 and all(math.isfinite(loss) for loss in result.losses)
    saved = json.loads((Path(result.output_dir) / "config.json").read_text())
    assert saved["hf_posext"]["method"] == method
