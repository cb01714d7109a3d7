"""Every config doctor is pointed at gets an answer, never a traceback (issue 57, item 3).

The answer is one line naming the file and the field (exit 2), or a report listing the damaged field as an
error, in which no reader is ``same``: a reader given a damaged value runs another model or fails.
"""

from __future__ import annotations

import json

import pytest
from tests.helpers.gguf_files import write_tiny_gguf

from hf_posext.commands.main import main

TINY = {
    "model_type": "llama",
    "vocab_size": 97,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 256,
}
LONGROPE = {"rope_type": "longrope", "original_max_position_embeddings": 64, "factor": 4.0, "rope_theta": 1e4}


def rope(**params):
    return {**TINY, "rope_parameters": {"rope_theta": 10000.0, **params}}


#: name -> (config.json, the field the answer must name)
DAMAGED = {
    "factor inf": (rope(rope_type="linear", factor=float("inf")), "rope_parameters.factor"),
    "factor NaN": (rope(rope_type="linear", factor=float("nan")), "rope_parameters.factor"),
    "factor string": (rope(rope_type="linear", factor="4"), "rope_parameters.factor"),
    "factor negative": (rope(rope_type="yarn", factor=-2.0, original_max_position_embeddings=64), "factor"),
    "theta NaN": (rope(rope_type="default", rope_theta=float("nan")), "rope_parameters.rope_theta"),
    "theta string": (rope(rope_type="default", rope_theta="1e4"), "rope_parameters.rope_theta"),
    "theta zero top level": ({**TINY, "rope_theta": 0}, "rope_theta"),
    "rope_type a number": (rope(rope_type=3), "rope_parameters.rope_type"),
    "heads zero": ({**rope(rope_type="default"), "num_attention_heads": 0}, "num_attention_heads"),
    "heads string": ({**rope(rope_type="default"), "num_attention_heads": "4"}, "num_attention_heads"),
    "hidden negative": ({**rope(rope_type="default"), "hidden_size": -128}, "hidden_size"),
    "head_dim zero": ({**rope(rope_type="default"), "head_dim": 0}, "head_dim"),
    "layers a float": ({**rope(rope_type="default"), "num_hidden_layers": 1.5}, "num_hidden_layers"),
    "max positions negative": ({**rope(rope_type="default"), "max_position_embeddings": -5}, "max_position_embeddings"),
    "max positions string": ({**rope(rope_type="default"), "max_position_embeddings": "2"}, "max_position_embeddings"),
    "original negative": (
        rope(rope_type="yarn", factor=4.0, original_max_position_embeddings=-64),
        "rope_parameters.original_max_position_embeddings",
    ),
    "yarn without original": (rope(rope_type="yarn", factor=4.0), "original_max_position_embeddings"),
    "attention_factor NaN": (
        rope(rope_type="yarn", factor=4.0, original_max_position_embeddings=64, attention_factor=float("nan")),
        "rope_parameters.attention_factor",
    ),
    "truncate a string": (
        rope(rope_type="yarn", factor=4.0, original_max_position_embeddings=64, truncate="false"),
        "rope_parameters.truncate",
    ),
    "partial rotary string": (rope(rope_type="default", partial_rotary_factor="0.5"), "partial_rotary_factor"),
    "partial rotary zero": (rope(rope_type="default", partial_rotary_factor=0), "partial_rotary_factor"),
    "longrope short list": (
        {**TINY, "rope_parameters": {**LONGROPE, "short_factor": [1.0] * 3, "long_factor": [2.0] * 16}},
        "rope_parameters.short_factor",
    ),
    "longrope long list of strings": (
        {**TINY, "rope_parameters": {**LONGROPE, "short_factor": [1.0] * 16, "long_factor": ["2"] * 16}},
        "rope_parameters.long_factor",
    ),
    "rope_parameters a list": ({**TINY, "rope_parameters": [1, 2]}, "rope_parameters"),
    "rope_scaling a string": ({**TINY, "rope_scaling": "linear"}, "rope_scaling"),
    "rope_theta in rope_scaling differs": (
        {
            **rope(rope_type="linear", factor=4.0),
            "rope_scaling": {"rope_type": "linear", "factor": 4, "rope_theta": 5e5},
        },
        "rope_scaling.rope_theta",
    ),
    "top-level rope_theta differs": ({**rope(rope_type="linear", factor=4.0), "rope_theta": 5e5}, "rope_theta"),
}
#: Readers that read none of a case's damaged fields (4.57 reads neither rope_parameters nor a rope_theta inside
#: rope_scaling): the reader matrix measures them ``same``.
UNREAD = {"rope_theta in rope_scaling differs": ("transformers4",)}
#: Damage in hf-posext's own record: an error, but the readers that ignore the record still run the rope.
RECORDS = {
    "record a list": {**rope(rope_type="linear", factor=4.0), "hf_posext": [1, 2]},
    "record a string": {**rope(rope_type="linear", factor=4.0), "hf_posext": "yarn"},
    "record method a list": {**rope(rope_type="linear", factor=4.0), "hf_posext": {"method": ["yarn"]}},
    "record factor NaN": {**rope(rope_type="linear", factor=4.0), "hf_posext": {"method": "linear", "factor": "x"}},
}


