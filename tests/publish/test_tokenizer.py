"""An extended checkpoint's tokenizer does not cut inputs back to the old context."""

from __future__ import annotations

import json

import pytest
from tests.helpers.models import tiny_model
from transformers import AutoTokenizer

from hf_posext.commands.main import main as cli_main
from hf_posext.publish.tokenizer import TOKENIZER_CONFIG, raise_model_max_length
from hf_posext.testing import byte_tokenizer

L_ORIG = 64


def base_checkpoint(folder, model_max_length):
    tiny_model(max_positions=L_ORIG).save_pretrained(folder)
    byte_tokenizer(model_max_length=model_max_length).save_pretrained(folder)
    return folder


def limit(folder):
    return json.loads((folder / TOKENIZER_CONFIG).read_text()).get("model_max_length")


@pytest.mark.parametrize("method", ["yarn", "linear", "ntk", "dynamic_yarn"])
def test_patch_raises_the_tokenizer_limit_to_the_new_context(tmp_path, method):
    base = base_checkpoint(tmp_path / "base", L_ORIG)
    assert cli_main(["patch", str(base), str(tmp_path / "out"), "--method", method, "--factor", "4"]) == 0
    assert limit(tmp_path / "out") == 4 * L_ORIG and limit(base) == L_ORIG  # the source is untouched
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
    # 3 x L0 bytes plus BOS: the old limit would have cut it to L0 tokens.
    assert len(tokenizer("x" * (3 * L_ORIG), truncation=True).input_ids) == 3 * L_ORIG + 1


def test_a_limit_at_or_above_the_context_and_no_limit_are_kept(tmp_path):
    base = base_checkpoint(tmp_path / "big", 10 * L_ORIG)
    assert cli_main(["patch", str(base), str(tmp_path / "out"), "--method", "yarn", "--factor", "4"]) == 0
    assert limit(tmp_path / "out") == 10 * L_ORIG
    unlimited = base_checkpoint(tmp_path / "none", None)
    before = (unlimited / TOKENIZER_CONFIG).read_text()
    assert (
        raise_model_max_length(unlimited, 4 * L_ORIG) is None and (unlimited / TOKENIZER_CONFIG).read_text() == before
    )


def test_only_a_numeric_limit_below_the_context_is_rewritten(tmp_path):
    (tmp_path / TOKENIZER_CONFIG).write_text(json.dumps({"model_max_length": None}))
    assert raise_model_max_length(tmp_path, 256) is None and limit(tmp_path) is None
    (tmp_path / TOKENIZER_CONFIG).write_text(json.dumps({"model_max_length": 128, "other": "kept"}))
    assert raise_model_max_length(tmp_path, 256) == 128
    assert json.loads((tmp_path / TOKENIZER_CONFIG).read_text()) == {"model_max_length": 256, "other": "kept"}
    assert raise_model_max_length(tmp_path, None) is None and raise_model_max_length(tmp_path / "missing", 512) is None


@pytest.mark.parametrize("value", [True, "8192", "lots", -1, 0, float("nan"), [512]])
def test_a_limit_that_is_no_positive_number_is_refused_naming_the_file_and_field(tmp_path, capsys, value):
    """The tokenizer would compare lengths with it (or truncate to it): patch cannot honour it, so it says so."""
    base = base_checkpoint(tmp_path / "base", L_ORIG)
    config = json.loads((base / TOKENIZER_CONFIG).read_text())
    (base / TOKENIZER_CONFIG).write_text(json.dumps({**config, "model_max_length": value}))
    assert cli_main(["patch", str(base), str(tmp_path / "out"), "--method", "yarn", "--factor", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert TOKENIZER_CONFIG in err and "model_max_length" in err and "positive number" in err, err
    assert not (tmp_path / "out").exists()


def test_the_recipe_refuses_such_a_limit_before_training(tmp_path, monkeypatch):
    from hf_posext.train import loop
    from hf_posext.train.config import TrainConfig

    base = base_checkpoint(tmp_path / "base", L_ORIG)
    config = json.loads((base / TOKENIZER_CONFIG).read_text())
    (base / TOKENIZER_CONFIG).write_text(json.dumps({**config, "model_max_length": "lots"}))
    (tmp_path / "data.txt").write_text("hello " * 500)
    trained = []
    monkeypatch.setattr(loop, "forward_loss", lambda *a, **k: trained.append(1))
    with pytest.raises(ValueError, match="model_max_length must be a positive number"):
        loop.train(
            TrainConfig(
                model=str(base),
                dataset=[str(tmp_path / "data.txt")],
                output_dir=str(tmp_path / "out"),
                factor=2,
                max_train_steps=1,
                warmup_steps=0,
                cache_dir=str(tmp_path / "cache"),
            )
        )
    assert trained == [] and not (tmp_path / "out").exists()
