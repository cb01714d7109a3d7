"""``export_gguf``'s outputs and converter checks, with a stand-in converter (no llama.cpp needed).

The stand-in takes the real converter's arguments and writes a tiny GGUF (``general.architecture``
llama, tests/helpers/models.py's attention shape), so that everything around the conversion runs
for real: every output path is checked before the converter is called, both outputs appear
whole or not at all, and no failure (of the converter, or after it) leaves a file behind.
"""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
from pathlib import Path

import pytest
from tests.helpers.models import tiny_model

import hf_posext
from hf_posext.commands.main import main
from hf_posext.gguf import converter as gguf_converter
from hf_posext.gguf import export as gguf_export

pytest.importorskip("gguf")

#: The stand-in converter: the file ``mode`` beside it picks a failure; each call appends its arguments to ``calls``.
STAND_IN = textwrap.dedent(
    """
    import argparse, sys
    from pathlib import Path

    here = Path(__file__).parent
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--outfile", required=True)
    parser.add_argument("--outtype")
    parser.add_argument("--vocab-only", action="store_true")
    args = parser.parse_args()
    with open(here / "calls", "a") as calls:
        calls.write(" ".join(sys.argv[1:]) + "\\n")
    mode = (here / "mode").read_text().strip() if (here / "mode").exists() else "ok"
    if mode == "missing-at-start":
        import hf_posext_test_no_such_module  # noqa: F401
    if mode == "missing-in-conversion" and not args.vocab_only:
        from hf_posext_test_lazy.sub import thing  # noqa: F401
    if mode == "fails" and not args.vocab_only:
        sys.exit("converting blk.0 failed: out of memory")
    if mode == "garbage" and not args.vocab_only:
        Path(args.outfile).write_bytes(b"not a gguf file")
        sys.exit(0)
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(args.outfile, "llama")
    writer.add_context_length(64)
    writer.add_embedding_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_rope_dimension_count(32)
    writer.add_rope_freq_base(10000.0)
    writer.add_tensor("token_embd.weight", np.arange(24, dtype=np.float32).reshape(3, 8))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    """
)


@pytest.fixture
def checkpoint(tmp_path):
    path = tmp_path / "ckpt"
    hf_posext.patch_model(tiny_model(max_positions=64), "yarn", factor=4).save_pretrained(path)
    return path


@pytest.fixture
def stand_in(tmp_path):
    folder = tmp_path / "llama.cpp"
    folder.mkdir()
    (folder / "convert_hf_to_gguf.py").write_text(STAND_IN)
    return folder


def calls(stand_in: Path) -> list[str]:
    return (stand_in / "calls").read_text().splitlines() if (stand_in / "calls").exists() else []


def listing(*folders: Path) -> dict[str, list[str]]:
    return {str(folder): sorted(os.listdir(folder)) if folder.is_dir() else [] for folder in folders}


def export(checkpoint, out, stand_in, **kwargs):
    return gguf_export.export_gguf(checkpoint, out, converter=stand_in / "convert_hf_to_gguf.py", **kwargs)


def test_both_outputs_are_written_and_nothing_else(checkpoint, stand_in, tmp_path):
    out, kept = tmp_path / "out" / "model.gguf", tmp_path / "raw" / "model.raw.gguf"
    assert export(checkpoint, out, stand_in, keep_converted=kept) == out
    assert listing(out.parent, kept.parent) == {str(out.parent): ["model.gguf"], str(kept.parent): ["model.raw.gguf"]}
    # the kept file is the converter's own output: its rope untouched (no rope scaling keys written)
    reader = gguf_export.open_gguf(kept)
    assert "llama.rope.scaling.type" not in reader.fields
    assert gguf_export.open_gguf(out).fields["llama.rope.scaling.type"]
    # the vocabulary check ran first, then the conversion
    first, second = calls(stand_in)
    assert first.endswith("--vocab-only") and "--vocab-only" not in second


def _same_spelling(tmp_path, out):
    (tmp_path / "sub").mkdir()
    return tmp_path / "sub" / ".." / out.name


def _link_to_out(tmp_path, out):
    link = tmp_path / "link.gguf"
    link.symlink_to(out)
    return link


def _hard_link(tmp_path, out):
    out.write_bytes(b"old")
    os.link(out, tmp_path / "hard.gguf")
    return tmp_path / "hard.gguf"


