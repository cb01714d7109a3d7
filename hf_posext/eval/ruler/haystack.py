"""What the RULER-style prompts are made of, all from what ships with Python: nothing is downloaded.

* prose: the Python Language Reference (``pydoc_data.topics``), with its code blocks and reST
  underlines dropped, standing in for RULER's Paul Graham essays;
* noise: the passkey filler "The grass is green. ..." (RULER's ``noise`` haystack);
* words: the lower-case words of that prose (for needle keys, common-words lists and the QA
  stand-in's names), in place of RULER's ``wonderwords`` lists;
* values: 7-digit numbers, UUIDs, upper-case variable names, 6-letter coded words.

Every random choice takes a `random.Random`, so a prompt is a function of its seed.
"""

from __future__ import annotations

import functools
import importlib
import random
import re
import string
import uuid

#: RULER's noise haystack (the passkey filler of Mohtashami & Jaggi).
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."

#: Depths RULER draws needles from: 40 evenly spaced percentages, 0 to 100.
DEPTHS = [round(100 * i / 39) for i in range(40)]

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")
_UNDERLINE = re.compile(r"^[*=\-~^\"'`#+]{3,}$")
_ABBREVIATIONS = ("e.g.", "i.e.", "etc.", "vs.", "cf.", "Mr.", "Dr.", "No.")


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text``: a regex splitter (RULER uses NLTK's ``sent_tokenize``, which needs a download).

    A sentence ends at ``.``, ``!`` or ``?`` followed by white space and a capital letter, a quote
    or a parenthesis, unless the word before is a common abbreviation.
    """
    pieces = _SENTENCE_END.split(text.strip())
    sentences: list[str] = []
    for piece in pieces:
        if sentences and sentences[-1].endswith(_ABBREVIATIONS):
            sentences[-1] += " " + piece
        else:
            sentences.append(piece)
    return [s for s in sentences if s]


@functools.cache
def prose_words() -> tuple[str, ...]:
    """The prose of the Python Language Reference as one list of words (white space normalised).

    Code blocks (indented lines), reST underlines and grammar rules are dropped, so what is left
    reads as English paragraphs.
    """
    kept: list[str] = []
    # Loaded on first use, not on import: `hf-posext --help` imports this package and the topics are 0.8 MB.
    for topic in importlib.import_module("pydoc_data.topics").topics.values():
        for line in topic.splitlines():
            stripped = line.strip()
            if not stripped or line.startswith((" ", "\t")) or _UNDERLINE.match(stripped) or "::=" in line:
                continue
            kept.append(stripped)
    return tuple(" ".join(kept).split())


@functools.cache
def vocabulary() -> tuple[str, ...]:
    """Distinct lower-case alphabetic words of 4 to 10 letters from the prose, sorted."""
    return tuple(sorted({w for w in re.findall(r"\b[a-z]{4,10}\b", " ".join(prose_words()))}))


def random_key(rng: random.Random) -> str:
    """A needle key as RULER's ``words`` type: two words joined by a hyphen (``adjective-noun`` there)."""
    words = vocabulary()
    first, second = rng.choice(words), rng.choice(words)
    while second == first:
        second = rng.choice(words)
    return f"{first}-{second}"


def random_number(rng: random.Random, digits: int = 7) -> str:
    """A ``digits``-digit number without a leading zero (RULER: 7 digits)."""
    return str(rng.randint(10 ** (digits - 1), 10**digits - 1))


def random_uuid(rng: random.Random) -> str:
    """A version-4 UUID from ``rng``'s bits."""
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def random_value(rng: random.Random, kind: str) -> str:
    """A needle key or value of RULER's type ``words``, ``numbers`` or ``uuids``.

    Raises:
        ValueError: another kind.
    """
    if kind == "numbers":
        return random_number(rng)
    if kind == "words":
        return random_key(rng)
    if kind == "uuids":
        return random_uuid(rng)
    raise ValueError(f"needle type must be words, numbers or uuids, got {kind!r}")


def random_letters(rng: random.Random, k: int, alphabet: str = string.ascii_uppercase) -> str:
    """``k`` random letters (RULER's variable names: 5 upper-case letters; coded words: 6 lower-case)."""
    return "".join(rng.choices(alphabet, k=k))


_SYLLABLES = (
    "ba",
    "ker",
    "lin",
    "mo",
    "dra",
    "vel",
    "sun",
    "tor",
    "qua",
    "ri",
    "zen",
    "hal",
    "mir",
    "no",
    "pes",
    "gru",
    "fal",
    "dor",
    "wi",
    "ska",
    "thel",
    "bru",
    "cor",
    "ym",
    "lo",
    "vash",
    "ne",
    "ost",
    "pra",
    "gil",
)


def random_name(rng: random.Random, syllables: int = 3) -> str:
    """A made-up capitalised name ("Velqualin"): the QA stand-in's people, places and titles."""
    return "".join(rng.choice(_SYLLABLES) for _ in range(syllables)).capitalize()


def occurrences(text: str, item: str) -> int:
    """How often ``item`` appears in ``text`` as a whole token (case-insensitive; not inside a longer word)."""
    return len(re.findall(rf"(?<![\w-]){re.escape(item)}(?![\w-])", text, flags=re.IGNORECASE))


__all__ = [
    "DEPTHS",
    "NOISE",
    "occurrences",
    "prose_words",
    "random_key",
    "random_letters",
    "random_name",
    "random_number",
    "random_uuid",
    "random_value",
    "split_sentences",
    "vocabulary",
]
