"""RULER's synthetic tasks (Hsieh et al. 2024, ``NVIDIA/RULER/scripts/synthetic.yaml``) as prompt drafts.

A task turns ``(seed, n, depth, length)`` into a `Draft`: the user message with ``n``
haystack units (noise paragraphs, prose words, distractor needles, list words...), the answers
and how often each must appear. `hf_posext.eval.ruler.fit` picks ``n`` and a few
characters of ``Draft.continuation`` so the prompt has exactly the wanted number of tokens.
Templates, answer prefixes and token budgets are RULER's (``NVIDIA/RULER/scripts/data/synthetic/constants.py``);
``qa`` is a stand-in (RULER's SQuAD/HotpotQA cannot be downloaded): made-up facts inserted as
sentences into the prose haystack, asked as questions. The keys and values of a draft do not
depend on ``n``, so fitting a prompt does not change what it asks.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from .haystack import (
    DEPTHS,
    NOISE,
    prose_words,
    random_letters,
    random_name,
    random_value,
    split_sentences,
    vocabulary,
)

NEEDLE = "One of the special magic {kind} for {key} is: {value}."


@dataclass(frozen=True)
class Draft:
    """A prompt before fitting: ``before + continuation[:pad] + after``, then the answer prefix.

    Attributes:
        before: the user message up to the end of the haystack.
        continuation: more haystack; a prefix of it fills the last few tokens.
        after: the rest of the user message (the question).
        answer_prefix: RULER's start of the answer (after the chat template's assistant turn).
        answers: the references scored in the model's output.
        counts: how often each answer appears in the prompt (checked after fitting).
        depth: where the needle of ``answers[0]`` sits in the haystack, 0 to 1; ``None`` for
            tasks without one position.
    """

    before: str
    continuation: str
    after: str
    answer_prefix: str
    answers: tuple[str, ...]
    counts: tuple[int, ...]
    depth: float | None = None

    def prompt(self, pad: int = 0) -> str:
        """The user message with ``pad`` characters of the continuation."""
        return self.before + self.continuation[:pad] + self.after


Builder = Callable[[str, int, float, int], Draft]


@dataclass(frozen=True)
class Task:
    """One task: its RULER name, group, answer budget, metric and draft builder.

    Attributes:
        name: RULER's task name (``niah_single_1``, ``vt``...) or ``qa``.
        group: ``niah``, ``multihop``, ``aggregation`` or ``qa`` (RULER's categories).
        max_new_tokens: RULER's ``tokens_to_generate``: the answer budget, left out of the prompt.
        metric: ``all`` (fraction of references found) or ``part`` (any reference found).
        build: ``(seed, n, depth, length) -> Draft``.
    """

    name: str
    group: str
    max_new_tokens: int
    metric: str
    build: Builder


def _insert(units: list[str], items: list[tuple[float, str]]) -> list[str]:
    """``units`` with each ``(depth, text)`` inserted at ``int(len(units) * depth)``, in depth order."""
    out, start = [], 0
    n = len(units)
    for depth, text in sorted(items, key=lambda item: item[0]):
        cut = min(n, int(n * depth))
        out += units[start:cut]
        out.append(text)
        start = cut
    return out + units[start:]


def _prose(rng: random.Random, n: int, extra: int) -> tuple[list[str], list[str]]:
    """``n`` prose words from a random start (cycling), and the ``extra`` words after them."""
    words = prose_words()
    start = rng.randrange(len(words))
    taken = [words[(start + i) % len(words)] for i in range(n + extra)]
    return taken[:n], taken[n:]


def _other_depths(rng: random.Random, k: int) -> list[float]:
    return [d / 100 for d in rng.sample(DEPTHS, k)]


def _niah(
    haystack: str,
    key_type: str,
    value_type: str,
    num_k: int,
    num_v: int,
    num_q: int,
    seed: str,
    n: int,
    depth: float,
    length: int,
) -> Draft:
    rng = random.Random(seed)
    num_k = max(num_k, num_q)
    keys: list[str] = []
    while len(keys) < num_k:
        key = random_value(rng, key_type)
        if key not in keys:
            keys.append(key)
    values = [[random_value(rng, value_type) for _ in range(num_v)] for _ in keys]
    queried = rng.sample(range(num_k), num_q)
    answers = [v for i in queried for v in values[i]]
    needles = [NEEDLE.format(kind=value_type, key=k, value=v) for k, vs in zip(keys, values) for v in vs]
    first = needles.pop(needles.index(NEEDLE.format(kind=value_type, key=keys[queried[0]], value=answers[0])))
    placed = [(depth, first), *zip(_other_depths(rng, len(needles)), rng.sample(needles, len(needles)))]

    if haystack == "essay":
        words, extra = _prose(rng, n, 80)
        context = " ".join(_insert(split_sentences(" ".join(words)), placed))
        continuation = " " + " ".join(extra)
    else:
        if haystack == "noise":
            units, more = [NOISE] * n, [NOISE] * 3
        else:  # "needle": the haystack is distractor needles with other keys
            stream = random.Random(f"{seed}/haystack")
            units = []
            while len(units) < n + 3:
                key = random_value(stream, key_type)
                if key not in keys:
                    units.append(NEEDLE.format(kind=value_type, key=key, value=random_value(stream, value_type)))
            units, more = units[:n], units[n:]
        context = "\n".join(_insert(units, placed))
        continuation = "".join("\n" + unit for unit in more)

    query = keys[queried[0]] if num_q == 1 else ", ".join(keys[i] for i in queried[:-1]) + ", and " + keys[queried[-1]]
    if num_q * num_v == 1:
        kind = value_type[:-1]
        head = (
            f"A special magic {kind} is hidden within the following text. Make sure to memorize it. "
            f"I will quiz you about the {kind} afterwards.\n"
        )
        question = f"\nWhat is the special magic {kind} for {query} mentioned in the provided text?"
        prefix = f" The special magic {kind} for {query} mentioned in the provided text is"
    else:
        head = (
            f"Some special magic {value_type} are hidden within the following text. Make sure to memorize it. "
            f"I will quiz you about the {value_type} afterwards.\n"
        )
        question = f"\nWhat are all the special magic {value_type} for {query} mentioned in the provided text?"
        prefix = f" The special magic {value_type} for {query} mentioned in the provided text are"
    return Draft(head + context, continuation, question, prefix, tuple(answers), (1,) * len(answers), depth)


_VT_HEAD = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"


def _vt_text(rng: random.Random, n: int, letters: int, hops: int) -> tuple[str, str, list[str]]:
    """A noise haystack of ``n`` paragraphs with one chain ``VAR A = value``, ``VAR B = VAR A``, ..."""
    names: list[str] = []
    while len(names) < hops + 1:
        name = random_letters(rng, letters)
        if name not in names:
            names.append(name)
    value = str(rng.randint(10000, 99999))
    chain = [f"VAR {names[0]} = {value}"] + [f"VAR {names[j + 1]} = VAR {names[j]}" for j in range(hops)]
    positions = sorted(rng.sample(range(n + 1), hops + 1)) if n + 1 >= hops + 1 else list(range(hops + 1))
    units: list[str] = [NOISE] * n
    for offset, (position, line) in enumerate(zip(positions, chain)):
        units.insert(min(position + offset, len(units)), line)
    return "\n".join(units), value, names


def _vt_prompt(context: str, value: str, hops: int) -> tuple[str, str, str]:
    question = f"\nQuestion: Find all variables that are assigned the value {value} in the text above."
    prefix = (
        f" Answer: According to the chain(s) of variable assignment in the text above, {hops + 1} variables "
        f"are assigned the value {value}, they are: "
    )
    return _VT_HEAD + context, question, prefix


def _vt(hops: int, seed: str, n: int, depth: float, length: int) -> Draft:
    rng = random.Random(seed)
    context, value, names = _vt_text(rng, n, 5, hops)
    # RULER's one-shot example: a short chain of 3-letter names, answered.
    example_rng = random.Random(f"{seed}/example")
    example_context, example_value, example_names = _vt_text(example_rng, 8, 3, hops)
    before, question, prefix = _vt_prompt(example_context, example_value, hops)
    example = before + question + prefix + " " + " ".join(example_names) + "\n\n"
    before, question, prefix = _vt_prompt(context, value, hops)
    return Draft(example + before, "\n" + "\n".join([NOISE] * 3), question, prefix, tuple(names), (2,) * hops + (1,))


_CWE_HEAD = (
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often.\n"
)
_CWE_QUESTION = "\nQuestion: What are the {num} most common words in the above list?"
_CWE_PREFIX = " Answer: The top {num} words that appear most often in the list are:"


def _word_pool() -> list[str]:
    banned = set((_CWE_HEAD + _CWE_QUESTION + _CWE_PREFIX).lower().replace(".", " ").split())
    return [w for w in vocabulary() if w not in banned]


def _cwe_list(rng: random.Random, words: list[str], common: int, freq_common: int, freq_uncommon: int) -> str:
    items = words[:common] * freq_common + words[common:] * freq_uncommon
    rng.shuffle(items)
    return " ".join(f"{i + 1}. {w}" for i, w in enumerate(items))


def _cwe(num_common: int, freq_common: int, freq_uncommon: int, seed: str, n: int, depth: float, length: int) -> Draft:
    rng = random.Random(seed)
    pool = _word_pool()
    # Made-up words extend the pool past its ~2k words (RULER falls back to a bigger English list), to
    # a size fixed by the length (a word appears at least 3 times), so the pool does not change with n.
    names = random.Random(f"{seed}/pool")
    while len(pool) < max(n, length // 3) + 80:
        word = random_name(names).lower()
        if word not in pool:
            pool.append(word)
    order = random.Random(f"{seed}/words").sample(pool, len(pool))
    # The first n words of one permutation: a longer list only adds words, so lengths grow with n.
    words, rest, example_words = order[:n], order[n : n + 40], order[-40:]
    # Below 4k RULER repeats less (common 6x, others once) and its example is smaller.
    if length < 4096:
        freq_common, freq_uncommon, example_shape = 6, 1, (20, 3, 1)
    else:
        example_shape = (40, 10, 3)
    example_words = example_words[: example_shape[0]]
    example = (
        _CWE_HEAD
        + _cwe_list(rng, example_words, num_common, *example_shape[1:])
        + _CWE_QUESTION.format(num=num_common)
        + _CWE_PREFIX.format(num=num_common)
        + " "
        + " ".join(f"{i + 1}. {w}" for i, w in enumerate(example_words[:num_common]))
        + "\n"
    )
    context = _cwe_list(rng, words, num_common, freq_common, freq_uncommon)
    count = num_common * freq_common + (n - num_common) * freq_uncommon
    continuation = "".join(f" {count + i + 1}. {w}" for i, w in enumerate(rest))
    return Draft(
        example + _CWE_HEAD + context,
        continuation,
        _CWE_QUESTION.format(num=num_common),
        _CWE_PREFIX.format(num=num_common),
        tuple(words[:num_common]),
        (freq_common,) * num_common,
    )


def _fwe(alpha: float, seed: str, n: int, depth: float, length: int) -> Draft:
    rng = random.Random(seed)
    size = max(10, (length - 50) // 50)  # RULER: vocab_size = (max_seq_length - tokens_to_generate) // 50
    codes: list[str] = []
    while len(codes) < size + 40:
        code = random_letters(rng, 6, "abcdefghijklmnopqrstuvwxyz")
        if code not in codes:
            codes.append(code)
    vocab, spare = codes[:size], codes[size:]
    vocab[0] = "..."  # the most frequent "word" is noise, as in RULER (whose question then says "the dots '....'")
    zeta = sum(k**-alpha for k in range(1, 100_000)) + 100_000 ** (1 - alpha) / (alpha - 1)
    counts = [int(n * k**-alpha / zeta) for k in range(1, size + 1)]
    words = [w for w, c in zip(vocab, counts) for _ in range(c)]
    rng.shuffle(words)
    head = (
        "Read the following coded text and track the frequency of each coded word. "
        "Find the three most frequently appeared coded words. "
    )
    question = (
        "\nQuestion: Do not provide any explanation. Please ignore the dots '....'. "
        "What are the three most frequently appeared words in the above coded text?"
    )
    prefix = " Answer: According to the coded text above, the three most frequently appeared words are:"
    return Draft(
        head + " ".join(words), "".join(" " + w for w in spare), question, prefix, tuple(vocab[1:4]), tuple(counts[1:4])
    )


#: The QA stand-in's relations: (fact sentence, question), with {p} a person and {v} the answer.
RELATIONS = (
    ("{p} was born in the town of {v}.", "In which town was {p} born?"),
    ("{p} keeps a parrot called {v}.", "What is the name of the parrot that {p} keeps?"),
    ("{p} works for a company named {v}.", "What is the name of the company {p} works for?"),
    ("The favourite novel of {p} is titled {v}.", "What is the title of the favourite novel of {p}?"),
)
_QA_RULE = (
    "Answer the question based on the given documents. Only give me the answer and do not output any other words."
)


def _qa(distractors: int, sentences_per_document: int, seed: str, n: int, depth: float, length: int) -> Draft:
    rng = random.Random(seed)
    people: list[str] = []
    while len(people) < distractors + 1:
        person = f"{random_name(rng, 2)} {random_name(rng, 3)}"
        if person not in people:
            people.append(person)
    values: list[str] = []
    while len(values) < distractors + 1:
        value = random_name(rng, 3)
        if value not in values and all(value not in p for p in people):
            values.append(value)
    relations = [rng.randrange(len(RELATIONS)) for _ in people]
    facts = [RELATIONS[r][0].format(p=p, v=v) for r, p, v in zip(relations, people, values)]
    words, extra = _prose(rng, n, 80)
    sentences = _insert(
        split_sentences(" ".join(words)), [(depth, facts[0]), *zip(_other_depths(rng, distractors), facts[1:])]
    )
    documents = [
        " ".join(sentences[i : i + sentences_per_document]) for i in range(0, len(sentences), sentences_per_document)
    ]
    context = "\n\n".join(f"Document {i + 1}:\n{doc}" for i, doc in enumerate(documents))
    head = f"{_QA_RULE}\n\nThe following are given documents.\n\n"
    question = f"\n\n{_QA_RULE}\n\nQuestion: {RELATIONS[relations[0]][1].format(p=people[0])}"
    return Draft(head + context, " " + " ".join(extra), question, " Answer:", (values[0],), (1,), depth)


def _task(name: str, group: str, budget: int, metric: str, build: Callable[..., Draft]) -> Task:
    return Task(name, group, budget, metric, build)


#: Every task, by name, in RULER's order.
TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        _task("niah_single_1", "niah", 128, "all", partial(_niah, "noise", "words", "numbers", 1, 1, 1)),
        _task("niah_single_2", "niah", 128, "all", partial(_niah, "essay", "words", "numbers", 1, 1, 1)),
        _task("niah_single_3", "niah", 128, "all", partial(_niah, "essay", "words", "uuids", 1, 1, 1)),
        _task("niah_multikey_1", "niah", 128, "all", partial(_niah, "essay", "words", "numbers", 4, 1, 1)),
        _task("niah_multikey_2", "niah", 128, "all", partial(_niah, "needle", "words", "numbers", 1, 1, 1)),
        _task("niah_multikey_3", "niah", 128, "all", partial(_niah, "needle", "uuids", "uuids", 1, 1, 1)),
        _task("niah_multivalue", "niah", 128, "all", partial(_niah, "essay", "words", "numbers", 1, 4, 1)),
        _task("niah_multiquery", "niah", 128, "all", partial(_niah, "essay", "words", "numbers", 1, 1, 4)),
        _task("vt", "multihop", 30, "all", partial(_vt, 4)),
        _task("cwe", "aggregation", 120, "all", partial(_cwe, 10, 30, 3)),
        _task("fwe", "aggregation", 50, "all", partial(_fwe, 2.0)),
        _task("qa", "qa", 32, "part", partial(_qa, 3, 8)),
    )
}

#: Named groups for ``--tasks``: ``all``, RULER's categories, and the NIAH families.
GROUPS: dict[str, tuple[str, ...]] = {
    "all": tuple(TASKS),
    "niah": tuple(n for n, t in TASKS.items() if t.group == "niah"),
    "niah_single": ("niah_single_1", "niah_single_2", "niah_single_3"),
    "niah_multikey": ("niah_multikey_1", "niah_multikey_2", "niah_multikey_3"),
    "multihop": ("vt",),
    "aggregation": ("cwe", "fwe"),
    "qa": ("qa",),
}
#: ``--quick``: one task of each category.
QUICK = ("niah_single_1", "niah_multikey_1", "vt", "fwe", "qa")


def resolve_tasks(names: str | list[str] | tuple[str, ...]) -> list[str]:
    """Task names from names and groups (``"niah,vt"``, ``["all"]``), in RULER's order, each once.

    Raises:
        ValueError: an unknown name, naming the tasks and groups there are.
    """
    items = [s.strip() for s in names.split(",")] if isinstance(names, str) else list(names)
    chosen: set[str] = set()
    for item in filter(None, items):
        if item in TASKS or item in GROUPS:
            chosen.update(GROUPS.get(item, (item,)))
        else:
            raise ValueError(f"unknown RULER task {item!r}; tasks: {', '.join(TASKS)}; groups: {', '.join(GROUPS)}")
    if not chosen:
        raise ValueError(f"no task named in {names!r}; tasks: {', '.join(TASKS)}; groups: {', '.join(GROUPS)}")
    return [name for name in TASKS if name in chosen]


def stratified_depth(index: int, samples: int, seed: str) -> float:
    """Sample ``index`` of ``samples``'s needle depth: one random point in its equal share of [0, 1].

    Depths of a cell are spread evenly (a heat-map row per depth gets its share of samples) while
    still differing between seeds.
    """
    u = random.Random(f"{seed}/depth/{index}").random()
    return min(1.0, math.floor(((index + u) / samples) * 1000) / 1000)


__all__ = ["GROUPS", "NEEDLE", "QUICK", "RELATIONS", "TASKS", "Draft", "Task", "resolve_tasks", "stratified_depth"]
