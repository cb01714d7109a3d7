"""The YaRN-style fine-tune recipe: patch -> data -> train -> save, on one or many devices.

Library code behind ``hf-posext finetune``: settings (:mod:`.config`), the pre-flight plan
(:mod:`.plan`), the recipe (:mod:`.loop`: :class:`~.loop.FinetuneRecipe` with setup / train step /
save / cleanup, and :func:`~.loop.train`), each micro-batch's contents (:mod:`.micro_batches`), the
window schedule (:mod:`.schedule`), a batch's loss and evaluation (:mod:`.steps`), the accelerator
(:mod:`.distributed`), resumable training states (:mod:`.saved_state`) and what a resume must share
with them (:mod:`.resume`), sequence parallelism (:mod:`.sequence_parallel`), the final model written to
the output folder (:mod:`.final_model`), LoRA (:mod:`.lora`), PoSE (:mod:`.pose`), the chunked loss
(:mod:`.loss`).
Nothing runs on import. The guide: docs/guides/finetune.md; internals: docs/notes/training.md.
"""
