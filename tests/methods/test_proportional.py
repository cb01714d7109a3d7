"""Methods on p-RoPE (transformers 5's ``proportional``): Gemma 4 and LFM3, against a reference from the paper.

p-RoPE (Barbero et al. 2024, "Round and Round We Go", arXiv:2410.06205): the first
``int(p * head_dim // 2)`` pairs rotate at full RoPE's frequencies theta^(-2i/head_dim), the others not at all.
A method on p-RoPE is the method on full RoPE at head_dim, the zero pairs staying zero. The reference below is
a plain loop over pairs written from the papers (PI: Chen et al. 2023; NTK: YaRN paper eq. 16; YaRN: eqs. 17-22
with the ramp as its code and transformers compute it), in float64.
"""

from __future__ import annotations

import math

import pytest
import torch
from scripts.registry import L_ORIG, model_class, tiny_config, tiny_model
from scripts.vanilla import vanilla_load_errors, vanilla_logits

import hf_posext
from hf_posext.commands.doctor import diagnose_path
from hf_posext.commands.main import main
from hf_posext.rope_utils import PROPORTIONAL_ROPE_TYPE

pytestmark = pytest.mark.usefixtures("one_thread")

FACTOR = 4
ARCHS = ("gemma4_text", "lfm3")  # p-RoPE on full attention; Gemma 4's full layers have their own head_dim (64 here)
METHODS = ("linear", "ntk", "yarn")


