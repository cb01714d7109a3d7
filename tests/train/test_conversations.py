"""Conversations in the recipe: records read and checked, rendered by the chat template, loss on assistant turns.

What it promises: a conversation's trained tokens are exactly what its assistant turns add to the
chat template's rendering (content and end of turn, never the prompt or the turn header);
ShareGPT records train as their ``messages`` twins; a bad record stops the run naming file and
line (or is counted and skipped on request); a conversation longer than a block is cut after its
last assistant turn that fits; a packed block of conversations scores as its conversations one by
one; a run on conversations writes what it read into ``train_results.json``.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from accelerate import Accelerator
from transformers import AutoModelForCausalLM

from hf_posext.testing import byte_tokenizer
from hf_posext.train import steps
from hf_posext.train.blocks import load_document_blocks, packed_batch
from hf_posext.train.conversations import (
    BadRecord,
    RecordCounts,
    encoded_documents,
    fit_conversation,
    render_conversation,
)
from hf_posext.train.loop import train

from tests.helpers.finetune import record_forward_loss, train_config, write_finetune_assets
from tests.helpers.ruler_tokenizers import CHATML
from tests.train.test_loop import ROOT, SUBPROCESS_ENV

pytestmark = pytest.mark.usefixtures("one_thread")

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Red."},
    {"role": "user", "content": "Another?"},
    {"role": "assistant", "content": "Blue."},
]


def chat_tokenizer():
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = CHATML
    return tokenizer


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def trained_text(tokenizer, ids, trained) -> list[str]:
    """The runs of trained tokens, decoded."""
    runs, current = [], []
    for token, target in zip(ids, trained):
        if target:
            current.append(token)
        elif current:
            runs.append(tokenizer.decode(current))
            current = []
    if current:
        runs.append(tokenizer.decode(current))
    return runs


def test_only_what_the_assistant_turns_add_is_trained():
    tokenizer = chat_tokenizer()
    ids, trained = render_conversation(tokenizer, CHAT, "x")
    assert tokenizer.decode(ids) == tokenizer.apply_chat_template(CHAT, tokenize=False)
    assert trained_text(tokenizer, ids, trained) == ["Red.<|im_end|>\n", "Blue.<|im_end|>\n"]
    _, everything = render_conversation(tokenizer, CHAT, "x", loss_on="all")
    assert all(everything)


def test_a_sharegpt_record_trains_as_its_messages_twin(tmp_path):
    tokenizer = chat_tokenizer()
    speakers = {"system": "system", "user": "human", "assistant": "gpt"}
    sharegpt = {"conversations": [{"from": speakers[m["role"]], "value": m["content"]} for m in CHAT]}
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CHAT}, sharegpt, {"text": "plain"}])
    counts = RecordCounts()
    (ids_a, trained_a), (ids_b, trained_b), (text, text_trained) = encoded_documents(
        [str(data)], tokenizer, 512, counts=counts
    )
    assert ids_a.tolist() == ids_b.tolist() and trained_a.tolist() == trained_b.tolist()
    assert tokenizer.decode(text) == "<s>plain</s>" and text_trained.all()
    assert counts.as_dict() == {"conversations": 2, "texts": 1, "truncated": 0, "too_long": 0, "skipped": {}}


BAD = [
    ({"prompt": "hi"}, "neither messages nor text", r"chat.jsonl:2: neither a conversation .* nor text"),
    (
        {"messages": [{"role": "narrator", "content": "x"}, {"role": "assistant", "content": "y"}]},
        "unknown role",
        r"chat.jsonl:2: message 1 has role 'narrator'.*roles: system, user, assistant, tool",
    ),
    (
        {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "  "}]},
        "empty assistant turn",
        r"chat.jsonl:2: message 2 is an empty assistant turn",
    ),
    (
        {"messages": [{"role": "user", "content": "x"}]},
        "no assistant turn",
        r"chat.jsonl:2: no assistant turn.*loss_on=all",
    ),
    ({"conversations": [{"from": "human"}]}, "malformed ShareGPT", r"chat.jsonl:2: malformed ShareGPT record: turn 1"),
    ({"conversations": "hello"}, "malformed ShareGPT", r"chat.jsonl:2: malformed ShareGPT record"),
    ({"conversations": [{"from": "alien", "value": "x"}]}, "unknown role", r"chat.jsonl:2: ShareGPT turn 1 is from"),
]


@pytest.mark.parametrize(("record", "kind", "message"), BAD, ids=[f"{kind}-{i}" for i, (_, kind, _) in enumerate(BAD)])
def test_a_bad_record_names_file_and_line_or_is_counted_and_skipped(tmp_path, record, kind, message):
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CHAT}, record, {"messages": CHAT}])
    with pytest.raises(BadRecord, match=message):
        list(encoded_documents([str(data)], chat_tokenizer(), 512))
    counts = RecordCounts()
    kept = list(encoded_documents([str(data)], chat_tokenizer(), 512, skip_bad_records=True, counts=counts))
    assert len(kept) == 2 and counts.skipped == {kind: 1}


def test_a_long_conversation_is_cut_after_its_last_assistant_turn_that_fits():
    tokenizer = chat_tokenizer()
    full, _ = render_conversation(tokenizer, CHAT, "x")
    first, first_trained = render_conversation(tokenizer, CHAT[:3], "x")
    ids, trained, truncated = fit_conversation(tokenizer, CHAT, "x", len(full) - 1, "assistant")
    assert truncated and ids == first and trained == first_trained
    assert fit_conversation(tokenizer, CHAT, "x", len(first) - 1, "assistant") is None
    assert fit_conversation(tokenizer, CHAT, "x", len(full), "assistant") == (full, _, False)


def test_a_template_that_rewrites_earlier_turns_is_refused():
    tokenizer = byte_tokenizer()
    # The last turn alone gets a marker: no rendering extends the one before it.
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% if loop.last %}!{% endif %}{% endfor %}"
    with pytest.raises(BadRecord, match="does not render turn 3 as an extension"):
        render_conversation(tokenizer, CHAT, "f.jsonl:1")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = write_finetune_assets(tmp_path_factory.mktemp("chat"), context=64)
    tokenizer = chat_tokenizer()
    tokenizer.save_pretrained(root / "llama")
    chats = []
    for i in range(40):
        turns = [{"role": "user", "content": f"q{i} " * (1 + i % 3)}, {"role": "assistant", "content": f"a{i}" * 2}]
        chats.append({"messages": turns * (1 + i % 2)})
    write_jsonl(root / "chat.jsonl", chats + [{"text": "just text " * (1 + i % 4)} for i in range(10)])
    return root


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_a_packed_block_of_conversations_scores_as_its_conversations_one_by_one(assets, attention):
    model = AutoModelForCausalLM.from_pretrained(assets / "llama", dtype=torch.float32, attn_implementation=attention)
    blocks = load_document_blocks([str(assets / "chat.jsonl")], chat_tokenizer(), 64, cache_dir=assets / "cache")
    several = [i for i in range(len(blocks)) if blocks[i, 1].max() > 1][:3]
    assert several
    ids, positions, labels = packed_batch(blocks, several, "cpu")
    together = steps.forward_loss(model, ids, positions, shift_labels=labels) * (labels != -100).sum()
    alone = sum(total for total, _ in (one_by_one(model, blocks[row]) for row in several))
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-5)


def one_by_one(model, block):
    """``(summed loss, targets)`` of a packed block's documents, each alone at positions from 0."""
    ids_row, segments, trained = (torch.from_numpy(np.asarray(block[k], dtype=np.int64)) for k in range(3))
    total, count = torch.zeros(()), 0
    for number in range(1, int(segments.max()) + 1):
        doc, targets = ids_row[segments == number][None], trained[segments == number][None]
        doc_labels = torch.where(targets[:, 1:] == 1, doc[:, 1:], -100)
        doc_labels = torch.nn.functional.pad(doc_labels, (0, 1), value=-100)
        if (doc_labels != -100).any():
            loss = steps.forward_loss(model, doc, torch.arange(doc.shape[1])[None], shift_labels=doc_labels)
            total, count = total + loss * (doc_labels != -100).sum(), count + int((doc_labels != -100).sum())
    return total, count


