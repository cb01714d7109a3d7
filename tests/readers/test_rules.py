"""Each reader's own rules (hf_posext.readers, re-written from their sources) applied to saved checkpoints.

vLLM and SGLang read config.json through transformers 5 (AutoConfig); llama.cpp's converter reads
the JSON itself. The expected numbers are the ones a correct reader must derive: the context
factor x L0 and the rope transformers 5 runs.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from huggingface_hub import ModelCard
from tests.helpers.models import tiny_config, tiny_model, tokens
from transformers import AutoConfig, LlamaConfig, Qwen2Config
from scripts.vanilla import vanilla_load_error

import hf_posext
from hf_posext.commands.main import main as cli_main
from hf_posext.publish import patch_checkpoint, model_card
from hf_posext.readers import llamacpp, sglang, support, vllm
from hf_posext.readers.rope import intended_rope
from hf_posext.rope_utils import DYNAMIC_YARN_ROPE_TYPE, ntk_theta

L_ORIG = 64
HEAD_DIM = 32
ABSOLUTE_PATH = re.compile(r"(?:^|[\s`('\"])/\w[\w.-]*/")  # /dir/... at the start of a word


def saved(tmp_path, method, arch="llama", **kwargs):
    """(config as transformers 5 loads it, config.json as a dict) of a checkpoint patched with ``method``."""
    model = hf_posext.patch_model(tiny_model(arch, max_positions=L_ORIG), method, **kwargs)
    model.save_pretrained(tmp_path / method)
    return AutoConfig.from_pretrained(tmp_path / method), json.loads((tmp_path / method / "config.json").read_text())


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("method", ["linear", "ntk", "yarn"])
def test_engines_derive_the_extended_context_and_the_same_rope(tmp_path, arch, method):
    config, raw = saved(tmp_path, method, arch, factor=4)
    intended = intended_rope(config.rope_parameters)
    assert vllm.max_model_len(config) == 4 * L_ORIG
    assert vllm.effective_rope(config) == intended
    assert sglang.context_length(config) == 4 * L_ORIG
    assert sglang.effective_rope(config, HEAD_DIM) == intended
    keys = llamacpp.gguf_rope_keys(raw)
    assert llamacpp.effective_rope(keys) == intended
    expected = {
        "linear": {
            "context_length": L_ORIG,
            "rope.scaling.type": "linear",
            "rope.scaling.factor": 4.0,
            "rope.freq_base": 10000.0,
        },
        "ntk": {"context_length": 4 * L_ORIG, "rope.freq_base": ntk_theta(10000.0, 4.0, HEAD_DIM)},
        "yarn": {
            "context_length": 4 * L_ORIG,
            "rope.scaling.type": "yarn",
            "rope.scaling.factor": 4.0,
            "rope.scaling.original_context_length": L_ORIG,
            "rope.scaling.yarn_beta_fast": 32.0,
            "rope.scaling.yarn_beta_slow": 1.0,
            "rope.freq_base": 10000.0,
        },
    }[method]
    assert keys == expected


def test_legacy_fields_follow_released_checkpoints(tmp_path):
    """vicuna-13b-v1.5-16k (linear: max_position_embeddings stays L0), CodeLlama (raised rope_theta, no
    rope_scaling), Qwen2.5 with YaRN (original_max_position_embeddings in rope_scaling)."""
    linear = saved(tmp_path, "linear", factor=4)[1]
    assert (linear["max_position_embeddings"], linear["rope_theta"]) == (L_ORIG, 10000.0)
    assert linear["rope_scaling"] == {"rope_type": "linear", "factor": 4.0}
    ntk = saved(tmp_path, "ntk", factor=4)[1]
    assert "rope_scaling" not in ntk and ntk["rope_theta"] == pytest.approx(ntk_theta(10000.0, 4.0, HEAD_DIM))
    yarn = saved(tmp_path, "yarn", factor=4)[1]
    assert yarn["rope_scaling"] == {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": L_ORIG,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
    }
    assert yarn["max_position_embeddings"] == 4 * L_ORIG  # SGLang reads it as is when original is set


def test_reader_rules_reproduce_released_checkpoints():
    """What vLLM is known to serve these Hub configs with (their model cards' max_model_len)."""
    vicuna = LlamaConfig(max_position_embeddings=4096, rope_scaling={"type": "linear", "factor": 4.0})
    qwen = Qwen2Config(
        max_position_embeddings=32768,
        rope_theta=1e6,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    )
    llama31 = LlamaConfig(
        max_position_embeddings=131072,
        rope_theta=5e5,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    )
    assert [vllm.max_model_len(c) for c in (vicuna, qwen, llama31)] == [16384, 131072, 131072]
    assert sglang.context_length(vicuna) == 16384 and sglang.context_length(llama31) == 131072


def test_engines_run_dynamic_ntk_as_a_static_rope(tmp_path):
    config, raw = saved(tmp_path, "dynamic_ntk", factor=4)
    assert vllm.max_model_len(config) == sglang.context_length(config) == 4 * L_ORIG
    assert vllm.effective_rope(config) == {"kind": "default", "theta": 10000.0}  # no scaling at all
    fixed = 10000.0 * (4 * 4 - 3) ** (HEAD_DIM / (HEAD_DIM - 2))
    assert sglang.effective_rope(config, HEAD_DIM) == {"kind": "default", "theta": pytest.approx(fixed)}
    assert "rope.scaling.type" not in llamacpp.gguf_rope_keys(raw)
    verdicts = support(config, 4 * L_ORIG)
    # transformers 5 without hf-posext and 4.57 run transformers' whole-sequence dynamic NTK, not the exact cache
    # saved (the reader matrix measures both)
    misread = ["transformers 5 without hf-posext", "transformers 4.57", "vLLM", "SGLang", "llama.cpp"]
    assert [r for r, (status, _) in verdicts.items() if status == "misread"] == misread


@pytest.mark.parametrize("method", ["dynamic_yarn", "alibi"])
def test_engines_refuse_hf_posext_rope_types_naming_the_import(tmp_path, method):
    config, raw = saved(tmp_path, method, **({} if method == "alibi" else {"factor": 4}))
    for rules in (lambda: vllm.effective_rope(config), lambda: sglang.effective_rope(config, HEAD_DIM)):
        with pytest.raises(ValueError, match="Unknown RoPE scaling type .*requires: import hf_posext"):
            rules()
    # vanilla transformers 5 stops at the rope type (dynamic_yarn) or ALiBi's attention name: both name the import
    assert "requires: import hf_posext" in vanilla_load_error(tmp_path / method)


def test_old_rope_type_names_still_load_after_import(tmp_path):
    model = hf_posext.patch_model(tiny_model(max_positions=L_ORIG), "dynamic_yarn", factor=4)
    model.save_pretrained(tmp_path / "ckpt")
    path = tmp_path / "ckpt" / "config.json"
    raw = json.loads(path.read_text())
    for key in ("rope_parameters", "rope_scaling"):
        raw[key]["rope_type"] = "hf_posext_dynamic_yarn"  # as saved before the rename
    path.write_text(json.dumps(raw))
    reloaded = type(model).from_pretrained(tmp_path / "ckpt", attn_implementation="eager").eval()
    assert reloaded.config.rope_parameters["rope_type"] == DYNAMIC_YARN_ROPE_TYPE
    ids = tokens(3 * L_ORIG)
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, model(ids).logits)
    reloaded.save_pretrained(tmp_path / "again")  # a loaded checkpoint saves the legacy fields again
    again = json.loads((tmp_path / "again" / "config.json").read_text())
    assert again["rope_scaling"]["rope_type"] == DYNAMIC_YARN_ROPE_TYPE and again["rope_theta"] == 10000.0


