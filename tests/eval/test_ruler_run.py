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
