"""Test helpers, imported as ``tests.helpers.<module>`` (pytest puts the repository root on ``sys.path``).

models.py (tiny models, re-exported from scripts/tiny_models.py; token batches, one-thread runs),
finetune.py (the tiny fine-tune's assets and TrainConfig, the ``finetune_assets`` fixture's),
training_free_reference.py (float64 references from the authors' code), ruler_*.py, gguf_files.py,
plugins.py. What the benchmarks build too lives in scripts/ (``scripts.registry``, ``scripts.vanilla``,
``scripts.sweep``, and the other readers' environments ``scripts.transformers4_env`` and
``scripts.llamacpp_env``): benchmarks import nothing from tests/.
"""

from pathlib import Path

#: The repository's root folder.
ROOT = Path(__file__).resolve().parents[2]