def test_held_out_packed_blocks_score_as_their_documents_one_by_one(assets):
    """``eval_blocks`` with packing: each held-out block's loss is its documents' own, as they train."""
    model = AutoModelForCausalLM.from_pretrained(assets / "llama", dtype=torch.float32).eval()
    blocks = load_document_blocks([str(assets / "chat.jsonl")], chat_tokenizer(), 64, cache_dir=assets / "cache")
    held = blocks[-3:]
    result = steps.evaluate(model, held, Accelerator(cpu=True), dp_size=1, dp_rank=0, micro_batch_size=2)
    with torch.no_grad():
        means = [total / count for total, count in (one_by_one(model, block) for block in held) if count]
    assert len(means) > 1
    assert result["loss"] == pytest.approx(float(sum(means) / len(means)), rel=1e-5)


def test_a_packed_run_evaluates_its_held_out_blocks(assets, tmp_path):
    config = train_config(
        assets, tmp_path / "out", dataset=[str(assets / "chat.jsonl")], seq_len=64, global_batch_size=2, eval_blocks=2
    )
    record = json.loads((train(config).output_dir / "train_results.json").read_text())
    assert record["config"]["packing"] is True and record["config"]["eval_blocks"] == 2
    assert all(math.isfinite(record["eval"][phase]) and record["eval"][phase] > 1 for phase in ("before", "after"))


