"""Conversations for the recipe: records read, checked, rendered by the chat template, loss on assistant turns.

A ``.jsonl`` record (or an HF dataset row) is a conversation when it holds ``messages`` (OpenAI/HF:
``role``/``content``) or ``conversations`` (ShareGPT: ``from``/``value``), and plain text when it
holds the text field. A conversation is rendered with the tokenizer's chat template and trained
with the loss on the tokens its assistant turns add (``loss_on="assistant"``, as TRL's
``assistant_only_loss`` and axolotl's ``train_on_inputs: false``) or on every token (``"all"``).
Rules for bad records and for conversations longer than a block: docs/guides/finetune.md#conversations.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..data import is_local_dataset, iter_hub_records, resolve_local_files

LossOn = Literal["assistant", "all"]
LOSS_ON = ("assistant", "all")
#: The roles a conversation may use: what chat templates (Llama 3, Qwen, SmolLM2, Mistral) render.
ROLES = ("system", "user", "assistant", "tool")
#: ShareGPT's speaker names and the role each stands for (FastChat's and axolotl's reading).
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
}

Message = dict[str, str]


class BadRecord(ValueError):
    """A record that is neither a conversation nor text, or a conversation the recipe cannot train.

    Args:
        where: ``file:line`` or the dataset row.
        kind: the kind of fault, the key it is counted under when bad records are skipped.
        detail: what is wrong and what is allowed.
    """

    def __init__(self, where: str, kind: str, detail: str) -> None:
        super().__init__(f"{where}: {detail}")
        self.kind = kind


@dataclass
class RecordCounts:
    """What reading conversations did with them, for the run record (``train_results.json``).

    Attributes:
        conversations: conversations read.
        texts: plain-text records read.
        truncated: conversations longer than a block, cut after the last assistant turn that fits.
        too_long: conversations whose first assistant turn does not fit a block: left out.
        skipped: bad records counted and left out (``skip_bad_records``), by reason.
    """

    conversations: int = 0
    texts: int = 0
    truncated: int = 0
    too_long: int = 0
    skipped: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "conversations": self.conversations,
            "texts": self.texts,
            "truncated": self.truncated,
            "too_long": self.too_long,
            "skipped": dict(sorted(self.skipped.items())),
        }


def _message(item: Any, where: str, number: int) -> Message:
    if not isinstance(item, dict) or not isinstance(item.get("role"), str) or not isinstance(item.get("content"), str):
        raise BadRecord(
            where, "malformed message", f"message {number} is not {{'role': str, 'content': str}}: {item!r:.80}"
        )
    return {"role": item["role"], "content": item["content"]}


def _sharegpt_message(item: Any, where: str, number: int) -> Message:
    if not isinstance(item, dict) or not isinstance(item.get("from"), str) or not isinstance(item.get("value"), str):
        raise BadRecord(
            where,
            "malformed ShareGPT",
            f"malformed ShareGPT record: turn {number} is not {{'from': str, 'value': str}}",
        )
    speaker = item["from"]
    if speaker not in SHAREGPT_ROLES:
        raise BadRecord(
            where, "unknown role", f"ShareGPT turn {number} is from {speaker!r}; speakers: {', '.join(SHAREGPT_ROLES)}"
        )
    return {"role": SHAREGPT_ROLES[speaker], "content": item["value"]}


def parse_record(record: Any, where: str, text_field: str = "text") -> str | list[Message]:
    """The text or the messages of one record.

    Args:
        record: a decoded JSON line or dataset row.
        where: ``file:line`` (or the dataset and row) for the messages.
        text_field: the field holding plain text.

    Raises:
        BadRecord: a record with neither messages nor text, a malformed message list.
    """
    if isinstance(record, dict) and "messages" in record:
        messages = record["messages"]
        if not isinstance(messages, list) or not messages:
            raise BadRecord(where, "malformed message", f"'messages' must be a non-empty list, got {messages!r:.80}")
        return [_message(item, where, number) for number, item in enumerate(messages, 1)]
    if isinstance(record, dict) and "conversations" in record:
        turns = record["conversations"]
        if not isinstance(turns, list) or not turns:
            raise BadRecord(
                where,
                "malformed ShareGPT",
                f"malformed ShareGPT record: 'conversations' must be a non-empty list, got {turns!r:.80}",
            )
        return [_sharegpt_message(item, where, number) for number, item in enumerate(turns, 1)]
    if isinstance(record, dict) and isinstance(record.get(text_field), str):
        return record[text_field]
    keys = sorted(record) if isinstance(record, dict) else type(record).__name__
    raise BadRecord(
        where,
        "neither messages nor text",
        f"neither a conversation ('messages' or ShareGPT 'conversations') nor text ({text_field!r}); has {keys}",
    )


def check_conversation(messages: Sequence[Message], where: str, loss_on: LossOn) -> None:
    """Refuse what would train nothing or train wrong: unknown roles, empty assistant turns, no assistant turn.

    Raises:
        BadRecord: naming the place and the turn.
    """
    for number, message in enumerate(messages, 1):
        if message["role"] not in ROLES:
            raise BadRecord(
                where,
                "unknown role",
                f"message {number} has role {message['role']!r}, which chat templates do not know; "
                f"roles: {', '.join(ROLES)}",
            )
        if message["role"] == "assistant" and not message["content"].strip():
            raise BadRecord(where, "empty assistant turn", f"message {number} is an empty assistant turn")
    if loss_on == "assistant" and not any(message["role"] == "assistant" for message in messages):
        raise BadRecord(
            where,
            "no assistant turn",
            "no assistant turn, and the loss is on assistant turns (loss_on=assistant): nothing to train; "
            "use loss_on=all to train on every token",
        )


def _render(tokenizer: Any, messages: Sequence[Message], where: str, generation_prompt: bool = False) -> str:
    try:
        return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=generation_prompt)
    except Exception as err:  # jinja's raise_exception and template errors have no common type
        raise BadRecord(where, "template refuses", f"the chat template refuses this conversation: {err}") from None


def render_conversation(
    tokenizer: Any, messages: Sequence[Message], where: str, loss_on: LossOn = "assistant"
) -> tuple[list[int], list[int]]:
    """Token ids of a conversation rendered by the chat template, and which of them are trained.

    The assistant turn ``k`` is the text ``render(messages[: k + 1])`` adds after
    ``render(messages[:k], add_generation_prompt=True)``: its content and the template's end of
    turn, not the header the model is prompted with. Each piece is tokenized on its own, so a
    token never straddles a turn boundary.

    Returns:
        ``(ids, trained)``: ``trained[t]`` is 1 when token ``t`` is a target of the loss.

    Raises:
        BadRecord: a template that refuses the conversation or renders a turn that does not extend the previous one.
    """
    text = _render(tokenizer, messages, where)
    pieces: list[tuple[str, int]] = []  # (text, trained)
    done = 0
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = len(_render(tokenizer, messages[:k], where, generation_prompt=True)) if k else 0
        end = len(_render(tokenizer, messages[: k + 1], where))
        if not (done <= start <= end <= len(text)) or text[:end] != _render(tokenizer, messages[: k + 1], where):
            raise BadRecord(
                where,
                "template not incremental",
                f"the chat template does not render turn {k + 1} as an extension of the turns before it, "
                "so its assistant tokens cannot be found; use loss_on=all or another template (--chat-template)",
            )
        pieces += [(text[done:start], 0), (text[start:end], 1)]
        done = end
    pieces.append((text[done:], 0))
    ids: list[int] = []
    trained: list[int] = []
    for piece, target in pieces:
        if not piece:
            continue
        piece_ids = list(tokenizer(piece, add_special_tokens=False)["input_ids"])
        ids += piece_ids
        trained += [1 if loss_on == "all" else target] * len(piece_ids)
    return ids, trained


def fit_conversation(
    tokenizer: Any, messages: Sequence[Message], where: str, block_len: int, loss_on: LossOn
) -> tuple[list[int], list[int], bool] | None:
    """A conversation's ids and targets cut at a turn boundary to at most ``block_len`` tokens.

    A longer conversation keeps its turns up to the last assistant turn that fits (truncated);
    one whose first assistant turn does not fit is left out (``None``).

    Returns:
        ``(ids, trained, truncated)`` or ``None``.
    """
    ids, trained = render_conversation(tokenizer, messages, where, loss_on)
    if len(ids) <= block_len:
        return ids, trained, False
    for end in range(len(messages) - 1, 0, -1):
        if messages[end - 1]["role"] != "assistant":
            continue
        ids, trained = render_conversation(tokenizer, messages[:end], where, loss_on)
        if len(ids) <= block_len:
            return ids, trained, True
    return None


def _local_records(files: Sequence[Path], text_field: str) -> Iterator[tuple[Any, str]]:
    for path in files:
        if path.suffix != ".jsonl":
            yield {text_field: path.read_bytes().decode("utf-8", errors="replace")}, str(path)
            continue
        with path.open("rb") as handle:
            for number, raw in enumerate(handle, 1):
                where = f"{path}:{number}"
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise BadRecord(
                        where, "not UTF-8", f"not UTF-8 text (column {err.start + 1}); .jsonl must be UTF-8"
                    ) from None
                if not line.strip():
                    continue
                try:
                    yield json.loads(line), where
                except json.JSONDecodeError as err:
                    raise BadRecord(where, "not JSON", f"not a JSON line ({err.msg})") from None


def iter_records(dataset: Sequence[str], split: str = "train", text_field: str = "text") -> Iterator[tuple[Any, str]]:
    """``(record, where)`` for every record of ``dataset``: a file's whole text, a ``.jsonl`` line, a dataset row."""
    if is_local_dataset(dataset):
        yield from _local_records(resolve_local_files(dataset, split), text_field)
        return
    for number, record in enumerate(iter_hub_records(dataset[0], split), 1):
        yield record, f"{dataset[0]} ({split}) row {number}"


