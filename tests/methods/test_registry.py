"""The method registry: one folder per family, found rather than listed, and registered with transformers from it."""

from __future__ import annotations

import ast
import importlib
import os
import pkgutil
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tests.helpers.plugins import plugin_examples
from transformers import modeling_rope_utils
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

import hf_posext
import hf_posext.readers.transformers5
from hf_posext import methods
from hf_posext.methods.registry import AttentionFunctions, MethodSpec, RopeType, register_family, register_method
from hf_posext.post_import import REMOVED_IN

REPO = Path(__file__).resolve().parents[2]


def run_python(code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter at the repository's root, on one thread."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300, env=env)


PACKAGE_DIR = Path(hf_posext.__file__).parent


def test_every_family_folder_is_registered_and_nothing_else():
    folders = {info.name for info in pkgutil.iter_modules(methods.__path__) if info.ispkg}
    assert set(methods.families()) == folders
    registered = [name for family in methods.families().values() for name in family.methods]
    assert sorted(registered) == hf_posext.available_methods()


def test_config_classes_are_found_at_the_top_level_and_in_methods():
    for name in hf_posext.available_methods():
        cls = hf_posext.method_class(name)
        assert cls.name == name
        assert getattr(hf_posext, cls.__name__) is cls is getattr(methods, cls.__name__)
        assert cls.__name__ in hf_posext.__all__


def test_registered_rope_types_and_attention_reach_transformers():
    for name, entry in methods.registry.rope_types().items():
        for key in (name, *entry.old_names):
            assert modeling_rope_utils.ROPE_INIT_FUNCTIONS[key] is entry.init
    for name, functions in methods.registry.attention_functions().items():
        assert ALL_ATTENTION_FUNCTIONS[name] is functions.forward
        mask = functions.mask if callable(functions.mask) else ALL_MASK_ATTENTION_FUNCTIONS[functions.mask]
        assert ALL_MASK_ATTENTION_FUNCTIONS[name] is mask


def test_checkpoints_saved_under_the_old_rope_type_names_still_load():
    assert (
        hf_posext.readers.transformers5.renamed_rope_types().items()
        >= {
            "hf_posext_dynamic_yarn": "hf_posext_dynamic_yarn (requires: import hf_posext)",
            "hf_posext_none": "hf_posext_none (requires: import hf_posext)",
        }.items()
    )


def test_the_saved_names_are_unchanged():
    families = methods.families()
    proportional = "hf_posext_proportional (requires: import hf_posext)"
    assert set(families["yarn"].rope_types) == {"hf_posext_dynamic_yarn (requires: import hf_posext)", proportional}
    assert proportional in families["longrope"].rope_types
    assert (
        set(families["alibi"].rope_types)
        == set(families["absolute"].rope_types)
        == {"hf_posext_none (requires: import hf_posext)"}
    )
    assert set(families["alibi"].attention) == {"hf_posext_alibi (requires: import hf_posext)", "hf_posext_alibi"}
    assert set(methods.registry.attention_functions()) == {
        "hf_posext_alibi (requires: import hf_posext)",
        "hf_posext_alibi",
        "hf_posext_remap (requires: import hf_posext)",
        "hf_posext_remap_eager",
        "hf_posext_remap_sdpa",
    }


def test_a_refused_registration_leaves_nothing_behind():
    before = (hf_posext.available_methods(), hf_posext.method_aliases(), methods.families().keys())

    class Toy(hf_posext.YarnConfig):
        pass

    with pytest.raises(ValueError, match="'pi' is already registered"):
        register_family("toy", methods=[MethodSpec("toy", Toy), MethodSpec("toy2", Toy, aliases=("pi",))])
    with pytest.raises(ValueError, match="already registered with other functions"):
        register_method("toy", Toy, rope_types={"hf_posext_none (requires: import hf_posext)": RopeType(print, print)})
    with pytest.raises(ValueError, match="must be a MethodConfig subclass"):
        register_method("toy", dict)
    # Names transformers itself holds (a rope type, an attention kernel) are refused before anything is kept.
    with pytest.raises(ValueError, match="rope_type 'linear' is already registered"):
        register_method("toy", Toy, rope_types={"linear": RopeType(print, print)})
    with pytest.raises(ValueError, match="attention 'sdpa' is already registered"):
        register_method("toy", Toy, attention={"sdpa": AttentionFunctions(print, print)})
    assert (hf_posext.available_methods(), hf_posext.method_aliases(), methods.families().keys()) == before
    assert modeling_rope_utils.ROPE_INIT_FUNCTIONS["linear"] is not print
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is not print and ALL_MASK_ATTENTION_FUNCTIONS["sdpa"] is not print
    # A retry fails for the same reason, not "already registered": the refused attempt kept nothing.
    with pytest.raises(ValueError, match="rope_type 'linear' is already registered"):
        register_method("toy", Toy, rope_types={"linear": RopeType(print, print)})


class _BrokenSurgery(hf_posext.Surgery):
    def __init__(self):
        raise RuntimeError("surgery cannot be built")


def test_a_registration_failing_late_keeps_nothing_and_a_retry_works():
    """Failures past the name checks (a hook, a surgery's constructor, transformers' own registration) undo it all."""

    class Toy(hf_posext.YarnConfig):
        pass

    before = (hf_posext.available_methods(), hf_posext.method_aliases(), methods.families().keys())
    with pytest.raises(ValueError, match="shipped_config must be callable"):
        register_method("toy_late", Toy, aliases=("toy_late_alias",), shipped_config="not a function")
    with pytest.raises(RuntimeError, match="surgery cannot be built"):
        register_method("toy_late", Toy, surgery=_BrokenSurgery)
    with pytest.raises(KeyError, match="no_such_kernel"):  # masking_utils is imported: the mask is looked up now
        register_method("toy_late", Toy, attention={"hf_posext_toy_late": AttentionFunctions(print, "no_such_kernel")})
    assert (hf_posext.available_methods(), hf_posext.method_aliases(), methods.families().keys()) == before
    assert "name" not in Toy.__dict__
    try:
        register_method("toy_late", Toy, aliases=("toy_late_alias",), family="toy_late")
        assert hf_posext.method_config("toy_late_alias", factor=2) == Toy(factor=2)
    finally:  # this process's registry is shared by the other tests
        from hf_posext import method_names
        from hf_posext.methods import registry

        registry._FAMILIES.pop("toy_late")
        method_names.METHODS.pop("toy_late")
        method_names.ALIASES.pop("toy_late_alias")


#: Every deprecated name, its replacement, and the modules it was importable from.
DEPRECATED = [
    (module, old, new)
    for old, new, modules in [
        ("PositionMethod", "MethodConfig", ("hf_posext", "hf_posext.methods", "hf_posext.methods.base")),
        ("make_method", "method_config", ("hf_posext", "hf_posext.methods", "hf_posext.methods.registry")),
        ("EXACT_DYNAMIC_UNSUPPORTED", "WRAPPED_ATTENTION_UNSUPPORTED", ("hf_posext.architectures",)),
        (
            "KeepFirstRotaryEmbedding",
            "LongRopeRotaryEmbedding",
            ("hf_posext.methods.longrope", "hf_posext.methods.longrope.rope"),
        ),
        ("extend_checkpoint", "patch_checkpoint", ("hf_posext.publish", "hf_posext.publish.config_patch")),
    ]
    for module in modules
]


@pytest.mark.parametrize(("module", "old", "new"), DEPRECATED)
def test_a_deprecated_name_works_warns_naming_its_replacement_and_is_not_exported(module, old, new):
    imported = importlib.import_module(module)
    with pytest.warns(DeprecationWarning) as caught:
        assert getattr(imported, old) is getattr(imported, new)
    assert [str(w.message) for w in caught] == [
        f"{module}.{old} is deprecated; use {module}.{new} (the old name goes in {REMOVED_IN})"
    ]
    assert caught[0].filename == __file__  # attributed to the caller, so Python shows it once per call site
    assert old not in getattr(imported, "__all__", ())


def test_the_package_uses_no_deprecated_name():
    package = Path(hf_posext.__file__).parent
    used = [
        f"{path.relative_to(package)}:{node.lineno}"
        for path in sorted(package.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if (isinstance(node, ast.Name) and node.id in {old for _, old, _ in DEPRECATED})
        or (isinstance(node, ast.alias) and node.name in {old for _, old, _ in DEPRECATED})
        or (isinstance(node, ast.Attribute) and node.attr in {old for _, old, _ in DEPRECATED})
    ]
    assert used == []


TOY_FAMILY = '''
"""A throwaway family written by tests/methods/test_registry.py."""

from dataclasses import dataclass

from ...rope_utils import default_inv_freq, rope_parameters_for, rotary_dim_of
from ..base import MethodConfig
from ..registry import RopeType, register_method

TOY_ROPE_TYPE = "hf_posext_toy"


def toy_rope(config, device=None, seq_len=None, layer_type=None):
    params = rope_parameters_for(config, layer_type)
    return default_inv_freq(params["rope_theta"], rotary_dim_of(config, params), device) / params["factor"], 1.0


@dataclass(frozen=True)
class ToyConfig(MethodConfig):
    """Toy: every frequency divided by factor, through a rope type of its own."""

    paper = "none"

    def rope_parameters(self, base):
        return {**base.rope_parameters, "rope_type": TOY_ROPE_TYPE, "factor": self.factor}


register_method("toy", ToyConfig, aliases=("toy_alias",), \
rope_types={TOY_ROPE_TYPE: RopeType(toy_rope, lambda config, parameters, ignore_keys: None)})
'''


def test_adding_a_method_is_adding_a_folder(tmp_path):
    """A family folder dropped into a copy of the package is a method everywhere: the registry, the
    ``hf-posext`` command, transformers and the tests parametrised over the registry."""
    shutil.copytree(PACKAGE_DIR, tmp_path / "hf_posext", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "hf_posext" / "methods" / "toy").mkdir()
    (tmp_path / "hf_posext" / "methods" / "toy" / "__init__.py").write_text(textwrap.dedent(TOY_FAMILY))
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "OMP_NUM_THREADS": "1"}

    def run(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    found = run(
        "-c",
        textwrap.dedent(f"""
        import hf_posext
        from transformers import modeling_rope_utils
        assert hf_posext.__file__.startswith({str(tmp_path)!r}), hf_posext.__file__
        assert "toy" in hf_posext.available_methods() and hf_posext.method_aliases()["toy_alias"] == "toy"
        assert "hf_posext_toy" in modeling_rope_utils.ROPE_INIT_FUNCTIONS
        print(hf_posext.ToyConfig.__name__)
    """),
    )
    assert found.strip() == "ToyConfig"
    script = re.search(r'^hf-posext = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.MULTILINE)
    module, _, function = script.group(1).partition(":")  # the console script, wherever the CLI lives
    listed = run("-c", f"import sys; from {module} import {function}; sys.exit({function}(['methods']))")
    assert any(line.startswith("toy ") for line in listed.splitlines())
    # pytest's `pythonpath` (the repository root, for tests.helpers) would put the repository's hf_posext
    # before the copy: cleared, the root comes after the copy on PYTHONPATH.
    env["PYTHONPATH"] = os.pathsep.join((str(tmp_path), str(REPO)))
    patching_tests = str(REPO / "tests" / "patching" / "test_patching.py")
    tests = run("-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "pythonpath=", patching_tests, "-k", "toy")
    assert " passed" in tests and "failed" not in tests
    assert "deselected" in tests  # only the toy's cases ran


def test_the_plugin_api_is_the_top_levels():
    """What a third-party method or family needs, exported as peft exports register_peft_method (issue 48 item 7):
    what the built-in families import from the modules they share, but for the remapping's (item 5 reshapes it)."""
    for name, value in [
        ("register_method", register_method),
        ("register_family", register_family),
        ("MethodSpec", MethodSpec),
        ("MethodConfig", methods.base.MethodConfig),
        ("BaseRope", methods.base.BaseRope),
        ("Surgery", methods.surgery.Surgery),
        ("Training", methods.training.Training),
        ("TrainingOption", methods.training.TrainingOption),
        ("RopeType", RopeType),
        ("AttentionFunctions", AttentionFunctions),
        ("DynamicScaling", methods.dynamic.DynamicScaling),
        ("DynamicSurgery", methods.dynamic.DynamicSurgery),
        ("NoRopeMethod", methods.norope.NoRopeMethod),
        ("NO_ROPE_TYPES", methods.norope.NO_ROPE_TYPES),
        ("real_number", methods.base.real_number),
        ("whole_number", methods.base.whole_number),
        ("check_received_keys", hf_posext.integration.check_received_keys),
        ("default_inv_freq", hf_posext.rope_utils.default_inv_freq),
        ("rope_parameters_for", hf_posext.rope_utils.rope_parameters_for),
        ("rotary_dim_of", hf_posext.rope_utils.rotary_dim_of),
    ]:
        assert name in hf_posext.__all__ and getattr(hf_posext, name) is value, name


def test_the_readers_hints_name_registered_static_methods():
    for name in hf_posext.available_methods():
        static = hf_posext.method_class(name).static_equivalent
        assert static is None or (
            static in hf_posext.available_methods() and not hf_posext.method_class(static).dynamic
        )
    assert {n for n in hf_posext.available_methods() if hf_posext.method_class(n).static_equivalent} == {
        n for n in hf_posext.available_methods() if hf_posext.method_class(n).dynamic
    }


def test_the_public_surface_resolves_and_is_documented():
    for name in hf_posext.__all__:
        value = getattr(hf_posext, name)
        assert name == "__version__" or name == "SUPPORTED_MODEL_TYPES" or value.__doc__, name
    assert "PositionMethod" not in hf_posext.__all__


def test_a_family_registered_after_import_reaches_transformers_at_once():
    """An out-of-tree family (a plugin) calls register_method after ``import hf_posext``, with the top level's names."""
    code = (
        textwrap.dedent(TOY_FAMILY)
        .replace("from ...rope_utils", "from hf_posext.rope_utils")
        .replace("from ..base", "from hf_posext")
        .replace("from ..registry", "from hf_posext")
    )
    code = (
        "import hf_posext\n"
        + code
        + textwrap.dedent("""
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM
        config = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                             num_attention_heads=2, max_position_embeddings=16)
        model = hf_posext.patch_model(LlamaForCausalLM(config), "toy_alias", factor=2)
        assert model.config.rope_parameters["rope_type"] == "hf_posext_toy"
        assert hf_posext.patched_method(model) == ToyConfig(factor=2, original_max_position_embeddings=16)
        model(torch.tensor([[1, 2, 3]]))
    """)
    )
    done = run_python(code)
    assert done.returncode == 0, done.stderr


def test_a_family_load_time_hook_patches_a_config_that_ships_its_method():
    """``register_method(..., shipped_config=hook)``: a model built from a config the hook recognises comes out patched.

    DCA adopts Qwen's ``dual_chunk_attention_config`` this way (tests/methods/test_remap_surgery.py);
    here a plugin's hook, in a fresh interpreter so the registry of this one stays as it is.
    """
    code = textwrap.dedent("""
        import dataclasses
        import hf_posext
        from hf_posext.methods.registry import shipped_method
        from transformers import LlamaConfig, LlamaForCausalLM

        @dataclasses.dataclass(frozen=True)
        class ShippedYarn(hf_posext.YarnConfig):
            pass

        def hook(config):
            factor = getattr(config, "toy_yarn_factor", None)
            return None if factor is None else ShippedYarn(factor=factor)

        hf_posext.register_method("shipped_yarn", ShippedYarn, shipped_config=hook)
        config = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                             num_attention_heads=2, max_position_embeddings=16)
        assert shipped_method(config) is None and hf_posext.patched_method(LlamaForCausalLM(config)) is None
        config.toy_yarn_factor = 4.0
        model = LlamaForCausalLM(config)
        assert hf_posext.patched_method(model) == ShippedYarn(factor=4.0, original_max_position_embeddings=16)
        assert model.config.rope_parameters["factor"] == 4.0
        try:
            hf_posext.register_method("shipped_bad", ShippedYarn, shipped_config="not callable")
        except ValueError as error:
            assert "shipped_config must be callable" in str(error), error
        else:
            raise AssertionError("a non-callable hook was registered")
    """)
    done = run_python(code)
    assert done.returncode == 0, done.stderr


#: What each plugin block of adding-a-method.md must do once run: the built-in ``linear``'s logits, its page's claims.
PLUGIN_CHECKS = textwrap.dedent("""
    import torch
    from tests.helpers.models import tiny_model, tokens
    from hf_posext.methods import families

    ids = tokens(40)
    linear = hf_posext.patch_model(tiny_model(max_positions=16), "linear", factor=2)
    slow = hf_posext.patch_model(tiny_model(max_positions=16), "slow", factor=2)
    assert slow.config.rope_parameters["rope_type"] == "linear" and slow.config.rope_parameters["factor"] == 2.0
    assert slow.config.max_position_embeddings == 32
    for name in ("slow", "my_pi", "my_linear", "my_pi_native"):
        model = hf_posext.patch_model(tiny_model(max_positions=16), name, factor=2)
        torch.testing.assert_close(model(ids).logits, linear(ids).logits, rtol=0, atol=0)
    assert hf_posext.patch_model(tiny_model(max_positions=16), "my_pi", factor=2).config.rope_parameters[
        "rope_type"] == "my_pi"
    assert families()["my_pi"].methods == ("my_pi", "my_linear")
    # transformers 5 builds my_pi only with the plugin imported: never "read as patched" on its own
    from hf_posext.readers import transformers5, verdicts
    from hf_posext.rope_utils import DYNAMIC_YARN_ROPE_TYPE

    my_pi = hf_posext.patch_model(tiny_model(max_positions=16), "my_pi", factor=2).config
    status, how = verdicts.support(my_pi, 32)["transformers 5"]
    assert status == "refused" and "'my_pi' unless the plugin" in how, how
    assert "transformers 5" not in verdicts.engine_warning(my_pi, 32, "my_pi").partition("Read as patched by:")[2]
    assert transformers5.verdict("nobodys_type")[0] == "refused"
    assert transformers5.verdict(DYNAMIC_YARN_ROPE_TYPE)[0] == transformers5.verdict("yarn")[0] == "same"
    try:
        hf_posext.method_config("my_pi", attention_scale=0)
    except ValueError as error:
        assert "attention_scale must be > 0, got 0.0" in str(error), error
    else:
        raise AssertionError("attention_scale=0 was accepted")
""")


def test_the_plugin_examples_of_the_docs_run_as_written():
    """docs/methods/adding-a-method.md's plugins (a method, a family with a rope type of its own), as written,
    in a fresh interpreter: the top level's names are all they need."""
    plugins = plugin_examples()
    assert len(plugins) == 2
    assert all("from hf_posext" not in body and "hf_posext." in body for body in plugins)
    code = "\n".join([*plugins, PLUGIN_CHECKS])
    done = run_python(code)
    assert done.returncode == 0, done.stderr[-3000:]
