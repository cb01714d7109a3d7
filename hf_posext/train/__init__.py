"""The YaRN-style fine-tune recipe: patch -> data -> train -> save, on one or many devices.

Library code behind ``hf-posext finetune``: settings (`config`), the pre-flight plan
(`plan`), the recipe (`loop`: `loop.FinetuneRecipe` with setup / train step /
save / cleanup, and `loop.train`), each micro-batch's contents (`micro_batches`), the
window schedule (`schedule`), a batch's loss and evaluation (`steps`), the accelerator
(`distributed`), resumable training states (`saved_state`) and what a resume must share
with them (`resume`), sequence parallelism (`sequence_parallel`), the final model written to
the output folder (`final_model`), LoRA (`lora`), PoSE (`pose`), the chunked loss
(`loss`).
Nothing runs on import. The guide: docs/guides/finetune.md; internals: docs/notes/training.md.
"""