def holds_conversations(dataset: Sequence[str], split: str = "train", text_field: str = "text", look: int = 16) -> bool:
    """Whether the first records of ``dataset`` include a conversation (the recipe then trains it packed)."""
    for index, (record, _) in enumerate(iter_records(dataset, split, text_field)):
        if isinstance(record, dict) and ("messages" in record or "conversations" in record):
            return True
        if index + 1 >= look:
            return False
    return False


def encoded_documents(
    dataset: Sequence[str],
    tokenizer: Any,
    block_len: int,
    *,
    split: str = "train",
    text_field: str = "text",
    loss_on: LossOn = "assistant",
    skip_bad_records: bool = False,
    counts: RecordCounts | None = None,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Each record of ``dataset`` as ``(ids, trained)`` int arrays of at most ``block_len`` tokens.

    Text gets BOS and EOS around it and is trained everywhere (documents longer than a block are
    the long side's, left out here); a conversation is rendered by the chat template (which
    writes its own special tokens) and cut at a turn boundary (`fit_conversation`).

    Raises:
        BadRecord: the first bad record, naming file and line, unless ``skip_bad_records``
            (then counted in ``counts.skipped`` by reason).
    """
    counts = counts if counts is not None else RecordCounts()
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    for record, where in iter_records(dataset, split, text_field):
        try:
            parsed = parse_record(record, where, text_field)
            if isinstance(parsed, str):
                counts.texts += 1
                ids = list(tokenizer(parsed, add_special_tokens=False)["input_ids"])
                doc = ([bos] if bos is not None else []) + ids + ([eos] if eos is not None else [])
                if ids and len(doc) <= block_len:
                    yield np.asarray(doc), np.ones(len(doc), dtype=np.int64)
                continue
            check_conversation(parsed, where, loss_on)
            fitted = fit_conversation(tokenizer, parsed, where, block_len, loss_on)
        except BadRecord as err:
            if not skip_bad_records:
                raise
            counts.skipped[err.kind] = counts.skipped.get(err.kind, 0) + 1
            continue
        counts.conversations += 1
        if fitted is None:
            counts.too_long += 1
            continue
        ids, trained, truncated = fitted
        counts.truncated += truncated
        yield np.asarray(ids), np.asarray(trained)


def check_chat_template(tokenizer: Any, model: str, chat_template: str | None) -> None:
    """Give ``tokenizer`` the template of the file ``chat_template``, or refuse a tokenizer without one.

    Raises:
        FileNotFoundError: a ``chat_template`` file that does not exist.
        ValueError: a tokenizer with no chat template and no ``chat_template`` file given.
    """
    if chat_template is not None:
        path = Path(chat_template)
        if not path.is_file():
            raise FileNotFoundError(f"chat_template {chat_template!r} does not exist (a Jinja file)")
        tokenizer.chat_template = path.read_text()
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"the tokenizer of {model!r} has no chat template, needed to render the conversations; "
            "give one with --chat-template FILE (a Jinja template)"
        )