def test_a_run_on_conversations_trains_packed_and_records_what_it_read(assets, tmp_path):
    config = train_config(
        assets, tmp_path / "out", dataset=[str(assets / "chat.jsonl")], seq_len=64, global_batch_size=2
    )
    result = train(config)
    record = json.loads((result.output_dir / "train_results.json").read_text())
    assert record["config"]["packing"] is True
    assert record["records"]["dataset"]["conversations"] == 40 and record["records"]["dataset"]["texts"] == 10


def test_a_tokenizer_without_a_chat_template_is_refused_in_one_line(assets, tmp_path):
    model = tmp_path / "model"
    AutoModelForCausalLM.from_pretrained(assets / "llama").save_pretrained(model)
    byte_tokenizer().save_pretrained(model)
    args = ["--model", str(model), "--method", "yarn", "--factor", "2", "--dataset", str(assets / "chat.jsonl")]
    args += ["--output-dir", str(tmp_path / "out"), "--max-train-steps", "1", "--global-batch-size", "1"]
    args += ["--cache-dir", str(tmp_path / "cache")]
    done = subprocess.run(
        [sys.executable, "-m", "hf_posext", "finetune", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=SUBPROCESS_ENV,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "has no chat template" in done.stderr and "--chat-template FILE" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "out").exists()
    template = tmp_path / "chatml.jinja"
    template.write_text(CHATML)
    done = subprocess.run(
        [sys.executable, "-m", "hf_posext", "finetune", *args, "--chat-template", str(template)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=SUBPROCESS_ENV,
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_bad_record_stops_the_cli_in_one_line_with_nothing_written(assets, tmp_path):
    data = write_jsonl(tmp_path / "bad.jsonl", [{"messages": CHAT}, {"messages": [{"role": "user", "content": "x"}]}])
    args = ["--model", str(assets / "llama"), "--method", "yarn", "--factor", "2", "--dataset", str(data)]
    args += ["--output-dir", str(tmp_path / "out"), "--max-train-steps", "1", "--global-batch-size", "1"]
    args += ["--cache-dir", str(tmp_path / "cache")]
    done = subprocess.run(
        [sys.executable, "-m", "hf_posext", "finetune", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=SUBPROCESS_ENV,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"{data}:2: no assistant turn" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_packing_is_refused_with_pose(assets, tmp_path):
    with pytest.raises(ValueError, match="packing keeps every document at its own positions.*PoSE"):
        train_config(assets, tmp_path, packing=True, pose=True)


def test_packing_trains_whole_text_documents_at_their_own_positions(assets, tmp_path, monkeypatch):
    documents = write_jsonl(tmp_path / "docs.jsonl", [{"text": "w" * (5 + 3 * i)} for i in range(30)])
    seen = record_forward_loss(
        monkeypatch,
        lambda model, ids, positions, pose, kw, loss: (positions.clone(), kw.get("shift_labels")),
    )
    train(train_config(assets, tmp_path / "out", dataset=[str(documents)], seq_len=64, packing=True))
    for positions, labels in seen:
        restarts = (positions[:, 1:] == 0).sum()
        assert restarts > 0 and labels is not None, "several documents a sequence, each from position 0"
        assert (labels[positions.roll(-1, dims=1) == 0] == -100).all(), "no document predicts the next one's start"
