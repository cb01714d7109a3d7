"""What the commands read (a checkpoint's config and weights), checked as strictly as what is typed.

The checks of a model source (typed values: `hf_posext.validation`): `check_rope_config`
(every rope field of a config, its attention shapes, and its ``hf_posext`` record, in type, range and presence),
`read_config` (a checkpoint's ``config.json`` checked as written, read by transformers and then checked,
every error naming the file: the commands' way in), `check_model_config` (the same for a model being
built: the construction hook's and [`hf_posext.from_pretrained`][hf_posext.from_pretrained]'s way in),
`check_weight_files` (a sharded checkpoint's index against its shards, every safetensors
header against its file's size) and `check_device`. Each raises ``ValueError`` naming the
bad value and what is allowed, which the commands print as one line with exit code 2
(`hf_posext.commands.arguments.run_command`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedConfig

from ..method_names import METHODS, registered_name
from ..rope_utils import CONFIG_KEY, layer_config, pair_count, per_layer_values
from .rope_entry import check_rope_entry, is_whole
from .unknown_method import refuse_unknown_method, rope_types_of, unknown_method

#: The attention shapes a config's rope is built on (absent or None: the model's own default).
_SHAPE_KEYS = ("head_dim", "hidden_size", "num_attention_heads", "num_key_value_heads")


def _entries(rope_parameters: Any, layer_types: list[str], field: str = "rope_parameters") -> list[tuple[Any, ...]]:
    """``(where, entry, layer type or None)`` of each rope entry."""
    if layer_types:
        keys = [key for key in layer_types if rope_parameters[key] is not None]
        return [(f"{field}[{key!r}]", rope_parameters[key], key) for key in keys]
    return [(field, rope_parameters, None)]


def _entry_pairs(config: Any, entry: Any, layer_type: str | None, count: bool) -> int | None:
    return pair_count(layer_config(config, layer_type), entry if isinstance(entry, dict) else {}) if count else None


def check_rope_config(
    config: PreTrainedConfig, unknown_types: bool = False, field: str = "rope_parameters", count_pairs: bool = True
) -> None:
    """Every rope field of ``config`` and of its ``hf_posext`` record, in type, range and presence.

    Args:
        unknown_types: leave entries of an unregistered rope type to transformers (`check_rope_entry`).
        field: how the messages name ``config.rope_parameters`` (``rope_scaling``: the legacy field of a file).
        count_pairs: check per-pair lists' lengths (``False``: the head widths are per layer and unknown here).

    Raises:
        ValueError: naming the field, its value and what is allowed.
    """
    max_positions = getattr(config, "max_position_embeddings", None)
    if max_positions is not None and not (is_whole(max_positions) and max_positions >= 1):
        raise ValueError(f"max_position_embeddings must be a positive integer, got {max_positions!r}")
    for key in _SHAPE_KEYS:  # the rotary's width comes from them (a negative head_dim built a tensor of -64 rows)
        for value in per_layer_values(config, key):
            if value is not None and not (is_whole(value) and value >= 1):
                raise ValueError(f"{key} must be a positive integer (an attention shape), got {value!r}")
    params = getattr(config, "rope_parameters", None)
    if params is None:
        if getattr(config, CONFIG_KEY, None) is not None:
            check_record(getattr(config, CONFIG_KEY), rope_types=["default"])
        return
    if not isinstance(params, dict):
        raise ValueError(f"{field} must be a mapping of rope fields (rope_type, rope_theta, ...), got {params!r}")
    layer_types = (
        list(config.nested_rope_parameter_keys(params)) if hasattr(config, "nested_rope_parameter_keys") else []
    )

    def top_level(key: str) -> Any:
        value = getattr(config, key, None)
        if value is None and key == "original_max_position_embeddings":
            return max_positions  # what transformers reads it as when an entry lacks it
        return value

    for where, entry, layer_type in _entries(params, layer_types, field):
        check_rope_entry(entry, _entry_pairs(config, entry, layer_type, count_pairs), where, top_level, unknown_types)
    record = getattr(config, CONFIG_KEY, None)
    if record is None:
        return
    check_record(record, rope_types=rope_types_of(config))
    base = record.get("base_rope_parameters")
    if base is not None:
        for where, entry, layer_type in _entries(
            base, [k for k in layer_types if isinstance(base, dict) and k in base]
        ):
            check_rope_entry(
                entry,
                _entry_pairs(config, entry, layer_type, count_pairs),
                f"{CONFIG_KEY}['base_rope_parameters']" + where.removeprefix("rope_parameters"),
                top_level,
            )


#: The record's own keys beside the method's fields: what each must be (a test, and how it is said).
_RECORD_KEYS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "context_length": (lambda v: is_whole(v) and v >= 1, "a positive integer"),
    "base_max_position_embeddings": (lambda v: is_whole(v) and v >= 1, "a positive integer"),
    "base_original_max_position_embeddings": (lambda v: is_whole(v) and v >= 1, "a positive integer"),
    "base_rope_parameters": (lambda v: isinstance(v, dict), "a mapping of rope fields"),
    "base_reader_fields": (lambda v: isinstance(v, dict), "a mapping of config fields"),
    "base_config_fields": (lambda v: isinstance(v, dict), "a mapping of config fields"),
    "base_attn_implementation": (lambda v: v is None or isinstance(v, str), "an attention implementation name"),
    "composed_on": (lambda v: isinstance(v, str), "a rope type name"),
    "layer_types": (lambda v: isinstance(v, list) and all(isinstance(t, str) for t in v), "a list of layer types"),
}


def check_record(record: Any, rope_types: list[Any] | None = None) -> None:
    """A config's ``hf_posext`` record: a known method, its arguments checked as typed ones, its own keys.

    The method's arguments are checked by the method's config class, as the arguments a user passes
    to ``patch_model`` are (its ``__post_init__``). An unregistered method passes where the config's
    ``rope_types`` are all transformers' own (`unknown_method`: a plugin not imported).

    Raises:
        ValueError: naming the record's key, its value and what is allowed.
    """
    if not isinstance(record, dict) or not isinstance(record.get("method"), str):
        raise ValueError(
            f"{CONFIG_KEY} (the record of an hf-posext patch) must be a mapping with a 'method', got {record!r}"
        )
    for key, (valid, allowed) in _RECORD_KEYS.items():
        if key in record and not valid(record[key]):
            raise ValueError(f"{CONFIG_KEY}['{key}'] must be {allowed}, got {record[key]!r}")
    if unknown_method(record) is not None:
        refuse_unknown_method(record["method"], rope_types)
        return
    method_cls = METHODS[registered_name(record["method"])]  # names the known methods
    fields = {field.name for field in dataclasses.fields(method_cls)}
    try:
        method_cls(**{key: value for key, value in record.items() if key in fields})  # as method_config builds it
    except (ValueError, TypeError) as err:
        raise ValueError(f"{CONFIG_KEY} (the record of an hf-posext patch): {err}") from None


def config_source(config: Any) -> str:
    """How messages name where ``config`` was read: its folder's ``config.json``, its Hub id, or "the config"."""
    name = str(getattr(config, "name_or_path", "") or "")
    if not name:
        return "the model's config"
    return str(Path(name) / "config.json") if Path(name).is_dir() else name


