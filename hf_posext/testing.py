"""Testing utilities: an offline byte tokenizer and tiny random checkpoints, for demos, laptop runs and tests.

Nothing can be downloaded on the machines this project is tested on, yet the recipe and the
evaluations load their model and tokenizer as a user's run does (``from_pretrained(folder)``):

* `byte_tokenizer` - a real `transformers.PreTrainedTokenizerFast` whose token id
  ``b`` is byte ``b`` (256 byte symbols, no merges), so any text round-trips exactly;
* `make_tiny_model` - a randomly initialised Llama/Mistral/Qwen2/Qwen3 checkpoint with that
  tokenizer (``hf-posext tiny-model out/tiny-llama``: ~0.2M parameters).

    from hf_posext.testing import byte_tokenizer
    byte_tokenizer()("def f():").input_ids   # [256, 100, 101, 102, 32, 102, 40, 41, 58]  (BOS first)
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

from .files import atomic_directory
from .integration import bytes_to_unicode

#: Number of byte tokens; ids 0..255 are the bytes themselves.
NUM_BYTES = 256
BOS_TOKEN, EOS_TOKEN, PAD_TOKEN = "<s>", "</s>", "<pad>"
BOS_ID, EOS_ID, PAD_ID = NUM_BYTES, NUM_BYTES + 1, NUM_BYTES + 2
#: ``vocab_size`` a model needs to use `byte_tokenizer` (259).
BYTE_VOCAB_SIZE = NUM_BYTES + 3


def byte_tokenizer(model_max_length: int | None = None) -> PreTrainedTokenizerFast:
    """A fast byte-level tokenizer: id ``b`` is UTF-8 byte ``b``; BOS=256, EOS=257, PAD=258.

    ``tokenizer(text)`` prepends BOS (as Llama tokenizers do); the fine-tune recipe's data
    pipeline adds EOS itself between documents.

    Args:
        model_max_length: the length transformers warns above; ``None`` (no limit) because
            tokenizing a whole document before cutting it into blocks is the normal use.

    Returns:
        A tokenizer that ``save_pretrained`` writes as ``tokenizer.json`` and that
        ``AutoTokenizer.from_pretrained`` reloads without ``hf_posext``.
    """
    # ByteLevel rewrites every byte as a character of GPT-2's reversible byte map, so the BPE
    # vocabulary is keyed by those characters.
    vocab = {char: byte for byte, char in bytes_to_unicode().items()}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    # No regex split: with no merges every byte is its own token anyway, and splitting only
    # costs time on megabytes of source text.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([BOS_TOKEN, EOS_TOKEN, PAD_TOKEN])
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B", special_tokens=[(BOS_TOKEN, BOS_ID)]
    )
    limits = {} if model_max_length is None else {"model_max_length": model_max_length}
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        clean_up_tokenization_spaces=False,
        **limits,
    )


#: Architectures `make_tiny_model` can build (the ones hf-posext supports).
TINY_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")

#: The byte vocabulary padded to a multiple of 8. Padding is the usual habit for fast matmuls,
#: and it is needed here: ``AutoTokenizer`` loads a qwen2 checkpoint's tokenizer as
#: ``Qwen2Tokenizer``, which adds ``<|endoftext|>`` (id 259) to any vocabulary.
TINY_VOCAB_SIZE = -(-(BYTE_VOCAB_SIZE + 1) // 8) * 8


def make_tiny_model(
    output_dir: str | os.PathLike,
    arch: str = "llama",
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    max_position_embeddings: int = 128,
    rope_theta: float = 10_000.0,
    seed: int = 0,
) -> Path:
    """Write a randomly initialised ``arch`` model and the byte tokenizer to ``output_dir``.

    Args:
        output_dir: the checkpoint folder, written atomically (replaced if it exists).
        arch: one of `TINY_ARCHITECTURES`.
        hidden_size: model width; the head size is ``hidden_size // num_heads``.
        num_layers: decoder layers.
        num_heads: query heads; must divide ``hidden_size``.
        num_kv_heads: key/value heads (grouped-query attention); must divide ``num_heads``.
        max_position_embeddings: the pretraining context ``L_orig`` the checkpoint advertises.
        rope_theta: RoPE base.
        seed: ``torch`` seed of the weight initialisation.

    Returns:
        ``output_dir`` as a Path.

    Raises:
        ValueError: an unknown architecture or inconsistent head counts.
    """
    if arch not in TINY_ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; choose one of {', '.join(TINY_ARCHITECTURES)}")
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError(
            f"num_heads={num_heads} must divide hidden_size={hidden_size} and num_kv_heads={num_kv_heads} "
            "must divide num_heads"
        )
    config = AutoConfig.for_model(
        arch,
        vocab_size=TINY_VOCAB_SIZE,
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        tie_word_embeddings=False,
    )
    if arch == "mistral":
        config.sliding_window = None  # full attention, like Llama: the window is not under test here
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    with atomic_directory(output_dir) as tmp:
        model.save_pretrained(tmp)
        byte_tokenizer().save_pretrained(tmp)
    return Path(output_dir)
