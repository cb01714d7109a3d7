"""A byte-level tokenizer that needs no download: one token per UTF-8 byte, plus BOS/EOS/PAD.

Nothing can be downloaded on the machines this project is tested on, yet the fine-tune recipe
loads its tokenizer the way a user's run does (``AutoTokenizer.from_pretrained(model_dir)``).
:func:`byte_tokenizer` builds a real :class:`~transformers.PreTrainedTokenizerFast` (a
``tokenizers`` BPE model with the 256 byte symbols and no merges) that is saved next to a tiny
model and reloaded through ``AutoTokenizer``. Token id ``b`` is byte ``b``, so a tiny model's
perplexity is per byte and any text (source code, UTF-8 prose) round-trips exactly.

    from hf_posext.train.tokenizer import byte_tokenizer
    tok = byte_tokenizer()
    tok("def f():").input_ids          # [256, 100, 101, 102, 32, 102, 40, 41, 58]  (BOS first)
    tok.save_pretrained("tiny-model")  # then AutoTokenizer.from_pretrained("tiny-model")
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

#: Number of byte tokens; ids 0..255 are the bytes themselves.
NUM_BYTES = 256
BOS_TOKEN, EOS_TOKEN, PAD_TOKEN = "<s>", "</s>", "<pad>"
BOS_ID, EOS_ID, PAD_ID = NUM_BYTES, NUM_BYTES + 1, NUM_BYTES + 2
#: ``vocab_size`` a model needs to use :func:`byte_tokenizer` (259).
BYTE_VOCAB_SIZE = NUM_BYTES + 3


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map, the alphabet of ``ByteLevel``.

    The ``ByteLevel`` pre-tokenizer rewrites every byte as one of these characters, so the BPE
    vocabulary has to be keyed by them (printable bytes map to themselves, the others to 256+).
    """
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    mapping, extra = {}, 0
    for byte in range(NUM_BYTES):
        if byte in printable:
            mapping[byte] = chr(byte)
        else:
            mapping[byte] = chr(NUM_BYTES + extra)
            extra += 1
    return mapping


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
    vocab = {char: byte for byte, char in _bytes_to_unicode().items()}
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
