"""Test helpers, imported as ``tests.helpers.<module>`` (pytest puts the repository root on ``sys.path``).

models.py (tiny models of every architecture, one-thread runs), finetune.py (the tiny fine-tune's
assets and TrainConfig, the ``finetune_assets`` fixture's), vanilla.py (what plain transformers
loads), registry.py (the architecture table), training_free_reference.py (float64 references from the
authors' code), ruler_*.py, and the cached environments of other readers: transformers4_env.py
(transformers 4.57) and llamacpp_env.py (a compiled llama.cpp).
"""

from pathlib import Path

#: The repository's root folder.
ROOT = Path(__file__).resolve().parents[2]