def _non_empty_folder(tmp_path, out):
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "x.txt").write_text("mine")
    return tmp_path / "folder"


def _empty_folder(tmp_path, out):
    (tmp_path / "empty").mkdir()
    return tmp_path / "empty"


def _under_a_file(tmp_path, out):
    (tmp_path / "notes.txt").write_text("mine")
    return tmp_path / "notes.txt" / "raw.gguf"


def _existing_file(tmp_path, out):
    (tmp_path / "raw.gguf").write_text("mine")
    return tmp_path / "raw.gguf"


def _checkpoint_file(tmp_path, out):
    return tmp_path / "ckpt" / "config.json"


@pytest.mark.parametrize(
    ("make", "overwrite", "message"),
    [
        (lambda tmp_path, out: out, False, "is the output file"),
        (_same_spelling, False, "is the output file"),
        (_link_to_out, False, "is the output file"),
        (_hard_link, True, "is the output file"),
        (_non_empty_folder, False, "is an existing folder"),
        (_empty_folder, False, "is an existing folder"),
        (_under_a_file, False, "which is a file, not a folder"),
        (_existing_file, False, "exists; pass --overwrite"),
        (_checkpoint_file, True, "is the source"),
        (lambda tmp_path, out: tmp_path / "ckpt" / "converted.gguf", False, "lies in the checkpoint folder"),
        (lambda tmp_path, out: tmp_path / "ckpt" / "sub" / "converted.gguf", True, "lies in the checkpoint folder"),
    ],
    ids=[
        "dst",
        "dst-by-another-spelling",
        "symlink-to-dst",
        "hard-link-of-dst",
        "non-empty-folder",
        "empty-folder",
        "under-a-file",
        "existing-file",
        "a-checkpoint-file",
        "in-the-checkpoint-folder",
        "under-the-checkpoint-folder",
    ],
)
def test_keep_converted_is_refused_before_the_converter_runs(checkpoint, stand_in, tmp_path, make, overwrite, message):
    out = tmp_path / "out.gguf"
    kept = make(tmp_path, out)
    before = listing(tmp_path, tmp_path / "ckpt", *([kept] if kept.is_dir() else []))
    with pytest.raises(ValueError, match=message) as error:
        export(checkpoint, out, stand_in, keep_converted=kept, overwrite=overwrite)
    assert str(kept) in str(error.value) and "\n" not in str(error.value)
    assert calls(stand_in) == []
    assert listing(tmp_path, tmp_path / "ckpt", *([kept] if kept.is_dir() else [])) == before


@pytest.mark.parametrize("where", ["under-a-file", "a-checkpoint-file"])
def test_the_output_file_is_checked_alike(checkpoint, stand_in, tmp_path, where):
    out = _under_a_file(tmp_path, None) if where == "under-a-file" else checkpoint / "model.safetensors"
    before = listing(tmp_path, checkpoint)
    with pytest.raises(ValueError, match=re.escape(str(out))):
        export(checkpoint, out, stand_in, overwrite=True)
    assert calls(stand_in) == [] and listing(tmp_path, checkpoint) == before


@pytest.mark.parametrize("mode", ["fails", "garbage"], ids=["converter-fails", "fails-after-conversion"])
@pytest.mark.parametrize("keep", [True, False], ids=["keep", "no-keep"])
def test_a_failure_leaves_no_file_behind(checkpoint, stand_in, tmp_path, mode, keep):
    (stand_in / "mode").write_text(mode)
    out = tmp_path / "new" / "out.gguf"  # a folder the export makes: not left behind either
    kept = tmp_path / "raw" / "raw.gguf" if keep else None
    before = listing(tmp_path)
    with pytest.raises((RuntimeError, ValueError)):
        export(checkpoint, out, stand_in, keep_converted=kept)
    assert len(calls(stand_in)) == 2  # it did convert
    assert listing(tmp_path) == before


def test_a_failure_while_keeping_leaves_neither_output(checkpoint, stand_in, tmp_path, monkeypatch):
    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gguf_export.shutil, "move", full_disk)
    before = listing(tmp_path)
    with pytest.raises(OSError, match="No space left"):
        export(checkpoint, tmp_path / "out.gguf", stand_in, keep_converted=tmp_path / "raw" / "raw.gguf")
    assert listing(tmp_path) == before


