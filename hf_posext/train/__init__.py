"""The YaRN-style fine-tune recipe: patch -> data -> train -> save, on one or many devices.

Library code behind ``scripts/finetune.py`` (a thin wrapper); nothing here runs on import. Its
data (BOS/EOS-separated, fixed-length, cached blocks in a resumable order) comes from
:mod:`hf_posext.data`, shared with the evaluations.

* :mod:`.config` - :class:`~.config.TrainConfig`, the settings (YaRN paper defaults), checked early;
* :mod:`.cli` - the flags: ``transformers.HfArgumentParser`` over ``TrainConfig`` (a YAML file takes the same keys);
* :mod:`.plan` - lengths and batch arithmetic checked against the patched model, before training;
* :mod:`.loop` - :func:`~.loop.train` through accelerate (CPU, one GPU, DDP, FSDP2, ZeRO-3, CP);
* :mod:`.checkpointing` - atomic, resumable training states;
* :mod:`.export` - the final checkpoint: gathered, LoRA merged, model card, ``train_results.json``;
* :mod:`.lora` - LongLoRA-style PEFT LoRA plus trainable embeddings and norms, merged on save;
* :mod:`.pose` - PoSE skip-wise position ids (train a long context with short windows);

Laptop run (about a minute on two CPU cores; the tiny checkpoint comes from :mod:`hf_posext.testing`)::

    python scripts/make_tiny_model.py out/tiny-llama --max-position-embeddings 64
    python scripts/finetune.py --config examples/finetune_tiny.yaml
"""
