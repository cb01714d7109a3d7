"""A tiny Llama that has learned RULER's niah_single_1, for the end-to-end test.

The tokenizer is word-level (words with their leading space, punctuation and single digits;
3.7k tokens), so a 256-token cell of the task holds a 128-token prompt; the model (2 layers,
64 wide, 0.3M parameters) is trained on fitted prompts of the suite itself (other seeds than the
evaluation's), with the loss on the 7 answer digits only: an induction-head task. Measured: 500
steps, 90% [70, 97] on 20 prompts vs 0% [0, 16] for the same model untrained; training took
375 s and the whole test 574 s on 2 cores shared with a load of ~14; the test took 204 s at a load of ~7.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from hf_posext.eval.ruler import TASKS, fit_prompt, wrapper_for
from hf_posext.eval.ruler.haystack import NOISE, vocabulary
from hf_posext.eval.ruler.tasks import stratified_depth


def word_tokenizer() -> PreTrainedTokenizerFast:
    draft = TASKS["niah_single_1"].build("vocab", 2, 0.5, 256)
    text = draft.prompt(10**6) + draft.answer_prefix + " " + NOISE
    # Words carry their leading space ("▁green"), digits and punctuation are tokens of their own.
    pre = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split("\n", "isolated"),
            pre_tokenizers.Metaspace(prepend_scheme="never"),
            pre_tokenizers.Punctuation(),
            pre_tokenizers.Digits(individual_digits=True),
        ]
    )
    words = (
        {w for w, _ in pre.pre_tokenize_str(text)}
        | {p + w for w in vocabulary() for p in ("", "\u2581")}
        | set("0123456789-.:?\n\u2581")
    )
    vocab = {w: i for i, w in enumerate(["<unk>", "<pad>", "</s>", *sorted(words)])}
    model = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    model.pre_tokenizer = pre
    model.decoder = decoders.Metaspace(prepend_scheme="never")
    return PreTrainedTokenizerFast(tokenizer_object=model, unk_token="<unk>", pad_token="<pad>", eos_token="</s>")


def train_retriever(tokenizer, length: int = 256, steps: int = 500, batch: int = 16, seed: int = 0):
    """``(trained, untrained)``: the same initial weights before and after training."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=length,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    untrained = LlamaForCausalLM(config)
    untrained.load_state_dict(model.state_dict())
    wrapper = wrapper_for(tokenizer, False)
    task = TASKS["niah_single_1"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=steps, pct_start=0.1)
    hint = None
    for step in range(steps):
        rows, labels = [], []
        for b in range(batch):
            key = f"train/{step}/{b}"
            prompt = fit_prompt(
                tokenizer, task, length, key, stratified_depth(b, batch, key), wrapper=wrapper, hint=hint
            )
            hint = prompt.units
            answer = tokenizer.encode(" " + prompt.answers[0], add_special_tokens=False)
            rows.append(prompt.input_ids + answer)
            labels.append([-100] * (len(prompt.input_ids) - 1) + answer + [-100])
        ids = torch.tensor(rows)
        loss = model(input_ids=ids, labels=torch.tensor(labels)).loss
        loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
    return model.eval(), untrained.eval()
