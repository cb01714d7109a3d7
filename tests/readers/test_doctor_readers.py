"""``hf-posext doctor``'s transformers 4.57 verdicts against a real transformers 4.57.6, on released-style configs.

Each config (hf_posext/readers/shipped.py, lengths shrunk so that a tiny model runs past its original
context in seconds) gets random weights under transformers 5; a real 4.57.6 in a subprocess (the cached
venv of transformers4_env.py, which cannot import hf_posext) loads the checkpoint and computes logits.
Same logits (max |diff| <= 1e-4) is ``same``, other logits ``misread``, an exception ``refused``: it must
be what the doctor says from its rules alone.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
from scripts.transformers4_env import transformers4_python
from tests.readers.test_transformers4 import LOAD_WITH_4X
from transformers import AutoConfig, AutoModelForCausalLM

from hf_posext.commands.doctor import diagnose_path
from hf_posext.readers.shipped import shipped_config_json

L0 = 32
#: name -> (shipped config, the changes that shrink it): every scaling starts within the 3 x L0 tokens run.
CASES = {
    "llama3": (
        "Llama 3.1 (`llama3`)",
        {
            "max_position_embeddings": 4 * L0,
            "rope_scaling": {
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": L0,
                "rope_type": "llama3",
            },
        },
    ),
    "qwen2.5-yarn": (
        "Qwen2.5 with YaRN (`yarn`, as its model card adds it)",
        {
            "max_position_embeddings": L0,
            "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": L0, "type": "yarn"},
        },
    ),
    "phi3-longrope": (
        "Phi-3 mini 128k (`longrope`)",
        {"max_position_embeddings": 4 * L0, "original_max_position_embeddings": L0},
    ),
    "vicuna-linear": ("vicuna-13b-v1.5-16k (`linear`)", {"max_position_embeddings": L0}),
    "plain": ("a plain model (no rope fields)", {"max_position_embeddings": 4 * L0}),
    "rope-parameters-only": (
        "YaRN saved by transformers 5 alone (`rope_parameters` only)",
        {
            "max_position_embeddings": 4 * L0,
            "rope_parameters": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": L0,
                "rope_theta": 10000.0,
            },
        },
    ),
}


def _llama_longrope_l0_in_rope_scaling_only():
    rope = {"rope_type": "longrope", "short_factor": [1.0] * 16, "long_factor": [1.0 + i for i in range(16)]}
    config_json = {**shipped_config_json("a plain model (no rope fields)"), "max_position_embeddings": 4 * L0}
    return {**config_json, "rope_scaling": {**rope, "original_max_position_embeddings": L0, "factor": 4.0}}


def _phi3_l0_in_rope_scaling_only():
    config_json = {**shipped_config_json("Phi-3 mini 128k (`longrope`)"), "max_position_embeddings": 4 * L0}
    del config_json["original_max_position_embeddings"]
    config_json["rope_scaling"] = {**config_json["rope_scaling"], "original_max_position_embeddings": L0}
    return config_json


@pytest.mark.slow
@pytest.mark.integration  # pip-installs transformers 4.57 into a cached throwaway venv
def test_doctor_says_what_a_real_transformers_4_57_does(tmp_path):
    python = transformers4_python()
    configs = {name: {**shipped_config_json(shipped), **changes} for name, (shipped, changes) in CASES.items()}
    configs["phi3-l0-in-rope-scaling"] = _phi3_l0_in_rope_scaling_only()
    configs["llama-longrope-l0-in-rope-scaling"] = _llama_longrope_l0_in_rope_scaling_only()
    ids = torch.randint(3, 90, (1, 3 * L0), generator=torch.Generator().manual_seed(0))
    torch.save(ids, tmp_path / "ids.pt")
    expected, folders = {}, []
    for name, config_json in configs.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config_json))
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), attn_implementation="eager")
        model.save_pretrained(folder)
        (folder / "config.json").write_text(json.dumps(config_json))  # the config as released, not as 5 writes it
        with torch.no_grad():
            expected[name] = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager")(ids).logits
        folders.append(str(folder))
    result = subprocess.run(
        [str(python), "-c", LOAD_WITH_4X, str(tmp_path / "ids.pt"), *folders],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = {}
    for name in configs:
        folder = tmp_path / name
        if (folder / "error-4.57.txt").exists():
            seen[name] = "refused"
        else:
            diff = (torch.load(folder / "logits-4.57.pt") - expected[name]).abs().max().item()
            seen[name] = "same" if diff <= 1e-4 else "misread"
    said = {name: diagnose_path(str(tmp_path / name))["readers"]["transformers4"]["verdict"] for name in configs}
    assert said == seen
    assert seen["rope-parameters-only"] == seen["llama-longrope-l0-in-rope-scaling"] == "misread"
    assert seen["phi3-l0-in-rope-scaling"] == "refused"  # Phi3Config wants type, short_factor, long_factor only
