"""GGUF to GGUF (``hf-posext patch`` on a ``.gguf``: publish.gguf_patch) on small GGUF files: rope, bytes, bad input.

No llama.cpp needed: what llama.cpp makes of the written rope is tests/gguf/test_rope.py's
reference and tests/gguf/test_export.py's run.
"""

from __future__ import annotations

import pytest
from tests.helpers.gguf_files import L_ORIG, LLAMA3, fields, write_tiny_gguf
from tests.helpers.models import tiny_config

import hf_posext
from hf_posext.commands.main import main as cli_main
from hf_posext.gguf.rope import gguf_rope_for
from hf_posext.gguf.writer import base_config, open_gguf, read_rope
from hf_posext.publish.gguf_patch import patch_gguf

gguf = pytest.importorskip("gguf")
np = pytest.importorskip("numpy")


def test_patch_copies_tensors_and_keys_and_writes_the_rope(tmp_path):
    src = write_tiny_gguf(tmp_path / "tiny.gguf")
    out = patch_gguf(src, tmp_path / "out.gguf", "yarn", factor=4, attention_factor=1.3)
    before, after = open_gguf(src), open_gguf(out)
    assert [(t.name, t.tensor_type, bytes(t.data)) for t in before.tensors] == [
        (t.name, t.tensor_type, bytes(t.data)) for t in after.tensors
    ]
    assert after.tensors[1].tensor_type == gguf.GGMLQuantizationType.Q4_1
    old, new = fields(src), fields(out)
    expected = gguf_rope_for(
        hf_posext.patch_model(tiny_config(max_positions=L_ORIG), "yarn", factor=4, attention_factor=1.3), "llama"
    ).keys()
    assert {k: v for k, v in new.items() if k not in old or old[k] != v} == pytest.approx(
        {f"llama.{k}": v for k, v in expected.items() if old.get(f"llama.{k}") != v}
    )
    assert {k: v for k, v in old.items() if "rope" not in k and "context_length" not in k} == {
        k: v for k, v in new.items() if "rope" not in k and "context_length" not in k
    }


def test_composition_reads_the_files_own_rope_freqs_as_the_hf_rules_do(tmp_path):
    shipped = gguf_rope_for(tiny_config(max_positions=L_ORIG, rope_parameters=LLAMA3), "llama")
    src = write_tiny_gguf(tmp_path / "llama3.gguf", rope_freqs=shipped.rope_freqs)
    assert read_rope(open_gguf(src)).rope_freqs == pytest.approx(shipped.rope_freqs)
    out = patch_gguf(src, tmp_path / "yarn-on-llama3.gguf", "yarn", factor=4)
    hf = hf_posext.patch_model(tiny_config(max_positions=L_ORIG, rope_parameters=LLAMA3), "yarn", factor=4)
    expected = gguf_rope_for(hf, "llama")
    written = read_rope(open_gguf(out))
    assert written.rope_freqs == pytest.approx(expected.rope_freqs, rel=1e-6)
    assert (written.context_length, written.scaling_type) == (4 * L_ORIG, "none")
    assert written.attn_factor == pytest.approx(expected.attn_factor)
    assert len(open_gguf(out).tensors) == 3  # rope_freqs replaced, not added twice


def test_a_yarn_gguf_is_the_base_of_a_further_yarn(tmp_path):
    src = patch_gguf(write_tiny_gguf(tmp_path / "tiny.gguf"), tmp_path / "yarn2.gguf", "yarn", factor=2)
    config = base_config(open_gguf(src))
    assert config.rope_parameters == {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 2.0,
        "original_max_position_embeddings": L_ORIG,
    }
    assert config.max_position_embeddings == 2 * L_ORIG
    out = patch_gguf(src, tmp_path / "yarn2x2.gguf", "yarn", factor=2)
    assert read_rope(open_gguf(out)).context_length == 4 * L_ORIG
    assert read_rope(open_gguf(out)).rope_freqs is not None  # a composition: per-pair divisors


def test_cli_patches_a_gguf_file(tmp_path, capsys):
    src = write_tiny_gguf(tmp_path / "tiny.gguf")
    assert cli_main(["patch", str(src), str(tmp_path / "ntk.gguf"), "--method", "ntk", "--factor", "4"]) == 0
    assert read_rope(open_gguf(tmp_path / "ntk.gguf")).freq_base > 4 * 10000.0


