"""Error of the folded ALiBi path against an fp64 reference, beside the exact fp32 path's own error.

For each head count and length: random q (x2), k (x2), v of one batch row (GQA with 2 kv heads,
head dim 64), causal, fp32. It reports max |output - fp64 reference| for the exact path (SDPA with
the fp32 bias, run in blocks of query rows so that no L x L bias is held) and for the folded path
(:mod:`hf_posext.methods.alibi.folded`), with the bound the module derives for what folding may
add: 2 max|v| times :func:`~hf_posext.methods.alibi.folded.logit_error_bound`. Head counts that
are not 4 or 8 have slopes that are not powers of two, which is what the slope split is for.

Run (CPU, a few minutes at one thread)::

    .venv/bin/python benchmarks/alibi_folded_error.py
    .venv/bin/python benchmarks/alibi_folded_error.py --heads 4 --lengths 256   # a quick smoke run

It writes rows (``result_schema.py``) of ``max_slope``, ``exact_error``, ``folded_error``, ``logit_bound``
and ``output_bound`` per head count and length to ``benchmarks/results/alibi_folded_error.json``
(``--out``); ``python scripts/tables.py`` renders ``benchmarks/results/alibi_folded_error.md`` from it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F
from harness import Results
from tqdm import tqdm

from hf_posext.methods.alibi import alibi_slopes
from hf_posext.methods.alibi.folded import folded_alibi, logit_error_bound

RESULTS = Path(__file__).parent / "results"
BLOCK = 256  # query rows per block of the reference and of the exact path


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slopes: torch.Tensor, dtype: torch.dtype):
    """Causal ALiBi attention ``[batch, q, heads, dim]`` computed in ``dtype``, in blocks of query rows.

    fp64: the eager formula (logits plus bias, softmax). fp32: SDPA with the fp32 bias (the exact path).
    """
    heads, length, dim = q.shape[1], q.shape[2], q.shape[3]
    positions = torch.arange(length)
    m = slopes.to(dtype).view(1, heads, 1, 1)
    blocks = []
    for start in range(0, length, BLOCK):
        distance = (positions[start : start + BLOCK, None] - positions[None, :]).to(dtype)
        bias = (-m * distance).masked_fill(distance < 0, float("-inf"))
        q_block = q[:, :, start : start + BLOCK].to(dtype)
        if dtype == torch.float64:
            groups = heads // k.shape[1]
            keys, values = (t.to(dtype).repeat_interleave(groups, 1) for t in (k, v))
            weights = torch.softmax(q_block @ keys.transpose(-1, -2) * dim**-0.5 + bias, -1)
            blocks.append(weights @ values)
        else:
            blocks.append(F.scaled_dot_product_attention(q_block, k, v, attn_mask=bias, enable_gqa=True))
    return torch.cat(blocks, 2).transpose(1, 2)


def measure(heads: int, length: int, kv_heads: int = 2, dim: int = 64) -> dict:
    generator = torch.Generator().manual_seed(length + heads)
    q = torch.randn(1, heads, length, dim, generator=generator) * 2
    k = torch.randn(1, kv_heads, length, dim, generator=generator) * 2
    v = torch.randn(1, kv_heads, length, dim, generator=generator)
    slopes = alibi_slopes(heads)
    with torch.no_grad():
        truth = reference(q, k, v, slopes, torch.float64)
        exact = reference(q, k, v, slopes, torch.float32)
        folded, _ = folded_alibi(torch.nn.Module().eval(), q, k, v, dim**-0.5)
    logit_bound = logit_error_bound(heads, length)
    return {
        "max_slope": float(slopes.max()),
        "exact_error": float((exact.double() - truth).abs().max()),
        "folded_error": float((folded.double() - truth).abs().max()),
        "logit_bound": logit_bound,
        "output_bound": 2 * float(v.abs().max()) * logit_bound,
    }


def main(argv: list[str] | None = None) -> Results:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, nargs="+", default=[4, 12, 32])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 8192])
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: PyTorch's)")
    parser.add_argument("--out", default=str(RESULTS / "alibi_folded_error.json"), help="the results file")
    args = parser.parse_args(argv)
    for heads in args.heads:
        if heads < 2 or heads % 2:
            parser.error(f"--heads must be even and >= 2 (2 kv heads), got {heads}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    results = Results(
        args.out,
        "alibi_folded_error",
        setting={"kv_heads": 2, "head_dim": 64, "dtype": "float32", "threads": torch.get_num_threads()},
    )
    for heads, length in tqdm([(h, n) for h in args.heads for n in args.lengths], desc="folded error"):
        results.add_all("alibi_folded", measure(heads, length), {"heads": heads, "length": length})
    results.save()
    print(f"wrote {args.out}; `python scripts/tables.py` renders benchmarks/results/alibi_folded_error.md from it")
    return results


if __name__ == "__main__":
    main()
