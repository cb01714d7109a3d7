"""One reader registry (issue 57): every reader is one module holding a `Reader`, and doctor, `support`, the engine
warning and the model card ask `hf_posext.readers.registry.READERS` and nothing else.

The throwaway reader below stands for a new module: adding it to `READERS` is all it takes for every answer to
carry it, and the one rule spanning readers (a definition only hf-posext computes) applies to it too.
"""

from __future__ import annotations

import copy
import importlib
import json

import pytest
from tests.helpers.models import GEMMA3_ROPE_PARAMETERS, tiny_config

import hf_posext
from hf_posext.experiments import reader_matrix as matrix
from hf_posext.readers import ANSWERS, VERDICTS, Finding, Reader, Subject, doctor, engine_warning, registry, support

L_ORIG = 64
SITUATIONS = {
    "rope": lambda: _subject(hf_posext.patch_model(tiny_config(max_positions=L_ORIG), "yarn", factor=4)),
    "layered": lambda: _subject(hf_posext.patch_model(_gemma3(), "linear", factor=2, layer_types=("full_attention",))),
    "damaged": lambda: Subject(
        {"model_type": "llama", "rope_parameters": {"rope_type": "linear", "factor": "4", "rope_theta": 1e4}},
        damaged=({"field": "rope_parameters.factor", "check": "damaged-value"},),
        built={"transformers5": None, "transformers5_hf_posext": "TypeError: factor"},
    ),
    "unreadable": lambda: Subject({"model_type": "llama", "rope_scaling": {"type": "nobodys"}}, error="ValueError: x"),
}


def _gemma3():
    """The reader matrix's tiny Gemma 3: one sliding and one full-attention layer, google/gemma-3's rope."""
    return matrix.tiny_config(
        "gemma3_text",
        sliding_window=16,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters=copy.deepcopy(GEMMA3_ROPE_PARAMETERS),
    )


def _subject(config) -> Subject:
    return Subject(json.loads(config.to_json_string()), config, 4 * L_ORIG)


def test_every_reader_is_one_module_with_its_reader():
    assert len({r.key for r in registry.READERS}) == len({r.name for r in registry.READERS}) == len(registry.READERS)
    for reader in registry.READERS:
        module = importlib.import_module(reader.judge.__module__)
        assert module.__name__.startswith("hf_posext.readers.") and reader in vars(module).values(), reader.key
        assert reader.rules and reader.checked in ("run here", "read from source")
    assert registry.reader("vllm").name == "vLLM"
    with pytest.raises(KeyError, match="no reader 'nobody'; readers: transformers5, "):
        registry.reader("nobody")


@pytest.mark.parametrize("situation", SITUATIONS)
def test_every_reader_answers_every_situation_in_one_vocabulary(situation):
    subject = SITUATIONS[situation]()
    assert subject.situation == situation
    findings = registry.judge(subject)
    assert list(findings) == [r.key for r in registry.READERS]
    for key, found in findings.items():
        assert isinstance(found, Finding) and found.verdict in ANSWERS and found.why, key
    if situation == "damaged":  # the damaged field is read by every reader here but 4.57 (rope_parameters)
        assert all(f.verdict != "same" for k, f in findings.items() if k != "transformers4")


def test_a_finding_outside_the_vocabulary_is_refused():
    with pytest.raises(ValueError, match="verdict 'fine' is not one of same, misread, refused, unknown"):
        Finding("fine", "why", "rules", "run here")
    assert VERDICTS == ("same", "misread", "refused")


def _judge_new(subject: Subject) -> Finding:
    """A reader that runs plain RoPE whatever the config says (as llama.cpp's converter does for unknown types)."""
    if subject.situation != "rope":
        return NEW.one_rope_only(subject) if subject.situation == "layered" else NEW.finding("unknown", "no rule")
    if subject.rope_type == "yarn":
        return NEW.finding("same", "reads yarn")
    return NEW.finding("misread", "runs plain RoPE")


NEW = Reader("newengine", "New Engine", "New Engine 1.0, read from source", "read from source", _judge_new)


def test_a_new_reader_is_one_module_and_one_line_in_the_registry(monkeypatch, tmp_path):
    monkeypatch.setattr(registry, "READERS", (*registry.READERS, NEW))
    yarn = hf_posext.patch_model(tiny_config(max_positions=L_ORIG), "yarn", factor=4)
    report = doctor.diagnose(json.loads(yarn.to_json_string()), yarn)
    assert report["readers"]["newengine"] == {
        "verdict": "same",
        "why": "reads yarn",
        "rules": "New Engine 1.0, read from source",
        "checked": "read from source",
    }
    assert support(yarn, 4 * L_ORIG)["New Engine"] == ("same", "reads yarn")
    linear = hf_posext.patch_model(tiny_config(max_positions=L_ORIG), "dynamic_ntk", factor=4)
    assert "New Engine (runs plain RoPE)" in engine_warning(linear, 4 * L_ORIG, "dynamic_ntk")
    # the rule spanning readers reaches it: LongRoPE per query is hf-posext's own definition
    query = hf_posext.patch_model(tiny_config(max_positions=L_ORIG), "longrope", factor=4, factors_by="query")
    query.rope_parameters["rope_type"] = "yarn"  # a rope this reader reads right, so only the rule can say misread
    found = registry.judge(_subject(query))["newengine"]
    assert found.verdict == "misread" and "only hf-posext computes" in found.why