def check_model_config(config: PreTrainedConfig, unknown_types: bool = False) -> None:
    """The check of every load path: the config a model is built from, and the ``config.json`` it was read from.

    The construction hook and [`hf_posext.from_pretrained`][hf_posext.from_pretrained] run it; the commands run the same
    checks through `read_config`. The file is checked as written (`check_config_file`):
    transformers reads one of ``rope_parameters`` and the legacy ``rope_scaling`` when a file has both.

    Raises:
        ValueError: ``"<folder>/config.json: <field> must be ..., got ..."``.
    """
    name = str(getattr(config, "name_or_path", "") or "")
    try:
        if name and (Path(name) / "config.json").is_file():
            check_config_file(Path(name) / "config.json")
        check_rope_config(config, unknown_types)
    except ValueError as err:
        raise ValueError(f"{config_source(config)}: {err}") from None


def check_config_file(file: Path) -> None:
    """Every rope field ``config.json`` holds as written, before transformers reads it: the record, ``rope_parameters``
    and the legacy ``rope_scaling`` (each a value read from the checkpoint, whichever a reader takes).

    Entries of a rope type transformers renames in its model configs (Phi-3's ``su``) are left to it. A
    file that is not a JSON object is left to transformers too (its error is the more precise).

    Raises:
        ValueError: naming the field (without the file: the callers name it).
    """
    try:
        raw = json.loads(file.read_text())
    except (OSError, ValueError):
        return
    if not isinstance(raw, dict):
        return
    for field in ("rope_parameters", "rope_scaling"):
        if field not in raw and not (field == "rope_parameters" and "rope_scaling" not in raw):
            continue
        bare = PreTrainedConfig.__new__(PreTrainedConfig)
        bare.__dict__.update(raw)
        rope = raw.get(field)
        if isinstance(rope, dict) and not any(isinstance(v, dict) for v in rope.values()):
            # transformers 4's layout (Phi-4-mini, StableLM): theta and the partial rotary factor at the top level
            rope = {key: raw[key] for key in ("rope_theta", "partial_rotary_factor") if key in raw} | rope
        bare.__dict__["rope_parameters"] = rope
        try:
            # per-layer fields (Gemma 4's per_layer_config: head_dim) are resolved by transformers' reading only
            check_rope_config(bare, unknown_types=True, field=field, count_pairs=not raw.get("per_layer_config"))
        except ValueError:
            raise
        except Exception:  # noqa: BLE001, S112
            continue  # a layout the bare reading does not know: transformers' reading and the config's check decide


