"""hf-posext reads every GGUF it writes as the model it wrote (issue 57, item 4).

Whole tiny Llama GGUFs (tests/helpers/gguf_files.py, F32 tensors), patched GGUF to GGUF, then loaded by
each of hf-posext's loaders: the logits equal the same patch applied to the source GGUF's model. The
real SmolLM2 GGUF is in tests/gguf/test_source.py.
"""

from __future__ import annotations

import json

import pytest
import torch
from tests.helpers.gguf_files import LLAMA3, write_model_gguf, write_tiny_gguf
from tests.helpers.models import tiny_model, tokens

import hf_posext
from hf_posext.commands.eval import load_model
from hf_posext.commands.main import main
from hf_posext.gguf import SOURCE_RECORD, gguf_checkpoint
from hf_posext.gguf.reading import gguf_rope_parameters
from hf_posext.gguf.rope import gguf_rope_for
from hf_posext.publish.gguf_patch import patch_gguf
from hf_posext.train.config import TrainConfig
from hf_posext.train.loop import load_model_and_tokenizer

pytest.importorskip("gguf")

#: Every patch a GGUF can hold: each GGUF form hf-posext writes (none + theta, linear, yarn, rope_freqs).
PATCHES = [
    ("linear", {}),
    ("ntk", {}),
    ("yarn", {}),
    ("yarn", {"attention_factor": 1.3}),
    ("yarn", {"beta_fast": 16, "beta_slow": 2}),
    ("longrope", {}),
]
IDS = tokens(200)  # 3 x the tiny L0 of 64


@pytest.fixture
def source(tmp_path, monkeypatch):
    """A whole tiny Llama GGUF (plain RoPE, context 64), in a fresh conversion cache."""
    monkeypatch.setenv("HF_POSEXT_CACHE", str(tmp_path / "cache"))
    return write_model_gguf(tmp_path / "src.gguf", tiny_model(tie_word_embeddings=False))


def _logits(model):
    with torch.no_grad():
        return model(IDS).logits


def _reference(src, method, kwargs, factor=4.0):
    model = hf_posext.from_pretrained(src)
    hf_posext.patch_model(model, method, factor=factor, **kwargs)
    return _logits(model)


@pytest.mark.parametrize(("method", "kwargs"), PATCHES, ids=lambda v: str(v) if v else "")
def test_a_patched_gguf_loads_as_the_patch_on_its_source(source, tmp_path, method, kwargs):
    out = patch_gguf(source, tmp_path / "out.gguf", method, factor=4, **kwargs)
    loaded = hf_posext.from_pretrained(out)
    assert loaded.config.rope_parameters != hf_posext.from_pretrained(source).config.rope_parameters
    # the same tensors, dequantized the same way: only the rope differs, and it is read exactly
    torch.testing.assert_close(_logits(loaded), _reference(source, method, kwargs), atol=1e-5, rtol=0)


def test_a_patch_on_a_rope_freqs_gguf_loads_as_the_patch_on_its_source(tmp_path, monkeypatch):
    """A llama3 GGUF (its rope_freqs tensor) is read with it, before and after a yarn patch on it."""
    monkeypatch.setenv("HF_POSEXT_CACHE", str(tmp_path / "cache"))
    model = tiny_model(tie_word_embeddings=False, rope_parameters=dict(LLAMA3))
    rope = gguf_rope_for(model.config, "llama")
    src = write_model_gguf(tmp_path / "llama3.gguf", model, rope_freqs=rope.rope_freqs, **{"rope.scaling.type": "none"})
    torch.testing.assert_close(_logits(hf_posext.from_pretrained(src)), _logits(model), atol=1e-5, rtol=0)
    out = patch_gguf(src, tmp_path / "out.gguf", "yarn", factor=2)
    torch.testing.assert_close(
        _logits(hf_posext.from_pretrained(out)), _reference(src, "yarn", {}, factor=2), atol=1e-5, rtol=0
    )


