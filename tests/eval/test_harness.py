"""lm-evaluation-harness on a patched model (hf_posext.eval.harness): lm-eval's own numbers, offline local tasks.

A tiny byte-level model (hf_posext.testing) and two local tasks (``dataset_path: json`` with ``data_files``):
a rolling-loglikelihood one (perplexity of whole documents, lm-eval's wikitext recipe) and a multiple-choice one.
"""

from __future__ import annotations

import json
import math

import pytest
from tests.helpers.models import single_thread

import hf_posext
from hf_posext.commands.main import main
from hf_posext.data import stdlib_files
from hf_posext.eval.evaluated_model import load_model
from hf_posext.eval.harness import harness_max_length, run_harness
from hf_posext.testing import make_tiny_model

lm_eval = pytest.importorskip("lm_eval")

ROLLING = """task: hfposext_local_ppl
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
"""
CHOICE = """task: hfposext_local_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
metric_list:
  - metric: acc
"""
L_ORIG = 64


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("harness")
    make_tiny_model(root / "model", max_position_embeddings=L_ORIG)
    texts = [p.read_text(errors="replace")[:300] for p in sorted(stdlib_files("test"))[:3]]
    (root / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    questions = [
        {"question": "1 + 1 =", "choices": [" 2", " 3"], "label": 0},
        {"question": "def", "choices": [" f", " ="], "label": 0},
    ]
    (root / "mc.jsonl").write_text("".join(json.dumps(q) + "\n" for q in questions))
    (root / "tasks").mkdir()
    (root / "tasks" / "ppl.yaml").write_text(ROLLING.format(data=root / "docs.jsonl"))
    (root / "tasks" / "mc.yaml").write_text(CHOICE.format(data=root / "mc.jsonl"))
    return root


def metrics(results):
    return {
        task: {k: v for k, v in values.items() if isinstance(v, float)} for task, values in results["results"].items()
    }


def test_the_command_writes_lm_evals_numbers_for_the_same_patched_model(setup, tmp_path):
    root = setup
    out = tmp_path / "results.json"
    with single_thread():
        code = main(
            [
                "eval",
                "harness",
                str(root / "model"),
                "--method",
                "linear",
                "--factor",
                "4",
                "--tasks",
                "hfposext_local_ppl,hfposext_local_mc",
                "--include-path",
                str(root / "tasks"),
                "--out",
                str(out),
                "--device",
                "cpu",
            ]
        )
        assert code == 0
        written = json.loads(out.read_text())
        model, tokenizer = load_model(str(root / "model"), device="cpu")
        hf_posext.patch_model(model, "linear", factor=4)
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager

        direct = lm_eval.simple_evaluate(
            model=HFLM(pretrained=model, tokenizer=tokenizer, batch_size=1, max_length=4 * L_ORIG),
            tasks=["hfposext_local_ppl", "hfposext_local_mc"],
            task_manager=TaskManager(include_path=str(root / "tasks"), include_defaults=False),
            log_samples=False,
            random_seed=0,
            numpy_random_seed=0,
            torch_random_seed=0,
            fewshot_random_seed=0,
        )
    assert metrics(written) == metrics(direct)
    assert set(written["results"]) == {"hfposext_local_ppl", "hfposext_local_mc"}
    assert all(math.isfinite(v) for task in metrics(written).values() for v in task.values())
    assert {"configs", "versions", "n-shot", "config"} <= set(written)


def test_lm_eval_reads_the_patched_context_not_max_position_embeddings(setup):
    """lm-eval's own resolve_max_length reads max_position_embeddings, which a linear patch keeps at L0."""
    from lm_eval.models.utils import resolve_max_length

    model, tokenizer = load_model(str(setup / "model"), device="cpu")
    hf_posext.patch_model(model, "linear", factor=4)
    assert resolve_max_length(model.config, tokenizer) == L_ORIG
    assert harness_max_length(model) == 4 * L_ORIG


def test_the_patch_changes_lm_evals_perplexity_past_the_original_context(setup):
    """The documents are longer than L0: plain and patched models must differ (the patch reaches lm-eval)."""
    model, tokenizer = load_model(str(setup / "model"), device="cpu")
    with single_thread():
        plain = run_harness(model, tokenizer, ["hfposext_local_ppl"], include_path=setup / "tasks")
        hf_posext.patch_model(model, "yarn", factor=4)
        patched = run_harness(model, tokenizer, ["hfposext_local_ppl"], include_path=setup / "tasks")
    assert metrics(plain) != metrics(patched)


@pytest.mark.slow  # indexes every lm-eval task to say it is not among them
def test_an_unknown_task_is_named(setup):
    model, tokenizer = load_model(str(setup / "model"), device="cpu")
    with pytest.raises(ValueError, match="unknown lm-eval task.*'no_such_task'"):
        run_harness(model, tokenizer, ["no_such_task"], include_path=setup / "tasks")
