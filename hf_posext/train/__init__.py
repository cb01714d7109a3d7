"""The YaRN-style fine-tune recipe: patch -> data -> train -> save, on one or many devices.

Library code behind ``hf-posext finetune`` (:mod:`hf_posext.commands.finetune`); nothing here runs on import. Its
data (BOS/EOS-separated, fixed-length, cached blocks in a resumable order) comes from
:mod:`hf_posext.data`, shared with the evaluations.

* :mod:`.config` - :class:`~.config.TrainConfig`, the settings (YaRN paper defaults), checked early;
* :mod:`.plan` - lengths and batch arithmetic checked against the patched model, before training;
* :mod:`.loop` - :class:`~.loop.FinetuneRecipe` (setup, train step, save, cleanup) and :func:`~.loop.train`;
* :mod:`.steps` - the training loss of a batch and the held-out evaluation;
* :mod:`.distributed` - the ``Accelerator`` (CPU, one GPU, DDP, FSDP2, ZeRO-3, CP) and the data-parallel layout;
* :mod:`.checkpointing` - atomic, resumable training states;
* :mod:`.export` - the final checkpoint: gathered, LoRA merged, model card, ``train_results.json``;
* :mod:`.lora` - LongLoRA-style PEFT LoRA plus trainable embeddings and norms, merged on save;
* :mod:`.pose` - PoSE skip-wise position ids (train a long context with short windows).

The guide, with the laptop run: docs/guides/finetune.md.
"""