def test_every_loader_reads_the_patched_rope(source, tmp_path):
    """eval's and finetune's loaders and `hf-posext patch` with the GGUF as its source: the patched model."""
    out = patch_gguf(source, tmp_path / "yarn.gguf", "yarn", factor=4)
    expected = _reference(source, "yarn", {})
    evaluated, _ = load_model(str(out), dtype="float32", device="cpu")
    torch.testing.assert_close(_logits(evaluated), expected, atol=1e-5, rtol=0)
    run = TrainConfig(model=str(out), method="yarn", factor=1.0, dataset=["stdlib"], output_dir=str(tmp_path / "run"))
    trained, _ = load_model_and_tokenizer(run)
    torch.testing.assert_close(_logits(trained), expected, atol=1e-5, rtol=0)
    # patch with the GGUF as source composes on its yarn: linear x2 on yarn x4, as patch_model does in memory
    assert main(["patch", str(out), str(tmp_path / "folder"), "--method", "linear", "--factor", "2"]) == 0
    composed = hf_posext.from_pretrained(out)
    hf_posext.patch_model(composed, "linear", factor=2)
    torch.testing.assert_close(
        _logits(hf_posext.from_pretrained(tmp_path / "folder")), _logits(composed), atol=1e-5, rtol=0
    )
    assert hf_posext.patch_info(composed)["context_length"] == 8 * 64


def test_a_conversion_cached_before_the_rope_was_read_is_converted_again(source, tmp_path):
    out = patch_gguf(source, tmp_path / "yarn.gguf", "yarn", factor=4)
    folder = gguf_checkpoint(out)
    record = json.loads((folder / SOURCE_RECORD).read_text())
    assert record["rope"]["rope_parameters"]["rope_type"] == "yarn"
    config = json.loads((folder / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}  # what the old conversion held
    (folder / "config.json").write_text(json.dumps(config))
    del record["rope"]
    (folder / SOURCE_RECORD).write_text(json.dumps(record))
    assert gguf_checkpoint(out) == folder
    assert json.loads((folder / "config.json").read_text())["rope_parameters"]["rope_type"] == "yarn"


#: Rope keys hf-posext cannot run as one model (beside each, the key the refusal names).
REFUSED = {
    "unknown type": ({"rope.scaling.type": "fancy"}, "rope.scaling.type"),
    "longrope without tensors": ({"rope.scaling.type": "longrope"}, "longrope"),
    "nan base": ({"rope.freq_base": float("nan")}, "llama.rope.freq_base"),
    "negative attn_factor": ({"rope.scaling.attn_factor": -1.0}, "llama.rope.scaling.attn_factor"),
    "ignored beta_fast": (
        {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.yarn_beta_fast": 16.0},
        "llama.rope.scaling.yarn_beta_fast",
    ),
    "ignored yarn_attn_factor": (
        {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.yarn_attn_factor": 1.0},
        "llama.rope.scaling.yarn_attn_factor",
    ),
    "yarn with rope_freqs": (
        {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope_freqs": [1.0] * 16},
        "rope_freqs",
    ),
}


@pytest.mark.parametrize("case", REFUSED)
def test_rope_keys_hf_posext_cannot_run_are_refused_naming_file_and_key(tmp_path, monkeypatch, capsys, case):
    keys, named = REFUSED[case]
    keys = dict(keys)
    freqs = keys.pop("rope_freqs", None)
    file = write_tiny_gguf(tmp_path / "bad.gguf", rope_freqs=freqs, freq_base=keys.pop("rope.freq_base", 1e4), **keys)
    with pytest.raises(ValueError, match=named) as error:
        gguf_rope_parameters(file)
    assert str(file) in str(error.value)
    monkeypatch.setenv("HF_POSEXT_CACHE", str(tmp_path / "cache"))
    assert main(["patch", str(file), str(tmp_path / "out"), "--method", "yarn", "--factor", "2"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and str(file) in lines[0] and named in lines[0]
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


def test_a_plain_gguf_of_another_architecture_loads_as_transformers_reads_it(tmp_path):
    file = write_tiny_gguf(tmp_path / "gpt2.gguf", arch="gpt2")
    assert gguf_rope_parameters(file) is None
    yarn = {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0}
    scaled = write_tiny_gguf(tmp_path / "scaled.gguf", arch="gpt2", **yarn)
    with pytest.raises(ValueError, match=f"{scaled}: general.architecture = 'gpt2' with rope scaling keys"):
        gguf_rope_parameters(scaled)
