"""Fine-tune a model for a longer context (YaRN recipe by default): patch -> data -> train -> save.

Thin wrapper over :mod:`hf_posext.train`; every flag is also a key of the ``--config`` YAML file
(``python scripts/finetune.py --help`` lists them with their defaults, the YaRN paper's).

Laptop / CPU (about a minute, a tiny local model, no download)::

    python scripts/make_tiny_model.py out/tiny-llama
    python scripts/finetune.py --config examples/finetune_tiny.yaml

One GPU::

    accelerate launch --config_file examples/accelerate/single_gpu.yaml scripts/finetune.py \\
        --model meta-llama/Llama-2-7b-hf --method yarn --factor 16 --seq-len 8192 \\
        --dataset emozilla/pg19 --output-dir llama-2-7b-yarn --lora

Many GPUs (FSDP2; also ddp.yaml, deepspeed_zero3.yaml, context_parallel.yaml)::

    accelerate launch --config_file examples/accelerate/fsdp2.yaml scripts/finetune.py \\
        --model meta-llama/Llama-2-7b-hf --method yarn --factor 16 \\
        --dataset emozilla/pg19 --output-dir llama-2-7b-yarn-64k --checkpointing-steps 50

Bad input (a setting, a file, a dataset) is reported in one line with exit code 2, including
what ``train()`` finds only once it runs; ``HF_POSEXT_DEBUG=1`` shows the traceback.

Resume after a crash or pre-emption: run the same command with ``--resume``. Publish with
``hf-posext push llama-2-7b-yarn-64k my-org/llama-2-7b-yarn-64k``.
"""

from __future__ import annotations

import sys

from hf_posext.commands.arguments import run_command
from hf_posext.commands.finetune import config_from_args
from hf_posext.train.loop import train


def _run(argv: list[str] | None) -> int:
    config = config_from_args(argv, description=__doc__.split("\n\n")[0])
    result = train(config)
    print(f"wrote {result.output_dir} ({result.steps} steps, final loss {result.final_loss:.4f})")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_command("finetune", lambda: _run(argv))


if __name__ == "__main__":
    sys.exit(main())
