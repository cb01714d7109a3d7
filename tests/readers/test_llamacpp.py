"""llama.cpp's real converter (convert_hf_to_gguf.py from llama-cpp-python 0.3.36's source package)
writes the GGUF rope keys hf_posext.readers.llamacpp predicts, and they are the right ones.

The source package (76 MB) is downloaded once with pip into .cache/ and unpacked
(scripts/llamacpp_env.py; nothing is compiled for this test). Its vocabulary step is skipped:
the tiny byte tokenizer is not one llama.cpp knows, and vocabularies have nothing to do with rope keys.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from scripts.llamacpp_env import llamacpp_source
from tests.helpers.models import tiny_model
from scripts.registry import tiny_model as registry_model

import hf_posext
from hf_posext.readers import llamacpp
from hf_posext.rope_utils import ntk_theta

gguf = pytest.importorskip("gguf")

L_ORIG = 64

# Runs the converter's own main() on each checkpoint, with set_vocab made a no-op.
CONVERT = textwrap.dedent(
    """
    import runpy, sys
    from pathlib import Path
    root = Path(sys.argv[1])
    sys.path[:0] = [str(root), str(root / "gguf-py")]
    import conversion.base, conversion.llama, conversion.qwen
    for cls in (conversion.base.TextModel, conversion.llama.LlamaModel, conversion.qwen.Qwen2Model):
        cls.set_vocab = lambda self: None
    for checkpoint in sys.argv[2:]:
        sys.argv = ["convert_hf_to_gguf.py", checkpoint, "--outfile", checkpoint + ".gguf", "--outtype", "f32"]
        runpy.run_path(str(root / "convert_hf_to_gguf.py"), run_name="__main__")
    """
)


def gguf_keys(path: Path, arch: str) -> dict:
    reader = gguf.GGUFReader(path)
    keys = {}
    for name, field in reader.fields.items():
        if name.startswith(f"{arch}.") and ("rope" in name or "context_length" in name) and "dimension" not in name:
            value = field.contents()
            keys[name[len(arch) + 1 :]] = value if isinstance(value, str) else float(value)
    return keys


@pytest.mark.slow
@pytest.mark.integration  # downloads llama-cpp-python's 76 MB sdist once into .cache/
def test_real_converter_writes_the_predicted_rope_keys(tmp_path):
    root = llamacpp_source()
    cases = {}
    for arch in ("llama", "qwen2"):
        for method in ("linear", "ntk", "dynamic_ntk", "yarn", "dynamic_yarn", "alibi"):
            folder = tmp_path / f"{arch}-{method}"
            factor = {} if method == "alibi" else {"factor": 4}
            hf_posext.patch_model(tiny_model(arch, max_positions=L_ORIG), method, **factor).save_pretrained(folder)
            cases[folder] = (arch, method)
    result = subprocess.run(
        [sys.executable, "-c", CONVERT, str(root), *map(str, cases)], capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stderr[-3000:]
    plain = {"context_length": L_ORIG, "rope.freq_base": 10000.0}  # what a dynamic checkpoint becomes
    expected = {
        "linear": {
            "context_length": L_ORIG,
            "rope.scaling.type": "linear",
            "rope.scaling.factor": 4.0,
            "rope.freq_base": 10000.0,
        },
        "ntk": {"context_length": 4 * L_ORIG, "rope.freq_base": ntk_theta(10000.0, 4.0, 32)},
        "dynamic_ntk": plain,
        "yarn": {
            "context_length": 4 * L_ORIG,
            "rope.scaling.type": "yarn",
            "rope.scaling.factor": 4.0,
            "rope.scaling.original_context_length": L_ORIG,
            "rope.scaling.yarn_beta_fast": 32.0,
            "rope.scaling.yarn_beta_slow": 1.0,
            "rope.freq_base": 10000.0,
        },
        "dynamic_yarn": plain,
        "alibi": plain,
    }
    for folder, (arch, method) in cases.items():
        written = gguf_keys(Path(f"{folder}.gguf"), arch)
        assert written == pytest.approx(expected[method]), (arch, method, written)
        predicted = llamacpp.gguf_rope_keys(json.loads((folder / "config.json").read_text()))
        assert written == pytest.approx(predicted), (arch, method)
    assert "Unknown RoPE type" in result.stderr  # dynamic YaRN, ALiBi: a warning, then plain RoPE
    # a learned position table is a tensor the converter has no name for: it stops
    hf_posext.patch_model(tiny_model(max_positions=L_ORIG), "learned").save_pretrained(tmp_path / "learned")
    result = subprocess.run(
        [sys.executable, "-c", CONVERT, str(root), str(tmp_path / "learned")],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode != 0 and "Can not map tensor 'model.hf_posext_positions.weight'" in result.stderr


# As CONVERT, for the Gemma converters (Gemma 4's inherits Gemma 3's class and overrides set_vocab).
CONVERT_GEMMA = CONVERT.replace(
    "import conversion.base, conversion.llama, conversion.qwen\n",
    "import conversion.base, conversion.gemma\n",
).replace(
    "(conversion.base.TextModel, conversion.llama.LlamaModel, conversion.qwen.Qwen2Model)",
    "(conversion.base.TextModel, conversion.gemma.Gemma3Model, conversion.gemma.Gemma4Model)",
)


def convert_one(root: Path, folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CONVERT_GEMMA, str(root), str(folder)], capture_output=True, text=True, timeout=900
    )


@pytest.mark.slow
@pytest.mark.integration  # llama-cpp-python's sdist, as above
def test_the_converter_on_per_layer_families_is_what_the_rules_say(tmp_path):
    """llamacpp.per_layer_converter's rules, run: Gemma 4's converter asserts proportional (hf-posext's p-RoPE types
    stop it), drops proportional's factor (PI) and writes its base (NTK); Gemma 3's writes the sliding base and no
    sliding scaling."""
    root = llamacpp_source()
    found = {}
    for arch, method, options in (
        ("gemma4_text", "yarn", {}),
        ("gemma4_text", "linear", {}),
        ("gemma4_text", "ntk", {}),
        ("gemma3_text", "yarn", {"layer_types": ["sliding_attention", "full_attention"]}),
    ):
        folder = tmp_path / f"{arch}-{method}"
        model = hf_posext.patch_model(registry_model(arch), method, factor=4, **options)
        model.save_pretrained(folder)
        # Gemma's converter trims the embedding to tokenizer.json's vocabulary (the vocabulary step is skipped)
        vocab = {str(i): i for i in range(model.config.vocab_size)}
        (folder / "tokenizer.json").write_text(json.dumps({"model": {"vocab": vocab}, "added_tokens": []}))
        params = model.config.rope_parameters
        found[(arch, method)] = (
            convert_one(root, folder),
            folder,
            llamacpp.per_layer_converter(arch, params),
            params,
        )
    result, _, (verdict, _), _ = found[("gemma4_text", "yarn")]
    assert verdict == "refused" and result.returncode != 0 and "AssertionError" in result.stderr
    arch = "gemma4"
    result, folder, (verdict, _), _ = found[("gemma4_text", "linear")]
    assert result.returncode == 0, result.stderr[-3000:]
    assert verdict == "misread" and "Unknown RoPE type: proportional" in result.stderr
    assert "rope.scaling.factor" not in gguf_keys(Path(f"{folder}.gguf"), arch)
    result, folder, (verdict, _), params = found[("gemma4_text", "ntk")]
    assert result.returncode == 0, result.stderr[-3000:]
    written = gguf_keys(Path(f"{folder}.gguf"), arch)
    assert verdict == "same" and written["rope.freq_base"] == pytest.approx(params["full_attention"]["rope_theta"])
    assert "rope.scaling.factor" not in written
    result, folder, (verdict, _), params = found[("gemma3_text", "yarn")]
    assert result.returncode == 0, result.stderr[-3000:]
    written = gguf_keys(Path(f"{folder}.gguf"), "gemma3")
    assert verdict == "misread" and written["rope.freq_base_swa"] == params["sliding_attention"]["rope_theta"]
    assert not [key for key in written if key.startswith("rope.scaling") and "swa" in key]
    assert written["rope.scaling.type"] == "yarn"  # the full-attention entry's, for every layer llama.cpp marks full