def _bad(tmp_path, call, match):
    listing = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises((ValueError, FileNotFoundError), match=match):
        call()
    assert sorted(p.name for p in tmp_path.iterdir()) == listing  # nothing half-written


def test_bad_inputs_are_refused_and_nothing_is_written(tmp_path):
    src = write_tiny_gguf(tmp_path / "tiny.gguf")
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(src.read_bytes()[:-30])
    _bad(tmp_path, lambda: patch_gguf(truncated, tmp_path / "o.gguf", "yarn", factor=4), "truncated")
    truncated.write_bytes(src.read_bytes()[:200])
    _bad(tmp_path, lambda: patch_gguf(truncated, tmp_path / "o.gguf", "yarn", factor=4), "damaged|truncated")
    (tmp_path / "not.gguf").write_text("hello, I am not a GGUF file")
    _bad(tmp_path, lambda: patch_gguf(tmp_path / "not.gguf", tmp_path / "o.gguf", "yarn", factor=4), "not a GGUF file")
    gemma = write_tiny_gguf(tmp_path / "gemma.gguf", arch="gemma3")
    _bad(tmp_path, lambda: patch_gguf(gemma, tmp_path / "o.gguf", "yarn", factor=4), "architecture 'gemma3'")
    _bad(tmp_path, lambda: patch_gguf(src, src, "yarn", factor=4), "is the source")
    (tmp_path / "exists.gguf").write_bytes(b"keep me")
    _bad(tmp_path, lambda: patch_gguf(src, tmp_path / "exists.gguf", "yarn", factor=4), "exists; pass --overwrite")
    assert (tmp_path / "exists.gguf").read_bytes() == b"keep me"
    _bad(tmp_path, lambda: patch_gguf(src, tmp_path / "o.gguf", "dynamic_yarn", factor=4), "use --method yarn")
    _bad(tmp_path, lambda: patch_gguf(src, tmp_path / "o.gguf", "self_extend"), "--grp-attn-n")
    _bad(tmp_path, lambda: patch_gguf(src, tmp_path / "o.gguf", "string"), "llama.cpp has no STRING")
    _bad(tmp_path, lambda: patch_gguf(src, tmp_path / "o.gguf", "rerope"), "llama.cpp has no ReRoPE")
    _bad(tmp_path, lambda: patch_gguf(tmp_path / "missing.gguf", tmp_path / "o.gguf", "yarn", factor=4), "no GGUF file")
    patch_gguf(src, tmp_path / "exists.gguf", "yarn", factor=4, overwrite=True)
    assert read_rope(open_gguf(tmp_path / "exists.gguf")).scaling_type == "yarn"


@pytest.mark.parametrize(
    ("kind", "factor"), [("linear", 0.5), ("yarn", 0.5), ("linear", -2.0), ("yarn", -2.0), ("linear", float("nan"))]
)
def test_a_files_own_scaling_factor_below_1_is_refused_naming_the_key(tmp_path, capsys, kind, factor):
    src = write_tiny_gguf(tmp_path / "tiny.gguf", **{"rope.scaling.type": kind, "rope.scaling.factor": factor})
    _bad(
        tmp_path,
        lambda: patch_gguf(src, tmp_path / "o.gguf", "yarn", factor=4),
        rf"llama.rope.scaling.factor = {factor!r} .*{kind}.*must be >= 1",
    )
    capsys.readouterr()
    assert cli_main(["patch", str(src), str(tmp_path / "o.gguf"), "--method", "yarn", "--factor", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"llama.rope.scaling.factor = {factor!r}" in err[0], err
    assert not (tmp_path / "o.gguf").exists()


def test_repatching_a_patched_gguf_says_what_it_composes_on_and_reaches(tmp_path, capsys):
    src = write_tiny_gguf(tmp_path / "tiny.gguf")
    assert cli_main(["patch", str(src), str(tmp_path / "yarn2.gguf"), "--method", "yarn", "--factor", "2"]) == 0
    assert "note" not in capsys.readouterr().err  # plain RoPE: nothing to say
    argv = ["patch", str(tmp_path / "yarn2.gguf"), str(tmp_path / "yarn2x2.gguf"), "--method", "yarn", "--factor", "2"]
    assert cli_main(argv) == 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hf-posext: note:"), lines
    assert f"yarn rope scaling (x2, context {2 * L_ORIG})" in lines[0] and f"now reaches {4 * L_ORIG}" in lines[0]
