"""The training-free methods' adapter: saved checkpoints, loud failure without the plugin, Qwen's DCA field."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch
from models import tiny_model, tokens
from transformers import AutoModelForCausalLM

import hf_posext
from hf_posext.attention.remap import SAVED_ATTENTION


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("method", ["self_extend", "dca"])
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_transformers_own_from_pretrained_reloads_the_method_with_the_requested_kernel(method, impl, tmp_path):
    model = hf_posext.patch_model(tiny_model("qwen2", attn_implementation=impl), method, factor=3)
    ids = tokens(192)
    expected = logits(model, ids)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation=impl)
    assert loaded.config._attn_implementation == f"hf_posext_remap_{impl}"
    assert hf_posext.patch_info(loaded)["method"] == method
    assert torch.equal(logits(loaded, ids), expected)
    default = AutoModelForCausalLM.from_pretrained(tmp_path)  # no kernel asked for: sdpa's wrapper
    assert default.config._attn_implementation == "hf_posext_remap_sdpa"


def test_without_the_plugin_transformers_refuses_the_checkpoint_loudly(tmp_path):
    hf_posext.patch_model(tiny_model("llama"), "dca").save_pretrained(tmp_path)
    code = ("from transformers import AutoModelForCausalLM\n"
            f"AutoModelForCausalLM.from_pretrained({str(tmp_path)!r})\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0
    assert SAVED_ATTENTION in done.stderr


def test_a_qwen_config_with_dual_chunk_attention_config_loads_as_dca(tmp_path):
    """Qwen2.5-1M's form (scaled down): transformers alone would run it as plain RoPE."""
    plain = tiny_model("qwen2", attn_implementation="sdpa", max_positions=256)
    fields = {"chunk_size": 48, "local_size": 8, "original_max_position_embeddings": 64}
    plain.config.dual_chunk_attention_config = fields
    plain.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    info = hf_posext.patch_info(loaded)
    assert (info["method"], info["chunk_size"], info["local_size"]) == ("dca", 48, 8)
    assert loaded.config.max_position_embeddings == 256
    assert loaded.config.dual_chunk_attention_config == fields
    ids = tokens(192)
    expected = logits(hf_posext.patch_model(copy.deepcopy(plain), "dca", chunk_size=48, local_size=8,
                                            original_max_position_embeddings=64), ids)
    assert torch.equal(logits(loaded, ids), expected)
    assert not torch.equal(logits(plain, ids), expected)


@pytest.mark.parametrize(("method", "arch", "vllm"), [
    ("self_extend", "qwen2", "wrong"), ("dca", "qwen2", "right"), ("dca", "llama", "wrong")])
def test_readers_say_who_runs_the_remapped_attention(method, arch, vllm):
    from hf_posext.readers import support

    verdicts = support(hf_posext.patch_model(tiny_model(arch), method, factor=2).config, 128)
    assert verdicts["vLLM"][0] == vllm
    assert verdicts["transformers 5"][0] == "right" and "import hf_posext" in verdicts["transformers 5"][1]
    assert verdicts["llama.cpp"][0] == "wrong"


def test_the_command_line_evaluates_and_patches_both_methods(tmp_path):
    from hf_posext.commands.main import main
    from hf_posext.testing import make_tiny_model

    path = make_tiny_model(tmp_path / "tiny", hidden_size=32, max_position_embeddings=32)
    text = tmp_path / "doc.txt"
    text.write_text("def add(a, b):\n    return a + b\n" * 6)
    out = tmp_path / "ppl"
    assert main(["eval", "ppl", str(path), "--data", str(text), "--lengths", "16,96", "--method",
                 "none,self_extend,dca", "--factor", "3", "--out", str(out), "--no-progress"]) == 0
    import json

    results = json.loads((out / "ppl.json").read_text())["results"]
    assert [results[k]["patch"]["method"] for k in ("self_extend/truncated", "dca/truncated")] == ["self_extend", "dca"]
    assert main(["patch", str(path), str(tmp_path / "se"), "--method", "self_extend", "--set", "group_size=4",
                 "--set", "window_size=8"]) == 0
    assert hf_posext.patch_info(AutoModelForCausalLM.from_pretrained(tmp_path / "se"))["group_size"] == 4


def test_from_config_of_a_dual_chunk_config_leaves_the_callers_config_alone():
    config = tiny_model("qwen2", max_positions=256).config
    config.dual_chunk_attention_config = {"chunk_size": 48, "local_size": 8, "original_max_position_embeddings": 64}
    before = copy.deepcopy(config.to_dict())
    model = AutoModelForCausalLM.from_config(config)
    assert hf_posext.patch_info(model)["method"] == "dca"  # the model runs DCA ...
    assert config.to_dict() == before and model.config is not config  # ... on its own copy of the config
