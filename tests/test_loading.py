"""hf_posext.from_pretrained: saved patched checkpoints come back with their method's surgery.

Real save_pretrained / from_pretrained round trips of tiny models; no Hub.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from tests.helpers.models import tiny_model, tokens
from scripts.vanilla import vanilla_logits
from transformers import AutoModelForCausalLM

import hf_posext
from hf_posext.loading import set_construction_hook

# every method with a surgery, plus one RoPE-only method
CASES = {
    "learned": {"max_length": 48},
    "sinusoidal": {},
    "alibi": {},
    "dynamic_yarn": {"factor": 4},
    "dynamic_ntk": {"factor": 4, "exact_cache": False},
    "yarn": {"factor": 4},
    "self_extend": {"group_size": 4, "window_size": 8},
    "dca": {},
    "string": {"shift": 6, "local_window": 2},
    "rerope": {"window": 4, "leak": 16},
    "longrope": {"factor": 4},
}


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.newest
@pytest.mark.parametrize("method", sorted(CASES))
def test_from_pretrained_reloads_identical_logits(method, tmp_path):
    model = hf_posext.patch_model(tiny_model(max_positions=16, attn_implementation="sdpa"), method, **CASES[method])
    ids = tokens(40, batch=2)
    expected = logits(model, ids)
    model.save_pretrained(tmp_path)
    loaded = hf_posext.from_pretrained(tmp_path, attn_implementation="sdpa")
    assert hf_posext.patch_info(loaded)["method"] == method
    torch.testing.assert_close(logits(loaded, ids), expected, rtol=0, atol=1e-6)


def test_the_auto_style_loader_is_from_pretrained(tmp_path):
    hf_posext.patch_model(tiny_model(max_positions=16), "learned", max_length=48).save_pretrained(tmp_path)
    loaded = hf_posext.AutoPatchedModelForCausalLM.from_pretrained(tmp_path)
    assert hf_posext.patched_method(loaded) == hf_posext.LearnedConfig(
        max_length=48, original_max_position_embeddings=16
    )
    with pytest.raises(TypeError, match="from_pretrained"):
        hf_posext.AutoPatchedModelForCausalLM()


def test_every_surgery_method_is_covered():
    assert {m for m in hf_posext.available_methods() if hf_posext.needs_surgery(m)} <= set(CASES)


@pytest.mark.parametrize("method", ["learned", "alibi", "dynamic_yarn"])
def test_without_the_construction_hook_the_loader_refuses_rather_than_returning_a_wrong_model(method, tmp_path):
    hf_posext.patch_model(tiny_model(max_positions=16), method, **CASES[method]).save_pretrained(tmp_path)
    set_construction_hook(False)
    try:
        with pytest.raises(RuntimeError, match=f"patched with {method!r}"):
            hf_posext.from_pretrained(tmp_path, attn_implementation="sdpa")
    finally:
        set_construction_hook(True)
    assert hf_posext.patch_info(hf_posext.from_pretrained(tmp_path))["method"] == method


def test_an_unpatched_checkpoint_loads_as_transformers_loads_it(tmp_path):
    tiny_model().save_pretrained(tmp_path)
    ids = tokens(10)
    ours, theirs = hf_posext.from_pretrained(tmp_path), AutoModelForCausalLM.from_pretrained(tmp_path)
    assert hf_posext.patch_info(ours)["method"] is None
    assert torch.equal(logits(ours, ids), logits(theirs, ids))


ROOT = Path(__file__).resolve().parents[1]
PLUGIN_IDS = tokens(40, batch=2)

#: Three plugin methods, registered and saved in a fresh interpreter (this one never learns them): two write
#: rope types of transformers' own ("linear", "yarn"), one a rope type of its own (its code is the plugin's).
PLUGINS = textwrap.dedent(
    """
    import sys
    from dataclasses import dataclass

    import hf_posext
    from hf_posext.rope_utils import default_inv_freq, rope_parameters_for, rotary_dim_of
    from tests.helpers.models import tiny_model

    @dataclass(frozen=True)
    class SlowConfig(hf_posext.MethodConfig):
        paper = "none"

        def rope_parameters(self, base):
            return {**base.rope_parameters, "rope_type": "linear", "factor": self.factor}

    @dataclass(frozen=True)
    class PluginYarnConfig(hf_posext.YarnConfig):
        pass

    def own_rope(config, device=None, seq_len=None, layer_type=None):
        params = rope_parameters_for(config, layer_type)
        return default_inv_freq(params["rope_theta"], rotary_dim_of(config, params), device) / params["factor"], 1.0

    @dataclass(frozen=True)
    class OwnTypeConfig(hf_posext.MethodConfig):
        paper = "none"

        def rope_parameters(self, base):
            return {**base.rope_parameters, "rope_type": "plugin_own_rope", "factor": self.factor}

    hf_posext.register_method("plugin_slow", SlowConfig)
    hf_posext.register_method("plugin_yarn", PluginYarnConfig)
    no_check = lambda config, parameters, ignore_keys: None
    hf_posext.register_method(
        "plugin_own", OwnTypeConfig, rope_types={"plugin_own_rope": hf_posext.RopeType(own_rope, no_check)}
    )
    for method in ("plugin_slow", "plugin_yarn", "plugin_own"):
        model = hf_posext.patch_model(tiny_model(max_positions=16), method, factor=4)
        model.save_pretrained(f"{sys.argv[1]}/{method}")
    """
)


@pytest.fixture(scope="module")
def plugin_checkpoints(tmp_path_factory):
    """``{method: checkpoint folder}`` of the :data:`PLUGINS`, saved by an interpreter that registered them, with
    the logits of :data:`PLUGIN_IDS` by vanilla transformers (``vanilla-logits.pt``) for the native ones."""
    folder = tmp_path_factory.mktemp("plugins")
    done = subprocess.run(
        [sys.executable, "-c", PLUGINS, str(folder)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    checkpoints = {method: folder / method for method in ("plugin_slow", "plugin_yarn", "plugin_own")}
    vanilla_logits([checkpoints["plugin_slow"], checkpoints["plugin_yarn"]], [{"input_ids": PLUGIN_IDS}], folder)
    return checkpoints


@pytest.mark.parametrize("loader", ["hf_posext", "auto"])
def test_a_plugin_checkpoint_of_a_native_rope_type_loads_as_transformers_loads_it(plugin_checkpoints, loader):
    """Issue 48 item 7: the plugin is not registered here; its record is kept, transformers' rope applied, a warning."""
    native = ["plugin_slow", "plugin_yarn"]
    assert not set(native) & set(hf_posext.available_methods())
    for method in native:
        load = hf_posext.from_pretrained if loader == "hf_posext" else AutoModelForCausalLM.from_pretrained
        with pytest.warns(UserWarning, match=f"'{method}'.*not registered.*import the plugin"):
            model = load(plugin_checkpoints[method], attn_implementation="eager")
        assert hf_posext.patch_info(model)["method"] == method  # the record stays, for a save to keep
        (reference,) = torch.load(plugin_checkpoints[method] / "vanilla-logits.pt")
        torch.testing.assert_close(logits(model, PLUGIN_IDS), reference, rtol=0, atol=0)