def check_checkpoint_file(source: str | os.PathLike) -> None:
    """`check_config_file` on a local checkpoint folder's ``config.json`` (else nothing), before transformers
    reads it: its warnings, and its own errors (a strict field's type: two lines naming no file), come after.

    Raises:
        ValueError: ``"<folder>/config.json: <field> must be ..., got ..."``.
    """
    file = Path(source) / "config.json"
    if file.is_file():
        try:
            check_config_file(file)
        except ValueError as err:
            raise ValueError(f"{file}: {err}") from None


def read_config(source: str | os.PathLike, **kwargs: Any) -> PreTrainedConfig:
    """``AutoConfig.from_pretrained(source)``, checked before and after as `check_model_config` does; errors
    name ``config.json``.

    Raises:
        ValueError: a bad field (naming it and the file), or a config transformers cannot read.
        OSError: no config to read.
    """
    folder = Path(source)
    where = str(folder / "config.json") if folder.is_dir() else str(source)
    check_checkpoint_file(folder)
    try:
        from transformers import AutoConfig  # here: the Auto mappings cost a tenth of import torch

        config = AutoConfig.from_pretrained(source, **kwargs)
    except OSError:
        raise
    except Exception as err:  # transformers' own validation: KeyError, TypeError, ZeroDivisionError...
        raise ValueError(f"{where}: transformers cannot read this config: {type(err).__name__}: {err}") from err
    try:
        check_rope_config(config)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from err
    return config


def _safetensors_problem(path: Path) -> str | None:
    """Why ``path`` is not a complete safetensors file (its header against its size), or None."""
    size = path.stat().st_size
    if size == 0:
        return "is empty (0 bytes)"
    if size < 8:
        return f"is {size} bytes, shorter than a safetensors header"
    with path.open("rb") as handle:
        length = int.from_bytes(handle.read(8), "little")
        if length > size - 8:
            return f"has a header of {length} bytes in a file of {size} (truncated or not safetensors)"
        try:
            header = json.loads(handle.read(length))
        except ValueError:
            return "has an unreadable header (not safetensors, or damaged)"
    if not isinstance(header, dict):
        return "has an unreadable header (not safetensors, or damaged)"
    try:
        end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"), default=0)
    except (TypeError, KeyError, IndexError, ValueError):
        return "has an unreadable header (not safetensors, or damaged)"
    if 8 + length + end != size:
        return f"is {size} bytes, its header describes {8 + length + end} (truncated or changed)"
    return None


def _tensor_names(path: Path) -> set[str]:
    with path.open("rb") as handle:
        length = int.from_bytes(handle.read(8), "little")
        return set(json.loads(handle.read(length))) - {"__metadata__"}


def check_weight_files(folder: str | os.PathLike) -> None:
    """A local checkpoint's weights are all there and whole: index against shards, safetensors headers against sizes.

    Raises:
        ValueError: naming the missing, empty, truncated or unreadable file.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return
    indexes = [*folder.glob("*.safetensors.index.json"), *folder.glob("*.bin.index.json")]
    for index in sorted(indexes):
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            shards = {str(name) for name in weight_map.values()}
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"{index}: not a readable weight index ({type(err).__name__}: {err})") from None
        for shard in sorted(shards):
            if not (folder / shard).is_file():
                raise ValueError(
                    f"{folder / shard} is missing: {index.name} names it for "
                    f"{sum(v == shard for v in weight_map.values())} tensors"
                )
        for shard in sorted(s for s in shards if s.endswith(".safetensors")):
            problem = _safetensors_problem(folder / shard)
            if problem is None:
                missing = {k for k, v in weight_map.items() if v == shard} - _tensor_names(folder / shard)
                if missing:
                    problem = f"lacks {len(missing)} tensors {index.name} puts there (e.g. {sorted(missing)[0]})"
            if problem:
                raise ValueError(f"{folder / shard} {problem}")
    for path in sorted(folder.glob("*.safetensors")):
        problem = _safetensors_problem(path)
        if problem:
            raise ValueError(f"{path} {problem}")


def check_device(device: str) -> None:
    """``auto``, or a device this machine has (``cpu``, ``cuda``, ``cuda:1``, ``mps``...).

    Raises:
        ValueError: an unknown device name, or one this machine lacks.
    """
    if device == "auto":
        return
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"--device {device}: not a device name (auto, cpu, cuda, cuda:1, mps...)") from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(
                f"--device {device}: this machine has no CUDA device (torch {torch.__version__}); "
                "use --device cpu or auto"
            )
        if parsed.index is not None and parsed.index >= count:
            raise ValueError(f"--device {device}: this machine has {count} CUDA device(s), cuda:0..cuda:{count - 1}")
    if parsed.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"--device {device}: MPS is not available on this machine; use --device cpu or auto")


__all__ = [
    "check_checkpoint_file",
    "check_config_file",
    "check_device",
    "check_model_config",
    "check_record",
    "check_rope_config",
    "check_rope_entry",
    "check_weight_files",
    "config_source",
    "read_config",
]