def reference(theta, head_dim, p, method=None, s=1.0, original=L_ORIG, own_factor=1.0):
    """``([head_dim // 2] frequencies, cos/sin multiplier)`` of ``method`` on p-RoPE, one pair at a time."""
    angles = int(p * head_dim // 2)

    def crossing(turns):  # the pair where full RoPE (divided by own_factor) makes `turns` turns over `original`
        return head_dim * math.log(original / (2 * math.pi * turns * own_factor)) / (2 * math.log(theta))

    low, high = max(math.floor(crossing(32.0)), 0), min(math.ceil(crossing(1.0)), head_dim - 1)
    frequencies = []
    for i in range(head_dim // 2):
        if i >= angles:
            frequencies.append(0.0)
            continue
        w = theta ** (-2 * i / head_dim) / own_factor
        if method == "linear":
            w /= s
        elif method == "ntk":
            w = (theta * s ** (head_dim / (head_dim - 2))) ** (-2 * i / head_dim) / own_factor
        elif method == "yarn":
            kept = 1 - min(max((i - low) / (high - low), 0.0), 1.0)
            w = w / s * (1 - kept) + w * kept
        frequencies.append(w)
    attention = 0.1 * math.log(s) + 1 if method == "yarn" else 1.0
    return torch.tensor(frequencies, dtype=torch.float64), attention


def rotary(model):
    return next(module for name, module in model.named_modules() if name.endswith("rotary_emb"))


def full_entry(config):
    return config.rope_parameters["full_attention"]


def head_dim(arch):
    return 64 if arch == "gemma4_text" else 32


def check_frequencies(module, expected, attention):
    inv_freq = module.full_attention_inv_freq.double()
    torch.testing.assert_close(inv_freq, expected, rtol=1e-6, atol=0)
    assert torch.equal(inv_freq == 0, expected == 0)  # the removed pairs stay exactly 0
    assert module.full_attention_attention_scaling == pytest.approx(attention, rel=1e-12)


@pytest.mark.parametrize("arch", ARCHS)
def test_the_reference_is_transformers_own_proportional(arch):
    model = tiny_model(arch)
    entry = full_entry(model.config)
    expected, attention = reference(entry["rope_theta"], head_dim(arch), entry["partial_rotary_factor"])
    assert (expected == 0).sum() > 0  # p < 1: some pairs are removed
    check_frequencies(rotary(model), expected, attention)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("method", METHODS)
def test_each_method_on_p_rope_is_the_method_on_full_rope_at_head_dim(arch, method):
    """Full-attention frequencies and cos/sin multiplier as the reference (<= 1e-6); sliding layers bit for bit."""
    model = tiny_model(arch)
    sliding = rotary(model).sliding_attention_inv_freq.clone()
    entry = full_entry(model.config)
    hf_posext.patch_model(model, method, factor=FACTOR)
    expected, attention = reference(entry["rope_theta"], head_dim(arch), entry["partial_rotary_factor"], method, FACTOR)
    check_frequencies(rotary(model), expected, attention)
    assert torch.equal(rotary(model).sliding_attention_inv_freq, sliding)
    written = full_entry(model.config)["rope_type"]
    assert written == ("proportional" if method in ("linear", "ntk") else PROPORTIONAL_ROPE_TYPE)  # PI, NTK: native
    assert hf_posext.patch_info(model)["layer_types"] == ["full_attention"]
    assert hf_posext.patch_info(model)["context_length"] == FACTOR * L_ORIG


@pytest.mark.parametrize("method", METHODS)
def test_a_method_composes_on_p_ropes_own_factor(method):
    """proportional's own ``factor`` divides every frequency (PI): a method extends the context it reaches."""
    shipped = {"rope_type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": 0.5, "factor": 2.0}
    config = tiny_config("lfm3")
    params = {**config.rope_parameters, "full_attention": shipped}
    model = tiny_model("lfm3", rope_parameters=params)
    hf_posext.patch_model(model, method, factor=FACTOR)
    expected, attention = reference(1e6, 32, 0.5, method, FACTOR, own_factor=2.0)
    check_frequencies(rotary(model), expected, attention)
    if method == "linear":
        assert full_entry(model.config) == {**shipped, "factor": 2.0 * FACTOR}


@pytest.mark.parametrize("arch", ARCHS)
def test_layer_types_extends_the_sliding_layers_too_and_unpatch_restores(arch):
    model = tiny_model(arch)
    before = model.config.to_dict()
    ids = torch.randint(0, 97, (1, 2 * L_ORIG), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(ids).logits
    hf_posext.patch_model(model, "yarn", factor=FACTOR, layer_types=["full_attention", "sliding_attention"])
    assert model.config.rope_parameters["sliding_attention"]["rope_type"] == "yarn"
    assert sorted(hf_posext.patch_info(model)["layer_types"]) == ["full_attention", "sliding_attention"]
    hf_posext.unpatch_model(model)
    assert model.config.to_dict() == before
    with torch.no_grad():
        assert torch.equal(model(ids).logits, logits)


@pytest.mark.newest
def test_gemma4_and_lfm3_read_back_as_one_model(tmp_path):
    """PI and NTK are native (vanilla transformers gives the same logits); YaRN needs the plugin, which vanilla
    transformers refuses naming its rope type, doctor says so, and hf_posext.from_pretrained gives the same logits."""
    ids = torch.randint(0, 97, (1, 2 * L_ORIG), generator=torch.Generator().manual_seed(1))
    models = {}
    for arch in ARCHS:
        for method in METHODS:
            model = hf_posext.patch_model(tiny_model(arch), method, factor=FACTOR)
            model.save_pretrained(tmp_path / f"{arch}-{method}")
            models[tmp_path / f"{arch}-{method}"] = model
    native = [path for path in models if not path.name.endswith("yarn")]
    vanilla = vanilla_logits(native, [dict(input_ids=ids)], tmp_path)
    errors = vanilla_load_errors([(path, {}) for path in models if path not in native])
    with torch.no_grad():
        for path, model in models.items():
            expected = model(ids).logits
            assert torch.isfinite(expected).all()
            report = diagnose_path(str(path))
            assert report["rope"]["extended_layer_types"] == "full_attention"
            verdict = report["readers"]["transformers5"]["verdict"]
            if path in native:
                assert torch.equal(vanilla[path][0], expected), path.name
                assert verdict == "same", path.name
            else:  # vanilla transformers refuses the registered type; with hf_posext imported it is the same model
                assert verdict == "refused", path.name
                assert report["readers"]["transformers5_hf_posext"]["verdict"] == "same", path.name
            reloaded = hf_posext.from_pretrained(path, attn_implementation="eager").eval()
            assert torch.equal(reloaded(ids).logits, expected), path.name
    assert all(PROPORTIONAL_ROPE_TYPE in error for error in errors), errors


@pytest.mark.parametrize(
    "method,kwargs,message",
    [
        ("dynamic_ntk", {"exact_cache": False}, "transformers' dynamic update"),
        ("alibi", {}, "it replaces RoPE"),
    ],
)
def test_a_method_that_cannot_extend_p_rope_is_refused_naming_it(method, kwargs, message):
    model = tiny_model("gemma4_text")
    before = model.config.to_dict()
    factor = None if method == "alibi" else FACTOR
    with pytest.raises(
        ValueError,
        match=rf"{method} cannot extend rope_type='proportional' \(p-RoPE, model_type "
        rf"'gemma4_text', layer type 'full_attention'\): {message}",
    ):
        hf_posext.patch_model(model, method, factor=factor, **kwargs)
    assert model.config.to_dict() == before


def test_the_cli_extends_p_rope_reports_layer_types_and_refuses_in_one_line(tmp_path, capsys):
    tiny_model("gemma4_text").save_pretrained(tmp_path / "base")
    argv = ["patch", str(tmp_path / "base"), str(tmp_path / "out"), "--method", "yarn", "--factor", str(FACTOR)]
    assert main(argv) == 0
    assert "extended layer types: full_attention; kept as they were: sliding_attention" in capsys.readouterr().out
    argv = ["patch", str(tmp_path / "base"), str(tmp_path / "both"), "--method", "ntk", "--factor", str(FACTOR)]
    assert main([*argv, "--layer-types", "full_attention,sliding_attention"]) == 0
    assert "extended layer types: full_attention, sliding_attention; kept as they were: none" in capsys.readouterr().out
    argv = ["patch", str(tmp_path / "base"), str(tmp_path / "no"), "--method", "dynamic_ntk", "--factor", "4"]
    assert main([*argv, "--set", "exact_cache=false"]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "cannot extend rope_type='proportional'" in captured.err
    assert not (tmp_path / "no").exists()


def test_a_flat_p_rope_config_takes_longrope_through_the_registered_type():
    """No model type ships a flat p-RoPE entry, but Llama's rotary reads any rope type: LongRoPE's YaRN-start
    factors on p-RoPE equal YaRN's ramp at head_dim with LongRoPE's temperature."""
    shipped = {"rope_type": "proportional", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    config = tiny_config("llama", rope_parameters=shipped)
    model = model_class(config)(config).eval()
    hf_posext.patch_model(model, "longrope", factor=FACTOR, exact_cache=False)
    expected, _ = reference(10000.0, 32, 0.5, "yarn", FACTOR)
    inv_freq = rotary(model).inv_freq.double()
    torch.testing.assert_close(inv_freq, expected, rtol=1e-6, atol=0)
    assert model.config.rope_parameters["rope_type"] == PROPORTIONAL_ROPE_TYPE
    attention = math.sqrt(1 + math.log(FACTOR) / math.log(L_ORIG))
    assert rotary(model).attention_scaling == pytest.approx(attention, rel=1e-12)
