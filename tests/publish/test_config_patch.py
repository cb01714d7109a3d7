"""Saved patched checkpoints: vanilla transformers reloads the native ones; the CLI writes them."""

from __future__ import annotations

import json

import torch
from tests.helpers.models import tiny_model, tokens
from scripts.vanilla import vanilla_load_error, vanilla_logits

import hf_posext
from hf_posext.commands.main import main as cli_main

L_ORIG = 64

NATIVE = [
    (arch, method)
    for arch in ("llama", "mistral", "qwen2", "qwen3")
    for method in ("linear", "ntk", "dynamic_ntk", "yarn")
]


def test_native_checkpoints_reload_without_the_plugin(tmp_path):
    ids = tokens(3 * L_ORIG)
    models = {}
    for arch, method in NATIVE:
        # exact_cache=False: vanilla transformers reloads dynamic NTK with its own (stale-cache) semantics
        options = {"exact_cache": False} if method == "dynamic_ntk" else {}
        models[tmp_path / f"{arch}-{method}"] = model = hf_posext.patch_model(
            tiny_model(arch, max_positions=L_ORIG), method, factor=4, **options
        )
        model.save_pretrained(tmp_path / f"{arch}-{method}")
    # a fresh interpreter where importing hf_posext is impossible: what a user without the plugin
    # (or vLLM's loader reading config.json) gets
    reloaded = vanilla_logits(list(models), [dict(input_ids=ids)], tmp_path)
    for checkpoint, model in models.items():
        with torch.no_grad():
            assert torch.equal(reloaded[checkpoint][0], model(ids).logits), checkpoint.name
        saved = json.loads((checkpoint / "config.json").read_text())
        assert saved["hf_posext"]["method"] == hf_posext.patch_info(model)["method"]


def test_custom_rope_type_needs_the_plugin_and_says_so(tmp_path):
    model = hf_posext.patch_model(tiny_model(max_positions=L_ORIG), "dynamic_yarn", factor=4)
    model.save_pretrained(tmp_path / "ckpt")
    assert "hf_posext_dynamic_yarn" in vanilla_load_error(tmp_path / "ckpt")
    # with the plugin imported (as here) it reloads identically
    ids = tokens(3 * L_ORIG)
    reloaded = type(model).from_pretrained(tmp_path / "ckpt", attn_implementation="eager").eval()
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, model(ids).logits)


def test_cli_patch_writes_an_extended_checkpoint_with_untouched_weights(tmp_path, capsys):
    base = tiny_model(max_positions=L_ORIG)
    base.save_pretrained(tmp_path / "base")
    code = cli_main(
        [
            "patch",
            str(tmp_path / "base"),
            str(tmp_path / "out"),
            "--method",
            "yarn",
            "--factor",
            "8",
            "--set",
            "beta_fast=64",
        ]
    )
    assert code == 0
    out = tmp_path / "out"
    for weights in (tmp_path / "base").glob("*.safetensors"):
        assert (out / weights.name).read_bytes() == weights.read_bytes()
    config = json.loads((out / "config.json").read_text())
    assert config["rope_parameters"]["rope_type"] == "yarn"
    assert config["rope_parameters"]["beta_fast"] == 64
    assert config["max_position_embeddings"] == 8 * L_ORIG
    card = (out / "README.md").read_text()
    assert card.startswith("---\n") and "hf-posext" in card and "from 64 to 512 tokens" in card
    assert "\n# A llama model with a 512-token context (yarn, factor 8)\n" in card  # a local base is not named
    reloaded = type(base).from_pretrained(out, attn_implementation="eager").eval()
    expected = hf_posext.patch_model(base, "yarn", factor=8, beta_fast=64)
    ids = tokens(4 * L_ORIG)
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, expected(ids).logits)
    assert not list(tmp_path.glob(".out.tmp-*"))  # the temporary folder was renamed into place


def test_cli_reports_bad_input_with_exit_code_2(tmp_path, capsys):
    tiny_model().save_pretrained(tmp_path / "base")
    assert cli_main(["patch", str(tmp_path / "base"), str(tmp_path / "out"), "--method", "magic", "--factor", "2"]) == 2
    assert "unknown method 'magic'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    assert (
        cli_main(["patch", str(tmp_path / "nowhere"), str(tmp_path / "out"), "--method", "yarn", "--factor", "2"]) == 2
    )


def test_cli_lists_every_method_with_its_aliases(capsys):
    assert cli_main(["methods"]) == 0
    header, *rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert header[:2] == ["method", "aliases"]
    assert [row[0] for row in rows] == hf_posext.available_methods()
    aliases = {row[0]: row[1].rstrip(",") for row in rows if row[1] != "-"}  # one alias each today
    assert {alias: name for name, alias in aliases.items()} == hf_posext.method_aliases()