def test_the_command_line_takes_keep_converted_and_refuses_it_in_one_line(checkpoint, stand_in, tmp_path, capsys):
    out = tmp_path / "out.gguf"
    argv = ["gguf", "export", str(checkpoint), str(out), "--converter", str(stand_in)]
    assert main([*argv, "--keep-converted", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is the output file" in err[0], err
    assert main([*argv, "--keep-converted", str(tmp_path / "raw.gguf")]) == 0
    assert sorted(os.listdir(tmp_path)) == sorted(["ckpt", "llama.cpp", "out.gguf", "raw.gguf"])


@pytest.mark.parametrize(
    ("mode", "module"),
    [("missing-at-start", "hf_posext_test_no_such_module"), ("missing-in-conversion", "hf_posext_test_lazy")],
)
def test_a_module_the_converters_python_lacks_is_one_line_naming_it_and_the_interpreter(
    checkpoint, stand_in, tmp_path, capsys, mode, module
):
    (stand_in / "mode").write_text(mode)
    out = tmp_path / "out.gguf"
    argv = ["gguf", "export", str(checkpoint), str(out), "--converter", str(stand_in), "--python", sys.executable]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert f"imports '{module}" in err[0] and f"which {sys.executable} cannot import" in err[0]
    assert f"{sys.executable} -m pip install {module}" in err[0]
    assert not out.exists() and sorted(os.listdir(tmp_path)) == ["ckpt", "llama.cpp"]
    if mode == "missing-at-start":
        assert len(calls(stand_in)) == 1  # refused at the vocabulary check: nothing was converted


def test_a_converter_python_that_does_not_exist_is_one_line(checkpoint, stand_in, tmp_path, capsys):
    missing = tmp_path / "no-venv" / "bin" / "python"
    argv = ["gguf", "export", str(checkpoint), str(tmp_path / "out.gguf"), "--converter", str(stand_in)]
    assert main([*argv, "--python", str(missing)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"cannot run the converter's Python '{missing}'" in err[0], err
    assert sorted(os.listdir(tmp_path)) == ["ckpt", "llama.cpp"]


def test_a_bad_checkpoint_is_named_before_the_converter_is_looked_for(checkpoint, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("HF_POSEXT_LLAMACPP_CONVERTER", raising=False)
    config = checkpoint / "config.json"
    config.write_text(config.read_text().replace('"factor": 4.0', '"factor": NaN'))
    assert main(["gguf", "export", str(checkpoint), str(tmp_path / "out.gguf")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(config) in err[0] and "['factor'] must be a finite number" in err[0], err


def test_the_cached_converter_is_looked_for_in_the_source_checkouts_cache(monkeypatch):
    monkeypatch.delenv("HF_POSEXT_CACHE", raising=False)
    root = Path(gguf_converter.__file__).resolve().parents[2]
    assert (root / "pyproject.toml").is_file()  # this test runs from a source checkout
    assert gguf_converter.cache_root() == root / ".cache"


def _edit_config(checkpoint: Path, edit) -> None:
    config = json.loads((checkpoint / "config.json").read_text())
    edit(config)
    (checkpoint / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda c: c["rope_scaling"].update(rope_theta=5e5), "rope_scaling.rope_theta"),
        (lambda c: c.update(rope_theta=5e5), "rope_theta"),
        (
            lambda c: [c[key].pop("original_max_position_embeddings") for key in ("rope_parameters", "rope_scaling")],
            "original_max_position_embeddings",
        ),
    ],
    ids=["theta-in-rope-scaling", "top-level-theta", "no-original"],
)
def test_a_config_whose_rope_says_two_models_is_refused_before_the_converter_runs(
    checkpoint, stand_in, tmp_path, edit, field
):
    """The reader matrix measured each as another model in llama.cpp (the converter writes one guess of it)."""
    _edit_config(checkpoint, edit)
    out = tmp_path / "out.gguf"
    with pytest.raises(ValueError, match=rf"config\.json: no GGUF is written .*{re.escape(field)}") as error:
        export(checkpoint, out, stand_in)
    assert "\n" not in str(error.value)
    assert calls(stand_in) == [] and not out.exists()
