"""transformers 4.57 reads hf-posext checkpoints as transformers 5 does, or refuses them with an error.

Checkpoints are written here by transformers 5 + hf-posext and loaded by a real transformers
4.57.x in a subprocess (a cached venv, see transformers4_env.py) that cannot import hf_posext.
"""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest
import torch
from transformers import AutoConfig
from tests.helpers.models import tiny_model, tokens
from scripts.registry import tiny_model as registry_model
from scripts.transformers4_env import transformers4_python

import hf_posext
from hf_posext.readers import transformers4
from hf_posext.rope_utils import DYNAMIC_YARN_ROPE_TYPE, NO_ROPE_TYPE

L_ORIG = 64
NATIVE = ("linear", "ntk", "dynamic_ntk", "yarn", "longrope")
NOT_IN_4X = {"dynamic_yarn": DYNAMIC_YARN_ROPE_TYPE, "alibi": NO_ROPE_TYPE}

LOAD_WITH_4X = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    sys.modules["hf_posext"] = None  # any `import hf_posext` now raises ImportError
    import torch, transformers
    assert transformers.__version__.startswith("4.57."), transformers.__version__
    from transformers import AutoModelForCausalLM
    ids = torch.load(sys.argv[1])
    for checkpoint in map(Path, sys.argv[2:]):
        try:
            model = AutoModelForCausalLM.from_pretrained(checkpoint, attn_implementation="eager").eval()
        except Exception as error:
            (checkpoint / "error-4.57.txt").write_text(f"{type(error).__name__}: {error}")
            continue
        with torch.no_grad():
            torch.save(model(ids).logits, checkpoint / "logits-4.57.pt")
    """
)


@pytest.mark.slow
@pytest.mark.integration  # pip-installs transformers 4.57 into a cached throwaway venv
def test_transformers_4_57_gives_transformers_5_logits_or_refuses(tmp_path):
    python = transformers4_python()
    ids = tokens(3 * L_ORIG)
    expected = {}
    for arch in ("llama", "qwen2"):
        for method in (*NATIVE, *NOT_IN_4X):
            kwargs = {} if method == "alibi" else {"factor": 4}
            if method in ("dynamic_ntk", "longrope"):
                # transformers' own dynamic NTK, which 4.57 and 5 share: frequencies from the whole
                # sequence's length (hf-posext's default exact cache computes them per position); longrope
                # likewise: 4.57's full forward takes the long factors for every position past L_orig
                kwargs["exact_cache"] = False
            model = hf_posext.patch_model(tiny_model(arch, max_positions=L_ORIG), method, **kwargs)
            model.save_pretrained(tmp_path / f"{arch}-{method}")
            with torch.no_grad():
                expected[tmp_path / f"{arch}-{method}"] = model(ids).logits
    torch.save(ids, tmp_path / "ids.pt")
    result = subprocess.run(
        [str(python), "-c", LOAD_WITH_4X, str(tmp_path / "ids.pt"), *map(str, expected)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    for checkpoint, logits in expected.items():
        method = checkpoint.name.split("-", 1)[1]
        if method in NOT_IN_4X:
            assert not (checkpoint / "logits-4.57.pt").exists(), f"4.57 ran {checkpoint.name}"
            error = (checkpoint / "error-4.57.txt").read_text()
            assert NOT_IN_4X[method] in error and "import hf_posext" in error, error
            continue
        assert not (checkpoint / "error-4.57.txt").exists(), (checkpoint / "error-4.57.txt").read_text()
        diff = (torch.load(checkpoint / "logits-4.57.pt") - logits).abs().max().item()
        assert diff <= 1e-5, f"{checkpoint.name}: max |4.57 - 5| = {diff}"


def _saved(model, folder):
    model.save_pretrained(folder)
    return json.loads((folder / "config.json").read_text())


def test_a_gemma3_extended_on_its_full_layers_carries_the_fields_4_57_reads(tmp_path):
    """4.57's Gemma 3 reads rope_theta + rope_scaling (full attention) and rope_local_base_freq (sliding), never
    rope_parameters: a patched Gemma 3 writes them (4.57's logits: the reader matrix, integration lane)."""
    model = hf_posext.patch_model(registry_model("gemma3_text"), "yarn", factor=4)
    saved = _saved(model, tmp_path / "yarn")
    full = saved["rope_parameters"]["full_attention"]
    assert saved["rope_scaling"] == {k: v for k, v in full.items() if k != "rope_theta"}
    assert saved["rope_scaling"]["rope_type"] == "yarn"
    assert saved["rope_theta"] == full["rope_theta"]
    assert saved["rope_local_base_freq"] == saved["rope_parameters"]["sliding_attention"]["rope_theta"]
    # transformers 5 reads the same per-layer parameters with the legacy fields beside them
    assert AutoConfig.from_pretrained(tmp_path / "yarn").rope_parameters == model.config.rope_parameters
    hf_posext.unpatch_model(model)
    assert not {"rope_scaling", "rope_local_base_freq"} & set(_saved(model, tmp_path / "plain"))


def test_a_gemma3_extended_on_its_sliding_layers_too_writes_no_4x_fields(tmp_path):
    """4.57 runs Gemma 3's sliding layers plain: no fields express the scaling there (doctor: misread for 4.57)."""
    both = ["sliding_attention", "full_attention"]
    model = hf_posext.patch_model(registry_model("gemma3_text"), "yarn", factor=4, layer_types=both)
    assert not {"rope_scaling", "rope_theta", "rope_local_base_freq"} & set(_saved(model, tmp_path))


@pytest.mark.integration  # transformers 4.57's side environment
def test_the_per_layer_families_doctor_calls_unknown_to_4_57_are_not_in_it():
    script = (
        "import json, sys; from transformers import CONFIG_MAPPING; "
        "print(json.dumps([m for m in sys.argv[1:] if m in CONFIG_MAPPING]))"
    )
    found = subprocess.run(
        [transformers4_python(), "-c", script, *transformers4.NOT_IN_4X, "gemma3_text"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(found.stdout.strip().splitlines()[-1]) == ["gemma3_text"]  # the control is there
