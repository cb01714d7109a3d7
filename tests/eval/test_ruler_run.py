"""ruler_accuracy: batched cells equal prompt-by-prompt ones, batch sizes from memory, argument checks."""

from __future__ import annotations

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_posext.eval.ruler import auto_batch_size, ruler_accuracy
from hf_posext.testing import make_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = make_tiny_model(tmp_path_factory.mktemp("run") / "tiny", hidden_size=32, max_position_embeddings=1024)
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def test_a_batched_cell_equals_the_cell_prompt_by_prompt(tiny):
    model, tokenizer = tiny
    kwargs = {
        "lengths": [900],
        "tasks": "niah_single_1,niah_multikey_2",
        "samples": 3,
        "max_new_tokens": 6,
        "progress": False,
    }
    batched = ruler_accuracy(model, tokenizer, batch_size=3, **kwargs)
    single = ruler_accuracy(model, tokenizer, batch_size=1, **kwargs)
    for key, cell in batched["cells"].items():
        assert cell["batch_size"] == 3 and single["cells"][key]["batch_size"] == 1
        assert [s["output"] for s in cell["samples"]] == [s["output"] for s in single["cells"][key]["samples"]]
        assert cell["prompt_tokens"] == 900 - 128
    assert batched["average"]["900"]["n"] == 6


def test_batch_size_follows_memory_and_length(tiny):
    model, _ = tiny
    small, large = auto_batch_size(model, 8192, memory_gib=0.5), auto_batch_size(model, 8192, memory_gib=8)
    assert 1 <= small < large
    assert auto_batch_size(model, 2048, memory_gib=0.5) > small
    assert auto_batch_size(model, 10**7, memory_gib=0.001) == 1


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"lengths": []}, "lengths must be positive ints"),
        ({"lengths": [900], "samples": 0}, "samples must be"),
        ({"lengths": [900], "tasks": "nope"}, "unknown RULER task 'nope'"),
    ],
)
def test_bad_arguments_raise(tiny, kwargs, message):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match=message):
        ruler_accuracy(model, tokenizer, progress=False, **kwargs)


def test_a_cell_cut_short_resumes_from_its_finished_prompts(tiny, tmp_path, monkeypatch):
    """The prompts a stopped cell finished are kept (one line each) and not asked again; the cell is the same."""
    from hf_posext.eval.prompt_log import PromptLog
    from hf_posext.eval.ruler import run

    model, tokenizer = tiny
    kwargs = {"lengths": [900], "tasks": "niah_single_1", "samples": 4, "max_new_tokens": 6, "progress": False}
    straight = ruler_accuracy(model, tokenizer, batch_size=1, **kwargs)
    generate, asked = run._generate, []

    def stopped_at_the_third(model, tokenizer, batch, *args):
        asked.append(len(batch))
        if len(asked) == 3 and stop:
            raise KeyboardInterrupt
        return generate(model, tokenizer, batch, *args)

    stop = True
    monkeypatch.setattr(run, "_generate", stopped_at_the_third)
    log = PromptLog(tmp_path / "prompts.jsonl", {"run": 1})
    with pytest.raises(KeyboardInterrupt):
        ruler_accuracy(model, tokenizer, batch_size=1, prompts=log, **kwargs)
    assert sorted(PromptLog(tmp_path / "prompts.jsonl", {"run": 1}).finished("niah_single_1/900")) == [0, 1]
    asked.clear()
    stop = False
    resumed = ruler_accuracy(
        model, tokenizer, batch_size=1, prompts=PromptLog(tmp_path / "prompts.jsonl", {"run": 1}), **kwargs
    )
    assert asked == [1, 1]  # prompts 2 and 3 only
    cell, before = resumed["cells"]["niah_single_1/900"], straight["cells"]["niah_single_1/900"]
    assert cell["samples"] == before["samples"] and cell["accuracy"] == before["accuracy"]
    assert not (tmp_path / "prompts.jsonl").exists()
