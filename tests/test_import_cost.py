"""``import hf_posext`` and ``hf-posext --help`` load no heavy module, and still register everything (issue 33, 10).

Structural, not timed (benchmarks/bench_import.py times it): each check runs in a fresh
interpreter and reads ``sys.modules``. Registration with transformers is kept: rope types at
once, attention functions when transformers' ``modeling_utils`` / ``masking_utils`` are imported,
whichever of the two imports comes first.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: What neither ``import hf_posext`` nor ``hf-posext --help`` may load: transformers' model, mask,
#: cache, generation, Auto and slow-tokenizer machinery, the fine-tuning and GGUF dependencies, torch's
#: compiler, the package's training and checkpoint-loading code (and, by prefix, :data:`NOT_LOADED`).
HEAVY = (
    "transformers.modeling_utils",
    "transformers.masking_utils",
    "transformers.cache_utils",
    "transformers.generation.utils",
    "transformers.models.auto.configuration_auto",
    "transformers.convert_slow_tokenizer",
    "peft",
    "accelerate",
    "gguf",
    "datasets",
    "matplotlib",
    "torch._dynamo",
    "hf_posext.train",
    "hf_posext.eval.evaluated_model",
    "hf_posext.eval.report",
)

PREAMBLE = "import json, sys\n"
REPORT = f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"


def loaded_heavy(code: str) -> list[str]:
    """The :data:`HEAVY` modules loaded after running ``code`` in a fresh interpreter on this checkout."""
    done = subprocess.run(
        [sys.executable, "-c", PREAMBLE + code + "\n" + REPORT],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_hf_posext_loads_nothing_heavy():
    assert loaded_heavy("import hf_posext") == []


#: The package's parts that patching does not need: ``import hf_posext`` loads none of their modules
#: (``search_longrope``, exported at the top, scores with ``eval.perplexity``: it loads on first use;
#: ``data``, the text readers, was loaded through ``content_digest`` for its cache folder).
NOT_LOADED = ("hf_posext.eval", "hf_posext.train", "hf_posext.experiments", "hf_posext.commands", "hf_posext.data")

LOADED_PARTS = (
    f"print(json.dumps(sorted(m for m in sys.modules if m.startswith({NOT_LOADED!r}) or m in {NOT_LOADED!r})))\n"
)


def loaded_parts(code: str) -> list[str]:
    """The modules of :data:`NOT_LOADED`'s packages loaded after running ``code`` in a fresh interpreter."""
    done = run(PREAMBLE + code + "\n" + LOADED_PARTS)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_hf_posext_loads_no_evaluation_training_or_command_module():
    assert loaded_parts("import hf_posext") == []


def test_search_longrope_at_the_top_loads_the_search_when_first_used():
    code = (
        "import hf_posext\nfrom hf_posext import LongRopeSearchResult, search_longrope\n"
        "from hf_posext.longrope_search import search_longrope as defined\nassert search_longrope is defined\n"
        "assert {'search_longrope', 'LongRopeSearchResult'} <= set(hf_posext.__all__) & set(dir(hf_posext))"
    )
    assert "hf_posext.eval.perplexity" in loaded_parts(code)


def test_the_parts_check_sees_a_loaded_part():
    assert "hf_posext.eval" in loaded_parts("import hf_posext.eval")


def test_cli_help_loads_nothing_heavy():
    code = "from hf_posext.commands.main import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass"
    assert loaded_heavy(code) == []


def test_the_check_sees_a_heavy_module():
    assert {"transformers.modeling_utils", "transformers.masking_utils"} <= set(
        loaded_heavy("import hf_posext, transformers.modeling_utils, transformers.masking_utils")
    )


CHECK_REGISTERED = """
from transformers import modeling_rope_utils
from hf_posext import methods
for name, entry in methods.registry.rope_types().items():
    assert modeling_rope_utils.ROPE_INIT_FUNCTIONS[name] is entry.init, name
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
names = sorted(methods.registry.attention_functions())
assert names, "no attention function registered"
for name, functions in methods.registry.attention_functions().items():
    assert ALL_ATTENTION_FUNCTIONS[name] is functions.forward, name
    mask = functions.mask if callable(functions.mask) else ALL_MASK_ATTENTION_FUNCTIONS[functions.mask]
    assert ALL_MASK_ATTENTION_FUNCTIONS[name] is mask, name
"""


@pytest.mark.parametrize("first", ["import hf_posext", "import transformers.modeling_utils\nimport hf_posext"])
def test_attention_functions_reach_transformers_whichever_is_imported_first(first):
    loaded_heavy(first + "\n" + CHECK_REGISTERED)


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        timeout=300,
        check=False,
    )


def test_a_checkpoint_saved_with_a_custom_rope_type_loads_after_import_hf_posext(tmp_path):
    save = f"""
import hf_posext
from hf_posext.testing import make_tiny_model
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(make_tiny_model({str(tmp_path / "base")!r}))
hf_posext.patch_model(model, "dynamic_yarn", factor=4)
model.save_pretrained({str(tmp_path / "patched")!r})
"""
    assert run(save).returncode == 0
    load = f"""
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained({str(tmp_path / "patched")!r})
print(model.config.rope_parameters["rope_type"])
"""
    without = run(load)
    assert without.returncode != 0 and "hf_posext_dynamic_yarn" in without.stderr  # what the registration is for
    loaded = run("import hf_posext\n" + load)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.strip().splitlines()[-1].startswith("hf_posext_dynamic_yarn")


FROM_CONFIG = """
import copy, sys
import hf_posext
assert "transformers.modeling_utils" not in sys.modules
from transformers import AutoModelForCausalLM, Qwen2Config
config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
config.dual_chunk_attention_config = {"chunk_size": 48, "local_size": 8, "original_max_position_embeddings": 64}
before = copy.deepcopy(config.to_dict())
model = AutoModelForCausalLM.from_config(config)
print(hf_posext.patch_info(model).get("method"), config.to_dict() == before, model.config is config)
"""


def test_from_config_copies_a_dual_chunk_config_though_modeling_utils_loads_after_hf_posext():
    done = run(FROM_CONFIG)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-3:] == ["dca", "True", "False"]


@pytest.mark.parametrize("hook", [True, False])
def test_the_from_config_wrap_follows_the_construction_hook_set_before_modeling_utils_loads(hook):
    code = (
        f"import hf_posext\nfrom hf_posext.loading import set_construction_hook\nset_construction_hook({hook})\n"
        "from transformers.modeling_utils import PreTrainedModel\n"
        "print(hasattr(PreTrainedModel._from_config.__func__, '__wrapped__'))"
    )
    done = run(code)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == str(hook)


def test_the_lazy_re_exports_are_transformers_own():
    from hf_posext import integration

    for name, module in integration._LAZY.items():
        assert getattr(integration, name) is getattr(importlib.import_module(module), name), name
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        integration.nothing  # noqa: B018


PLUGIN_ATTENTION = """
import sys
import hf_posext
class Toy(hf_posext.YarnConfig):
    pass
try:
    hf_posext.register_method("toy", Toy, attention={"sdpa": hf_posext.AttentionFunctions(print, "sdpa")})
except ValueError as error:
    print("refused:", error)
print("transformers.modeling_utils" in sys.modules, "toy" in hf_posext.available_methods())
"""


def test_a_plugin_attention_name_is_checked_against_transformers_kernels_before_modeling_utils_loads():
    done = run(PLUGIN_ATTENTION)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused: attention 'sdpa' is already registered" in done.stdout
    assert done.stdout.split()[-2:] == ["True", "False"]  # the check imported transformers' registry to decide
