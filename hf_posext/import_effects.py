"""What ``import hf_posext`` changes in a process: `EFFECTS` lists each change, `install` makes them.

Each `Effect` says what it changes, why, and how to do without it; docs/import_effects.md is the long
form, and tests/test_import_effects.py keeps the page's list equal to `EFFECTS` and `EFFECTS` equal
to what an import really changes (it compares transformers, torch's hooks and ``sys.meta_path`` before and
after). Only the package's ``__init__.py`` calls `install`; nothing else of the package changes a
process at import.
"""

from __future__ import annotations

from dataclasses import dataclass

from .loading import set_construction_hook
from .methods.registry import register_with_transformers
from .post_import import REMOVED_IN, keep_moved_modules


@dataclass(frozen=True)
class Effect:
    """One change ``import hf_posext`` makes to a process.

    Attributes:
        name: its heading on docs/import_effects.md.
        touches: the objects it changes, as tests/test_import_effects.py names what it finds changed
            (``<rope type>`` and ``<attention>`` stand for each name the families register).
        why: what needs it.
        without: how to do without it.
    """

    name: str
    touches: tuple[str, ...]
    why: str
    without: str


RULE = "transformers.modeling_rope_utils.RotaryEmbeddingConfigMixin"

#: Every change ``import hf_posext`` makes, as docs/import_effects.md lists them.
EFFECTS = (
    Effect(
        "rope types",
        (
            "transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS[<rope type>]",
            f"{RULE}._validate_<rope type>_rope_parameters",
        ),
        "a config naming one of the package's rope types loads with plain transformers, and is checked as it loads",
        "none needed: only a config that names one of these types reaches them; a name transformers holds is refused",
    ),
    Effect(
        "attention functions",
        (
            "transformers.modeling_utils.AttentionInterface._global_mapping[<attention>]",
            "transformers.masking_utils.AttentionMaskInterface._global_mapping[<attention>]",
        ),
        "ALiBi and the position-remapping methods run as attention implementations, each with its mask",
        "none needed: only a model whose config._attn_implementation names one of them runs it",
    ),
    Effect(
        "wrapped longrope validator",
        (f"{RULE}._validate_longrope_rope_parameters",),
        "transformers would warn 'Unrecognized keys' for short_mscale / long_mscale, which the package writes for "
        "vLLM and SGLang, each time such a config is built",
        "set RotaryEmbeddingConfigMixin._validate_longrope_rope_parameters back to its __wrapped__",
    ),
    Effect(
        "module-construction hook",
        ("torch module registration hook: hf_posext.loading.on_submodule_registered",),
        "a saved checkpoint of a method with a surgery loads as saved with plain AutoModelForCausalLM.from_pretrained",
        "hf_posext.loading.set_construction_hook(False); such a checkpoint then loads without its surgery, and "
        "hf_posext.from_pretrained refuses it",
    ),
    Effect(
        "wrapped from_config",
        ("transformers.modeling_utils.PreTrainedModel._from_config",),
        "the construction hook patches a config it adopts a method for; from_config builds from a copy, so the "
        "caller's config is not changed",
        "hf_posext.loading.set_construction_hook(False) removes it with the hook",
    ),
    Effect(
        "DCA adoption",
        ("hf_posext.methods.dca: the load-time hook",),
        "a config that carries vLLM's dual_chunk_attention_config (Qwen2.5-7B/14B-Instruct-1M) builds with DCA, as "
        "vLLM runs it, instead of plain RoPE far past its chunk size",
        "delete config.dual_chunk_attention_config before building the model, or "
        "hf_posext.loading.set_construction_hook(False)",
    ),
    Effect(
        "post-import hook",
        ("sys.meta_path: hf_posext.post_import._PostImportFinder",),
        "the attention functions and the wrapped from_config reach transformers' modeling_utils and masking_utils "
        "when transformers imports them, so import hf_posext loads neither (half the time of import torch)",
        "import transformers.modeling_utils and transformers.masking_utils before hf_posext: nothing is left to "
        "wait for, and the finder is not installed",
    ),
    Effect(
        "moved-module aliases",
        ("sys.meta_path: hf_posext.post_import._MovedModuleFinder",),
        "code written against 0.1's module paths (hf_posext.gguf_export...) keeps importing, with a "
        f"DeprecationWarning naming the new path; the aliases go in {REMOVED_IN}",
        "import the new paths (python -W error::DeprecationWarning finds an old one); the finder answers only for "
        "the old paths",
    ),
)


def install() -> None:
    """Make the changes of `EFFECTS` (``hf_posext/__init__.py`` calls it, once)."""
    register_with_transformers()  # rope types, attention functions, the wrapped longrope validator
    set_construction_hook(True)  # the construction hook, the wrapped from_config, DCA adoption
    keep_moved_modules()  # the moved-module aliases


__all__ = ["EFFECTS", "Effect", "install"]
