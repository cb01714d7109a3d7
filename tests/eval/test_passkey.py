"""Passkey prompt, fitting, scoring, and generation plumbing."""

from __future__ import annotations

import re

import pytest
import torch

from hf_posext.eval.passkey import (
    FILLER,
    QUESTION,
    TASK,
    build_prompt,
    fit_filler,
    key_line,
    parse_answer,
    passkey_accuracy,
)
from hf_posext.eval.ruler import wilson_interval
from hf_posext.testing import byte_tokenizer
from tests.helpers.models import tiny_model


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


def test_prompt_is_the_yarn_prompt():
    prompt = build_prompt(4242, 10, 0.5)
    lines = prompt.split("\n")
    assert lines[0] == TASK and lines[2] == key_line(4242) and lines[-1] == QUESTION
    assert key_line(4242) == "The pass key is 4242. Remember it. 4242 is the pass key."
    assert lines[1] == FILLER  # the five sentences, once
    assert lines[3] == FILLER


@pytest.mark.parametrize(("depth", "before"), [(0.0, 0), (0.3, 3), (1.0, 10)])
def test_depth_places_the_key_among_the_filler(depth, before):
    lines = build_prompt(7, 10, depth).split("\n")
    count = lambda text: len(re.findall(r"\.", text))  # noqa: E731 - one sentence per full stop
    assert count(lines[1]) == before and count(lines[3]) == 10 - before


@pytest.mark.parametrize("length", [300, 1000, 4096])
def test_fit_filler_is_the_longest_prompt_that_fits(tokenizer, length):
    n = fit_filler(tokenizer, length)
    assert len(tokenizer.encode(build_prompt(50000, n, 0.5))) <= length
    assert len(tokenizer.encode(build_prompt(50000, n + 1, 0.5))) > length


def test_fit_filler_rejects_a_length_below_the_bare_prompt(tokenizer):
    with pytest.raises(ValueError, match="length 50 is too short"):
        fit_filler(tokenizer, 50)


@pytest.mark.parametrize(
    ("text", "answer"),
    [(" 12345. Remember", 12345), ("no digits here", None), ("abc 7 and 9", 7), ("0042", 42), ("", None)],
)
def test_parse_answer_takes_the_first_integer(text, answer):
    assert parse_answer(text) == answer


class KnownAnswers:
    """A stub with transformers' ``generate`` signature whose answers are known in advance.

    Used ONLY to test the scoring and bookkeeping of :func:`passkey_accuracy`: it reads the key
    back out of the prompt and answers it correctly when the prompt has at most ``limit`` tokens
    and the key sits in the first half of the filler, else answers ``key + 1``.
    """

    training = False

    def __init__(self, tokenizer, limit):
        self.tokenizer, self.limit = tokenizer, limit

    def eval(self):
        return self

    def train(self, mode=True):
        return self

    def generate(self, input_ids, attention_mask, max_new_tokens, do_sample, pad_token_id=None):
        assert do_sample is False and max_new_tokens == 10 and input_ids.shape[0] == 1
        prompt = self.tokenizer.decode(input_ids[0], skip_special_tokens=True)
        key = int(re.search(r"The pass key is (\d+)\.", prompt).group(1))
        lines = prompt.split("\n")
        assert lines[2] == key_line(key)
        early = lines[1].count(".") < lines[3].count(".")  # fewer filler sentences before the key than after
        right = input_ids.shape[-1] <= self.limit and early
        reply = self.tokenizer.encode(f" {key if right else key + 1}. The", add_special_tokens=False)[:max_new_tokens]
        return torch.cat([input_ids, torch.tensor([reply])], dim=-1)


def test_scoring_with_a_model_whose_answers_are_known(tokenizer):
    result = passkey_accuracy(
        KnownAnswers(tokenizer, limit=600), tokenizer, [400, 800], depths=[0.0, 0.25, 1.0], trials=3, progress=False
    )
    assert result.correct == [[3, 0], [3, 0], [0, 0]]
    assert result.accuracy() == [[1.0, 0.0], [1.0, 0.0], [0.0, 0.0]]
    assert result.accuracy_by_length() == [pytest.approx(2 / 3), 0.0]
    assert all(n <= target for n, target in zip(result.prompt_tokens, [400, 800]))
    assert len(result.samples) == 2 * 3 * 3
    for sample in result.samples:
        assert sample["correct"] == (sample["answer"] == sample["key"])
    # Sample counts and 95% Wilson intervals, as the RULER suite reports them.
    assert result.intervals()[0][0] == wilson_interval(3, 3) and result.intervals()[2][1] == wilson_interval(0, 3)
    low, high = wilson_interval(6, 9)
    assert result.summary_by_length()[0] == {
        "accuracy": pytest.approx(66.67),
        "n": 9,
        "low": round(100 * low, 2),
        "high": round(100 * high, 2),
    }
    assert result.to_dict()["by_length"][1]["n"] == 9 and result.to_dict()["by_length"][1]["accuracy"] == 0.0


def test_keys_are_seeded_and_differ_between_trials(tokenizer):
    model = KnownAnswers(tokenizer, limit=10_000)
    a = passkey_accuracy(model, tokenizer, [400], depths=[0.5], trials=4, seed=1, progress=False)
    b = passkey_accuracy(model, tokenizer, [400], depths=[0.5], trials=4, seed=1, progress=False)
    keys = [s["key"] for s in a.samples]
    assert keys == [s["key"] for s in b.samples] and len(set(keys)) == 4


def test_real_model_continuation_is_its_greedy_decode(tokenizer):
    """A real (random) Llama: the recorded continuation is what a hand-written argmax loop produces."""
    model = tiny_model("llama", max_positions=512, **{"vocab_size": 259})
    result = passkey_accuracy(model, tokenizer, [300], depths=[0.5], trials=1, seed=3, progress=False)
    sample = result.samples[0]
    ids = torch.tensor([tokenizer.encode(build_prompt(sample["key"], fit_filler(tokenizer, 300), 0.5))])
    with torch.no_grad():
        for _ in range(10):
            next_id = model(input_ids=ids).logits[0, -1].argmax()
            ids = torch.cat([ids, next_id.view(1, 1)], dim=-1)
    expected = tokenizer.decode(ids[0, -10:])
    assert sample["continuation"] == expected
    assert sample["answer"] == parse_answer(expected)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lengths": []}, "lengths"),
        ({"lengths": [0]}, r"\[0\]"),
        ({"lengths": [400], "depths": [1.5]}, "1.5"),
        ({"lengths": [400], "trials": 0}, "got 0"),
    ],
)
def test_bad_arguments_raise(tokenizer, kwargs, message):
    with pytest.raises(ValueError, match=message):
        passkey_accuracy(KnownAnswers(tokenizer, 1), tokenizer, progress=False, **kwargs)


def test_build_prompt_rejects_bad_depth():
    with pytest.raises(ValueError, match="got -0.1"):
        build_prompt(1, 3, -0.1)
