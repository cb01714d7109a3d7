"""The training-free methods' adapter: saved checkpoints, loud failure without the plugin, Qwen's DCA field."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from tests.helpers.models import tiny_model, tokens
from scripts.vanilla import vanilla_load_errors
from transformers import AutoModelForCausalLM

import hf_posext
from hf_posext.attention.remap import SAVED_ATTENTION
from hf_posext.rope_utils import REMAP_ROPE_TYPE


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


#: Every remapping method (with its defaults from L0), leaky ReRoPE as well.
CASES = [
    ("self_extend", {}),
    ("dca", {}),
    ("string", {}),
    ("rerope", {}),
    ("rerope", {"leak": 16}),
    ("string", {"qk_scale": True}),
    ("rerope", {"log_scale": True}),
]


@pytest.mark.parametrize(("method", "kwargs"), CASES)
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_transformers_own_from_pretrained_reloads_the_method_with_the_requested_kernel(method, kwargs, impl, tmp_path):
    model = hf_posext.patch_model(tiny_model("qwen2", attn_implementation=impl), method, factor=3, **kwargs)
    ids = tokens(192)
    expected = logits(model, ids)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation=impl)
    assert loaded.config._attn_implementation == f"hf_posext_remap_{impl}"
    assert hf_posext.patch_info(loaded)["method"] == method
    assert hf_posext.patched_method(loaded) == hf_posext.patched_method(model)
    assert torch.equal(logits(loaded, ids), expected)
    default = AutoModelForCausalLM.from_pretrained(tmp_path)  # no kernel asked for: sdpa's wrapper
    assert default.config._attn_implementation == "hf_posext_remap_sdpa"


def test_without_the_plugin_transformers_refuses_the_checkpoints_loudly_whatever_kernel_is_asked(tmp_path):
    """The saved attention name is replaced by an explicit kernel; the rope type is the second guard (as ALiBi's)."""
    attempts = []
    for method in sorted({method for method, _ in CASES}):
        factor = {"factor": 2} if method in ("self_extend", "dca") else {}
        hf_posext.patch_model(tiny_model("llama"), method, **factor).save_pretrained(tmp_path / method)
        for kwargs, guard in (
            ({}, SAVED_ATTENTION),
            ({"attn_implementation": "sdpa"}, REMAP_ROPE_TYPE),
            ({"attn_implementation": "eager"}, REMAP_ROPE_TYPE),
        ):
            attempts.append((str(tmp_path / method), kwargs, guard))
    errors = vanilla_load_errors([(folder, kwargs) for folder, kwargs, _ in attempts])
    for (folder, kwargs, guard), error in zip(attempts, errors):
        assert error is not None and guard in error, (folder, kwargs, error)


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
    expected = logits(
        hf_posext.patch_model(
            copy.deepcopy(plain), "dca", chunk_size=48, local_size=8, original_max_position_embeddings=64
        ),
        ids,
    )
    assert torch.equal(logits(loaded, ids), expected)
    assert not torch.equal(logits(plain, ids), expected)


@pytest.mark.parametrize(
    ("method", "arch", "vllm"),
    [
        ("self_extend", "qwen2", "refused"),
        ("dca", "qwen2", "same"),
        ("dca", "llama", "refused"),
        ("string", "llama", "refused"),
        ("rerope", "qwen2", "refused"),
    ],
)
def test_readers_say_who_runs_the_remapped_attention(method, arch, vllm):
    from hf_posext.readers import support

    verdicts = support(hf_posext.patch_model(tiny_model(arch), method, factor=2).config, 128)
    assert verdicts["vLLM"][0] == vllm
    assert verdicts["transformers 5"][0] == "same" and "import hf_posext" in verdicts["transformers 5"][1]
    assert REMAP_ROPE_TYPE in verdicts["transformers 5"][1]
    assert verdicts["transformers 4.57"][0] == "refused" and verdicts["SGLang"][0] == "refused"
    assert verdicts["llama.cpp"][0] == "misread"


def test_the_command_line_evaluates_and_patches_every_remapping_method(tmp_path):
    from hf_posext.commands.main import main
    from hf_posext.testing import make_tiny_model

    path = make_tiny_model(tmp_path / "tiny", hidden_size=32, max_position_embeddings=32)
    text = tmp_path / "doc.txt"
    text.write_text("def add(a, b):\n    return a + b\n" * 6)
    out = tmp_path / "ppl"
    assert (
        main(
            [
                "eval",
                "ppl",
                str(path),
                "--data",
                str(text),
                "--lengths",
                "16,96",
                "--method",
                "none,self_extend,dca,string,rerope",
                "--factor",
                "3",
                "--out",
                str(out),
                "--no-progress",
            ]
        )
        == 0
    )

    results = json.loads((out / "ppl.json").read_text())["results"]
    names = ["self_extend", "dca", "string", "rerope"]
    assert [results[f"{name}/truncated"]["patch"]["method"] for name in names] == names
    assert (
        main(
            [
                "patch",
                str(path),
                str(tmp_path / "se"),
                "--method",
                "self_extend",
                "--set",
                "group_size=4",
                "--set",
                "window_size=8",
            ]
        )
        == 0
    )
    assert hf_posext.patch_info(AutoModelForCausalLM.from_pretrained(tmp_path / "se"))["group_size"] == 4
    assert (
        main(
            ["patch", str(path), str(tmp_path / "leaky"), "--method", "rerope", "--set", "window=4", "--set", "leak=16"]
        )
        == 0
    )
    info = hf_posext.patch_info(AutoModelForCausalLM.from_pretrained(tmp_path / "leaky"))
    assert (info["window"], info["leak"]) == (4, 16.0)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"chunk_size": 0, "local_size": 8}, "dual_chunk_attention_config.chunk_size must be an int >= 2"),
        ({"chunk_size": None, "local_size": 8}, "dual_chunk_attention_config.chunk_size must be an int >= 2"),
        ({"chunk_size": 48.7, "local_size": 8}, "dual_chunk_attention_config.chunk_size must be an int >= 2"),
        ({"chunk_size": 48, "local_size": "8"}, "dual_chunk_attention_config.local_size must be an int >= 1"),
        (
            {"chunk_size": 48, "local_size": 8, "original_max_position_embeddings": 0},
            "dual_chunk_attention_config.original_max_position_embeddings must be an int >= 1",
        ),
    ],
)
def test_a_bad_dual_chunk_attention_config_is_one_error_naming_the_field(tmp_path, capsys, fields, message):
    from hf_posext.commands.main import main

    plain = tiny_model("qwen2", attn_implementation="sdpa", max_positions=256)
    plain.config.dual_chunk_attention_config = fields
    plain.save_pretrained(tmp_path / "ckpt")
    with pytest.raises(ValueError, match=message):
        AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt")
    text = tmp_path / "doc.txt"
    text.write_text("def add(a, b):\n    return a + b\n" * 6)
    capsys.readouterr()
    assert (
        main(
            [
                "eval",
                "ppl",
                str(tmp_path / "ckpt"),
                "--data",
                str(text),
                "--lengths",
                "16",
                "--out",
                str(tmp_path / "out"),
                "--no-progress",
            ]
        )
        == 2
    )
    captured = capsys.readouterr()
    assert message in captured.err and "Traceback" not in captured.err, captured.err
    assert len(captured.err.strip().splitlines()) == 1, captured.err


def test_a_bad_remapped_rope_type_is_refused_naming_the_key():
    config = hf_posext.patch_model(tiny_model("llama"), "self_extend", factor=2).config
    config.rope_parameters = {**config.rope_parameters, "remapped_rope_type": "bogus"}
    with pytest.raises(ValueError, match=r"rope_parameters\['remapped_rope_type'\] must name .* got 'bogus'"):
        config.validate_rope()


def test_from_config_of_a_dual_chunk_config_leaves_the_callers_config_alone():
    config = tiny_model("qwen2", max_positions=256).config
    config.dual_chunk_attention_config = {"chunk_size": 48, "local_size": 8, "original_max_position_embeddings": 64}
    before = copy.deepcopy(config.to_dict())
    model = AutoModelForCausalLM.from_config(config)
    assert hf_posext.patch_info(model)["method"] == "dca"  # the model runs DCA ...
    assert config.to_dict() == before and model.config is not config  # ... on its own copy of the config
