"""Extend a model's context with YaRN, generate with the KV cache, save and reload.

    python examples/quickstart.py                        # a tiny random Llama, seconds on a laptop
    python examples/quickstart.py --model path/to/llama-2-7b --factor 4

With a real checkpoint the saved folder loads in vanilla transformers (and vLLM): YaRN is written
as transformers' native ``rope_type="yarn"``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

import hf_posext
from hf_posext.commands.arguments import run_command


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="checkpoint folder or Hub id; default: a tiny random Llama")
    parser.add_argument("--method", default="yarn", choices=hf_posext.available_methods())
    parser.add_argument("--factor", type=float, help="context scale s; default 4, none for alibi, sinusoidal, learned")
    args = parser.parse_args()

    if args.model:
        model = AutoModelForCausalLM.from_pretrained(args.model)
    else:
        config = LlamaConfig(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
        )
        model = AutoModelForCausalLM.from_config(config)
    model.eval()

    factor = args.factor
    if factor is None and hf_posext.method_class(args.method).takes_factor:
        factor = 4
    hf_posext.patch_model(model, args.method, factor=factor)
    print(hf_posext.patch_info(model))

    length = model.config.max_position_embeddings
    prompt = torch.randint(0, model.config.vocab_size, (1, length - 32))
    out = model.generate(prompt, max_new_tokens=16, do_sample=False, pad_token_id=0)
    print(f"generated {out.shape[1] - prompt.shape[1]} tokens after a {prompt.shape[1]}-token prompt")

    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        reloaded = AutoModelForCausalLM.from_pretrained(folder).eval()
        with torch.no_grad():
            same = torch.allclose(reloaded(prompt).logits, model(prompt).logits, atol=1e-5)
        print(f"reloaded from {folder}: rope_parameters={reloaded.config.rope_parameters}, same logits: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(run_command("quickstart", main))  # bad input: one line on stderr, exit code 2