def doctor_json(tmp_path, capsys, config_json=None, raw=None):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    if raw is None:
        (folder / "config.json").write_text(json.dumps(config_json))  # NaN and Infinity as Python writes them
    else:
        (folder / "config.json").write_bytes(raw)
    code = main(["doctor", str(folder), "--json"])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured, folder


@pytest.mark.parametrize("name", DAMAGED)
def test_a_damaged_config_gets_a_report_naming_the_field_and_no_reader_is_same(tmp_path, capsys, name):
    config_json, field = DAMAGED[name]
    code, captured, _ = doctor_json(tmp_path, capsys, config_json)
    assert code == 0, captured.err
    report = json.loads(captured.out)
    errors = [c for c in report["checks"] if c["severity"] == "error"]
    assert any(field in c["field"] and field in c["message"] for c in errors), report["checks"]
    verdicts = {key: finding["verdict"] for key, finding in report["readers"].items()}
    assert "same" not in [v for k, v in verdicts.items() if k not in UNREAD.get(name, ())], verdicts


@pytest.mark.parametrize("name", RECORDS)
def test_a_damaged_record_is_an_error_and_the_rope_is_still_judged(tmp_path, capsys, name):
    code, captured, _ = doctor_json(tmp_path, capsys, RECORDS[name])
    assert code == 0, captured.err
    report = json.loads(captured.out)
    assert any(c["check"] == "damaged-value" and c["field"].startswith("hf_posext") for c in report["checks"])
    assert report["readers"]["vllm"]["verdict"] == "same"  # linear x4, which the record does not change


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b'{"model_type": "llama\xff"}', "is not UTF-8 text (byte 0xff at offset 21)"),
        (b'{"model_type": "llama",', "is not valid JSON"),
        (b"[1, 2]", "holds list, not a JSON object"),
        (json.dumps({**TINY, "model_type": ["llama"]}).encode(), "model_type ['llama'] is not one"),
    ],
)
def test_a_file_no_rule_can_read_is_one_line_naming_it(tmp_path, capsys, raw, words):
    code, captured, folder = doctor_json(tmp_path, capsys, raw=raw)
    lines = captured.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and str(folder / "config.json") in lines[0] and words in lines[0], lines


GGUFS = {
    # a GGUF that is no whole model (no head counts, no layer tensors) is refused in one line instead:
    # tests/gguf/test_incomplete.py
    "freq_base NaN": (lambda p: write_tiny_gguf(p, freq_base=float("nan")), "llama.rope.freq_base"),
    "freq_base negative": (lambda p: write_tiny_gguf(p, freq_base=-5.0), "llama.rope.freq_base"),
    "freq_base zero": (lambda p: write_tiny_gguf(p, freq_base=0.0), "llama.rope.freq_base"),
    "context zero": (lambda p: write_tiny_gguf(p, context=0), "llama.context_length"),
    "factor inf": (
        lambda p: write_tiny_gguf(p, **{"rope.scaling.type": "yarn", "rope.scaling.factor": float("inf")}),
        "llama.rope.scaling.factor",
    ),
    "factor NaN": (
        lambda p: write_tiny_gguf(p, **{"rope.scaling.type": "linear", "rope.scaling.factor": float("nan")}),
        "llama.rope.scaling.factor",
    ),
    "attn_factor negative": (lambda p: write_tiny_gguf(p, **{"rope.scaling.attn_factor": -1.0}), "attn_factor"),
}


@pytest.mark.parametrize("name", GGUFS)
def test_a_damaged_gguf_gets_a_report_naming_the_key_and_no_reader_is_same(tmp_path, capsys, name):
    write, key = GGUFS[name]
    path = write(tmp_path / "m.gguf")
    assert main(["doctor", str(path), "--json"]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    report = json.loads(captured.out)
    assert any(key in c["field"] and c["severity"] == "error" for c in report["checks"]), report["checks"]
    assert "same" not in {finding["verdict"] for finding in report["readers"].values()}


def test_a_gguf_factor_below_one_is_one_line_naming_the_file_and_key(tmp_path, capsys):
    path = write_tiny_gguf(tmp_path / "m.gguf", **{"rope.scaling.type": "linear", "rope.scaling.factor": 0.5})
    assert main(["doctor", str(path)]) == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and str(path) in line and "rope.scaling.factor = 0.5" in line
