"""The YaRN-style fine-tune recipe: patch -> data -> train -> save, on one or many devices.

Settings (:mod:`.config`), the pre-flight plan (:mod:`.plan`), the loop (:mod:`.loop`), training
states (:mod:`.checkpointing`), the final checkpoint (:mod:`.final_checkpoint`), LoRA (:mod:`.lora`), PoSE
(:mod:`.pose`), the chunked loss (:mod:`.loss`). Nothing runs on import; how to run it:
docs/guides/finetune.md, internals: docs/notes/training.md.
"""
