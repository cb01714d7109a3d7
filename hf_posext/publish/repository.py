"""What a model repository holds: the files the checkpoint writers own and ``hf-posext push`` uploads."""

#: What a model repository needs, as name patterns: weights, config, generation config, tokenizer
#: files, custom code of ``trust_remote_code`` models, the model card and the recipe's results.
#: ``hf-posext push`` uploads these (unless told otherwise) and the checkpoint writers own them
#: (with ``--overwrite`` they replace these files of an existing folder and keep the others).
#: Where a LoRA fine-tune keeps its adapter inside the merged checkpoint (PEFT's files).
ADAPTER_FOLDER = "adapter"
MODEL_REPO_FILES = (
    "*.safetensors",
    "*.safetensors.index.json",
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "spiece.model",
    "chat_template.jinja",
    "chat_template.json",
    "configuration_*.py",
    "modeling_*.py",
    "tokenization_*.py",
    "README.md",
    "train_results.json",
    ADAPTER_FOLDER,
)


__all__ = ["ADAPTER_FOLDER", "MODEL_REPO_FILES"]