@pytest.mark.parametrize("loader", [hf_posext.from_pretrained, AutoModelForCausalLM.from_pretrained])
def test_a_plugin_checkpoint_of_the_plugins_own_rope_type_is_refused_naming_the_method(plugin_checkpoints, loader):
    with pytest.raises(ValueError, match=r"'plugin_own'.*'plugin_own_rope'.*import the plugin") as refused:
        loader(plugin_checkpoints["plugin_own"])
    assert "config.json" in str(refused.value)


def test_what_needs_a_plugin_method_loaded_without_its_plugin_names_the_import(plugin_checkpoints):
    """The model loads (above); what needs the method's own code (its config, undoing or re-patching it) says what
    to import."""
    with pytest.warns(UserWarning, match="'plugin_slow'"):
        model = hf_posext.from_pretrained(plugin_checkpoints["plugin_slow"])
    for needs_the_method in (
        hf_posext.patched_method,
        hf_posext.unpatch_model,
        lambda model: hf_posext.patch_model(model, "yarn", factor=2, override=True),
    ):
        with pytest.raises(ValueError, match=r"'plugin_slow'.*not registered.*import the plugin that registers"):
            needs_the_method(model)


def test_a_plugin_checkpoint_loaded_without_its_plugin_saves_the_config_it_was_read_from(plugin_checkpoints, tmp_path):
    """The record and the fields for other readers (rope_scaling...) are kept, so the plugin can load the copy."""
    with pytest.warns(UserWarning, match="'plugin_yarn'"):
        model = AutoModelForCausalLM.from_pretrained(plugin_checkpoints["plugin_yarn"])
    model.save_pretrained(tmp_path)
    saved = json.loads((plugin_checkpoints["plugin_yarn"] / "config.json").read_text())
    assert "rope_scaling" in saved and saved["hf_posext"]["method"] == "plugin_yarn"
    assert json.loads((tmp_path / "config.json").read_text()) == saved
