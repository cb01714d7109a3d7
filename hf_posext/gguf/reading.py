"""The rope a GGUF file holds, as hf-posext's loaders read it: every rope key honoured, or the file refused.

transformers' GGUF reader takes ``rope.freq_base`` and ``context_length`` and drops
``rope.scaling.*`` and the ``rope_freqs`` tensor: a GGUF that ``hf-posext patch`` extended (yarn x4,
say) loaded as plain RoPE. `gguf_rope_parameters` reads the rope as llama.cpp runs it
(`hf_posext.gguf.writer.base_config`, the reading a GGUF-to-GGUF patch composes on) and
`hf_posext.gguf.source.gguf_checkpoint` writes it into the conversion, so a patched GGUF loads
as the model it was written from. A file whose rope keys say two models (a key llama.cpp ignores that
disagrees with what it runs) or one hf-posext cannot express (an unknown scaling type, a scaling on
an architecture hf-posext does not read) is refused naming the file and the key, never run as plain RoPE.
"""

from __future__ import annotations

import math
import os
from typing import Any, NamedTuple

from ..rope_utils import yarn_mscale
from .rope import ARCHITECTURES, ROPE_FREQS
from .writer import architecture, base_config, open_gguf, read_rope

#: ``rope.scaling.*`` keys llama.cpp's llama/qwen2/qwen3 graphs do not read (docs/readers/llamacpp.md), with
#: the value each runs instead for yarn; ``yarn_attn_factor`` is checked against ``attn_factor`` x 0.1 ln s + 1.
IGNORED_YARN_KEYS = {"yarn_beta_fast": 32.0, "yarn_beta_slow": 1.0, "yarn_ext_factor": 1.0, "yarn_log_multiplier": 0.0}


def _field(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def rope_keys_problem(reader: Any) -> str | None:
    """Why the file's rope keys do not describe one model hf-posext can run, or ``None``.

    Checks the values llama.cpp reads (finite, positive; a known scaling type is checked where it is
    read), and the yarn keys the converter writes but llama.cpp ignores: each must equal what llama.cpp
    runs in its place, or the file holds two models (the converter's source and llama.cpp's).
    """
    arch = architecture(reader)
    rope = read_rope(reader)
    for key, value in (("rope.freq_base", rope.freq_base), ("rope.scaling.attn_factor", rope.attn_factor)):
        if not (math.isfinite(value) and value > 0):
            return f"{arch}.{key} = {value!r}: it must be a finite number > 0"
    for key, count in (
        ("context_length", rope.context_length),
        ("rope.scaling.original_context_length", rope.original_context_length),
    ):
        if count is not None and not int(count) > 0:
            return f"{arch}.{key} = {count!r}: it must be > 0"
    if rope.rope_freqs is not None and not all(math.isfinite(c) and c > 0 for c in rope.rope_freqs):
        return f"the {ROPE_FREQS} tensor holds a value that is not a finite number > 0: {list(rope.rope_freqs)}"
    if rope.scaling_type != "yarn":
        return None
    for name, runs in IGNORED_YARN_KEYS.items():
        value = _field(reader, f"{arch}.rope.scaling.{name}")
        if value is not None and not math.isclose(float(value), runs, rel_tol=1e-6, abs_tol=1e-9):
            return (
                f"{arch}.rope.scaling.{name} = {float(value)!r}, which llama.cpp's {arch} graph ignores (it runs "
                f"{runs!r}): the file holds two models. Re-export it from its checkpoint with `hf-posext gguf export` "
                "(which writes what llama.cpp reads)"
            )
    written = _field(reader, f"{arch}.rope.scaling.yarn_attn_factor")
    runs = rope.attn_factor * yarn_mscale(rope.factor)
    if written is not None and not math.isclose(float(written), runs, rel_tol=1e-5):
        return (
            f"{arch}.rope.scaling.yarn_attn_factor = {float(written)!r}, which llama.cpp ignores: it multiplies cos "
            f"and sin by rope.scaling.attn_factor x (0.1 ln s + 1) = {runs!r}, so the file holds two models. "
            "Re-export it from its checkpoint with `hf-posext gguf export` (which writes what llama.cpp reads)"
        )
    return None


def _is_plain(reader: Any, arch: str) -> bool:
    """Whether the file carries no rope beyond what transformers' GGUF reader takes (theta, context)."""
    kind = _field(reader, f"{arch}.rope.scaling.type")
    factor = _field(reader, f"{arch}.rope.scaling.factor") or _field(reader, f"{arch}.rope.scale_linear") or 0.0
    attention = _field(reader, f"{arch}.rope.scaling.attn_factor")
    return (
        not any(t.name == ROPE_FREQS for t in reader.tensors)
        and (kind in (None, "none") or (kind in ("linear", "yarn") and float(factor) in (0.0, 1.0)))
        and (attention is None or float(attention) == 1.0)
    )


class GGUFReading(NamedTuple):
    """The rope of a GGUF file as transformers config fields (`gguf_rope_parameters`)."""

    rope_parameters: dict[str, Any]
    max_position_embeddings: int
    rotary_dim: int

    def apply(self, config: Any) -> None:
        """Write the reading into ``config`` (transformers' reading of the same file), in place.

        ``partial_rotary_factor`` is set against ``config``'s own head dimension: transformers' reader
        takes a Llama's ``head_dim`` from ``rope.dimension_count``.
        """
        params = dict(self.rope_parameters)
        params.pop("partial_rotary_factor", None)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        if self.rotary_dim != head_dim:
            params["partial_rotary_factor"] = self.rotary_dim / head_dim
        config.rope_parameters = params
        config.max_position_embeddings = self.max_position_embeddings

    def record(self) -> dict[str, Any]:
        """What a conversion records of the reading (``gguf_source.json``'s ``rope``), JSON-ready."""
        return {"rope_parameters": self.rope_parameters, "max_position_embeddings": self.max_position_embeddings}


def gguf_rope_parameters(path: str | os.PathLike) -> GGUFReading | None:
    """The transformers ``rope_parameters`` and ``max_position_embeddings`` that run the GGUF's rope.

    ``None`` for a file of an architecture hf-posext does not read (`hf_posext.gguf.rope.ARCHITECTURES`)
    that carries no rope beyond ``rope.freq_base``: transformers' own reading of it is whole.

    Raises:
        ValueError: ``{path}: {key} ...``: a key out of range, keys that disagree, an unknown scaling type,
            ``longrope`` without factor tensors, a scaling on an architecture hf-posext does not read.
    """
    reader = open_gguf(path)
    try:
        arch = architecture(reader)
        if arch not in ARCHITECTURES:
            if _is_plain(reader, arch):
                return None
            raise ValueError(
                f"general.architecture = {arch!r} with rope scaling keys: hf-posext reads the rope of "
                f"{', '.join(ARCHITECTURES)} GGUFs only, and will not run this one as plain RoPE"
            )
        for key in ("attention.head_count", "embedding_length"):
            value = _field(reader, f"{arch}.{key}")
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{arch}.{key} = {value!r}: it must be an integer > 0")
        problem = rope_keys_problem(reader)
        if problem is not None:
            raise ValueError(problem)
        config = base_config(reader)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from err
    params = dict(config.rope_parameters)
    head_dim = int(config.head_dim)
    rotary_dim = round(head_dim * float(params.get("partial_rotary_factor", 1.0)))
    return GGUFReading(params, int(config.max_position_embeddings), rotary_dim)


__all__ = ["IGNORED_YARN_KEYS", "GGUFReading", "gguf_rope_parameters", "rope_keys_problem"]
