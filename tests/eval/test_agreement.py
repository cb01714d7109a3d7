"""The chat tax's measurements: held-out instructions, greedy answers, agreement and answer log-likelihood.

What it promises: the instructions come from the standard library's held-out split only, so no
recipe trained on ``stdlib`` (the train split) has read them; a model agrees with itself on every
instruction; the answer log-likelihood is the mean of the answer tokens' log-probabilities after
the chat prompt; chat passkeys are asked through the template and fit their length.
"""

from __future__ import annotations

import pytest
import torch

from hf_posext.data import stdlib_files
from hf_posext.eval.agreement import (
    agreement,
    answer_loglik,
    chat_prompt_ids,
    docstring_instructions,
    greedy_answers,
    self_distilled_conversations,
)
from hf_posext.eval.passkey import build_prompt, chat_text, fit_filler, passkey_accuracy
from hf_posext.testing import byte_tokenizer
from tests.helpers.models import tiny_model
from tests.helpers.ruler_tokenizers import CHATML


@pytest.fixture
def tokenizer():
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = CHATML
    return tokenizer


def test_instructions_come_from_held_out_functions_only():
    held_out = docstring_instructions("test", 20)
    trained = docstring_instructions("train", 200, seed=1)
    assert len(set(held_out)) == 20 and not set(held_out) & set(trained)
    assert all(text.startswith("```python\ndef ") for text in held_out)
    train_text = "".join(path.read_text(errors="replace") for path in stdlib_files("train"))
    signatures = [text.splitlines()[1] for text in held_out]
    assert sum(signature[4:] in train_text for signature in signatures) < len(signatures), "held-out sources"
    with pytest.raises(ValueError, match="fewer than"):
        docstring_instructions("test", 10**6)


def test_a_model_agrees_with_itself_and_the_loglik_is_the_answer_tokens_mean(tokenizer):
    model = tiny_model(vocab_size=len(tokenizer)).eval()
    prompts = docstring_instructions("test", 3)
    answers = greedy_answers(model, tokenizer, prompts, max_new_tokens=4)
    assert agreement(greedy_answers(model, tokenizer, prompts, max_new_tokens=4), answers) == 1.0
    assert agreement([[1], [2]], [[1], [3]]) == 0.5
    prompt = chat_prompt_ids(tokenizer, prompts[0])
    ids = torch.tensor([prompt + answers[0]])
    logprobs = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    expected = torch.stack([logprobs[len(prompt) - 1 + i, t] for i, t in enumerate(answers[0])]).mean()
    assert answer_loglik(model, tokenizer, prompts[0], answers[0]) == pytest.approx(float(expected), abs=1e-5)
    with pytest.raises(ValueError, match="2 answers for 1 references"):
        agreement([[1], [2]], [[1]])


def test_self_distilled_conversations_hold_the_models_own_answers(tokenizer):
    model = tiny_model(vocab_size=len(tokenizer)).eval()
    prompts = docstring_instructions("train", 2, seed=1)
    for record, prompt in zip(self_distilled_conversations(model, tokenizer, prompts, max_new_tokens=6), prompts):
        user, assistant = record["messages"]
        assert user == {"role": "user", "content": prompt} and assistant["role"] == "assistant"
        assert assistant["content"] and assistant["content"] == assistant["content"].strip()


def test_chat_passkeys_are_asked_through_the_template_and_fit_their_length(tokenizer):
    n = fit_filler(tokenizer, 400, chat=True)
    text = chat_text(tokenizer, build_prompt(50000, n, 0.5))
    assert text.startswith("<|im_start|>user\n") and text.endswith("The pass key is<|im_end|>\n<|im_start|>assistant\n")
    assert len(tokenizer.encode(text, add_special_tokens=False)) <= 400
    assert len(tokenizer.encode(chat_text(tokenizer, build_prompt(50000, n + 1, 0.5)), add_special_tokens=False)) > 400
    result = passkey_accuracy(
        tiny_model(vocab_size=len(tokenizer)), tokenizer, [400], [0.5], 1, progress=False, chat=True
    )
    assert result.prompt_tokens[0] <= 400 and len(result.samples) == 1