def test_unpatch_removes_the_legacy_fields():
    config = tiny_config(max_positions=L_ORIG)
    before = config.to_dict()
    hf_posext.unpatch_model(hf_posext.patch_model(config, "yarn", factor=4))
    assert config.to_dict() == before


def test_linear_generates_past_max_position_embeddings():
    """max_position_embeddings stays L0 for linear: generate honours an explicit max_new_tokens past it."""
    model = hf_posext.patch_model(tiny_model(max_positions=L_ORIG), "linear", factor=4)
    prompt = tokens(L_ORIG // 2)
    out = model.generate(prompt, max_new_tokens=2 * L_ORIG, min_new_tokens=2 * L_ORIG, do_sample=False)
    assert out.shape[1] == L_ORIG // 2 + 2 * L_ORIG


def test_cli_warns_once_for_dynamic_methods_naming_the_engines(tmp_path, capsys):
    tiny_model(max_positions=L_ORIG).save_pretrained(tmp_path / "base")
    assert (
        cli_main(["patch", str(tmp_path / "base"), str(tmp_path / "dyn"), "--method", "dynamic", "--factor", "4"]) == 0
    )
    err = capsys.readouterr().err
    assert err.count("hf-posext: warning:") == 1
    assert all(name in err for name in ("vLLM", "SGLang", "llama.cpp", "--method ntk"))
    assert cli_main(["patch", str(tmp_path / "base"), str(tmp_path / "yarn"), "--method", "yarn", "--factor", "4"]) == 0
    assert "warning" not in capsys.readouterr().err
    card = (tmp_path / "dyn" / "README.md").read_text()
    assert "| vLLM | **no: runs it wrong** |" in card and "| transformers 4.57 | **no: runs it wrong** |" in card


def test_model_card_names_no_local_path(tmp_path):
    tiny_model(max_positions=L_ORIG).save_pretrained(tmp_path / "base")
    patch_checkpoint(tmp_path / "base", tmp_path / "out", "yarn", factor=4)
    text = (tmp_path / "out" / "README.md").read_text()
    assert str(tmp_path) not in text and ABSOLUTE_PATH.search(text) is None, text
    assert ModelCard.load(tmp_path / "out" / "README.md").data.base_model is None
    # a folder from huggingface_hub's cache, or a config recording its Hub id, names the id
    cached = tmp_path / "hub" / "models--my-org--tiny-base" / "snapshots" / "abc123"
    tiny_model(max_positions=L_ORIG).save_pretrained(cached)
    patch_checkpoint(cached, tmp_path / "from-cache", "linear", factor=2)
    assert ModelCard.load(tmp_path / "from-cache" / "README.md").data.base_model == "my-org/tiny-base"
    # re-patching an hf-posext checkpoint extends the same base model its card names
    patch_checkpoint(tmp_path / "from-cache", tmp_path / "again", "yarn", factor=2)
    assert ModelCard.load(tmp_path / "again" / "README.md").data.base_model == "my-org/tiny-base"
    # a config.json saved by transformers 4.x records the Hub id it was loaded from
    tiny_model(max_positions=L_ORIG).save_pretrained(tmp_path / "base-4x")
    raw = json.loads((tmp_path / "base-4x" / "config.json").read_text())
    (tmp_path / "base-4x" / "config.json").write_text(json.dumps({**raw, "_name_or_path": "my-org/tiny-4x"}))
    patch_checkpoint(tmp_path / "base-4x", tmp_path / "named", "ntk", factor=2)
    assert ModelCard.load(tmp_path / "named" / "README.md").data.base_model == "my-org/tiny-4x"
    config = hf_posext.patch_model(tiny_config(max_positions=L_ORIG), "ntk", factor=2)
    card = model_card(config, base_model=str(tmp_path / "base"))
    assert str(tmp_path) not in str(card) and ABSOLUTE_PATH.search(str(card)) is None and card.data.base_model is None
    assert model_card(config, base_model="my-org/tiny-base").data.base_model == "my-org/tiny-base"


def test_vllm_reads_a_longrope_checkpoint(tmp_path):
    # vLLM get_rope (commit 07b12f1) has a longrope branch (Phi3LongRoPEScaledRotaryEmbedding) for every model
    config, _ = saved(tmp_path, "longrope", factor=4)
    assert vllm.effective_rope(config) == intended_rope(config.rope_parameters)
    assert vllm.max_model_len(config) == 4 * L_ORIG
    assert support(config, 4 * L_ORIG)["vLLM"][0] == "same"


def test_sglang_reads_a_longrope_checkpoint(tmp_path):
    # SGLang get_rope (rotary_embedding/factory.py, commit 108c36c) has a longrope branch
    # (Phi3LongRoPEScaledRotaryEmbedding: the factors as written, short_mscale / long_mscale)
    config, _ = saved(tmp_path, "longrope", factor=4)
    assert sglang.effective_rope(config, HEAD_DIM) == intended_rope(config.rope_parameters)
    assert sglang.context_length(config) == 4 * L_ORIG
    assert support(config, 4 * L_ORIG)["SGLang"][0] == "same"


def test_longrope_per_query_definition_is_named_as_hf_posexts_own(tmp_path, capsys, caplog):
    """factors_by="query" keeps transformers' longrope entry, which every other reader runs with the long
    factors at every position past L_orig: `hf-posext patch` warns naming them, the card says so, and
    patching a model logs it. The default (factors_by="sequence") is what they all compute (llama.cpp's converter
    writes plain RoPE for it, a warning of its own)."""
    tiny_model(max_positions=L_ORIG).save_pretrained(tmp_path / "base")
    patch = ["patch", str(tmp_path / "base"), "--method", "longrope", "--factor", "4"]
    assert cli_main([*patch[:2], str(tmp_path / "seq"), *patch[2:]]) == 0
    err = capsys.readouterr().err
    assert "factors_by" not in err and "vLLM (" not in err
    assert cli_main([*patch[:2], str(tmp_path / "query"), *patch[2:], "--set", "factors_by=query"]) == 0
    err = capsys.readouterr().err
    assert err.count("hf-posext: warning:") == 1
    assert all(name in err for name in ("transformers 4.57", "vLLM", "SGLang", "llama.cpp", "factors_by='query'"))
    config = AutoConfig.from_pretrained(tmp_path / "query")
    verdicts = support(config, 4 * L_ORIG)
    assert verdicts["transformers 5"][0] == "same" and "without it" in verdicts["transformers 5"][1]
    assert {verdicts[r][0] for r in ("transformers 4.57", "vLLM", "SGLang", "llama.cpp")} == {"misread"}
    assert "| vLLM | **no: runs it wrong** |" in (tmp_path / "query" / "README.md").read_text()
    with caplog.at_level("WARNING", logger="hf_posext"):
        hf_posext.patch_model(tiny_model(max_positions=L_ORIG), "longrope", factor=4, factors_by="query")
    assert [r.message for r in caplog.records if "factors_by='query'" in r.message]
