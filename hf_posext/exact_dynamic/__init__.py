"""Dynamic NTK and dynamic YaRN that stay exact with a KV cache (``exact_cache=True``).

Dynamic scaling (YaRN paper, arXiv 2309.00071, section 3.3) recomputes the rotary frequencies
from the current sequence length L. transformers (and the YaRN repository) rotate each key once
and cache it rotated, so once the scale changes the cache holds keys rotated with stale
frequencies (transformers issue 25104). The paper's fix: "cache the kv embeddings before
applying RoPE".

Definition (causal): the token at position i attends with the frequencies (and YaRN mscale) for
length i + 1; its query and every key j <= i it attends to are rotated by j * theta'(i + 1). A full
forward and cached decoding then compute the same thing token by token. No cache can be exact
against transformers' full-forward definition (all positions rotated for the last token's length)
in a model with two or more layers, because cached layer-2 keys were computed from older layer-1
outputs.

Design:

* :mod:`.install`: the model's rotary module is replaced by a stand-in that hands the layers the
  identity rotation, so queries and keys reach the cache (``DynamicCache``, sliding or not)
  un-rotated; ``config._attn_implementation`` becomes a registered wrapper of the model's own
  kernel (``hf_posext_exact_dynamic_<eager|sdpa>``).
* :mod:`.forward_plan`: per forward, the query rows are split into kernel calls by the frequency set they
  need; the plan is found by the forward's ``position_ids`` tensor, so concurrent forwards
  (threads, ``nn.DataParallel`` replicas) never share one. Nothing is kept between forwards.
* :mod:`.attention`: the wrapper. A decoding step leaves the query un-rotated and turns each key
  by its offset ``(j - p) theta'`` times mscale^2: one table per step for all layers.
* :mod:`.rowwise`: the rows of a prompt past L_orig, each with its own frequencies, in chunks.
* :mod:`.rotation`: the rotation maths (half tables, complex rotation grids).

Costs, limits and measurements: README "Exact dynamic scaling with a KV cache" and
``benchmarks/results/exact_dynamic_notes.md``.

Example (runs on a laptop)::

    import hf_posext
    model = hf_posext.patch_model(model, "dynamic_yarn", factor=4)      # exact_cache=True
    out = model.generate(ids, max_new_tokens=3 * model.config.max_position_embeddings)
"""

from .attention import exact_dynamic_attention
from .install import (
    SUPPORTED_KERNELS,
    ExactDynamicRotaryEmbedding,
    disable_exact_dynamic_cache,
    enable_exact_dynamic_cache,
    exact_rotary_at_init,
)
from .forward_plan import ATTENTION_PREFIX, EXACT_ROPE_TYPES, ExactDynamicRope, ForwardPlan
from .rotation import apply_rotary, cos_sin, grid_rotations

__all__ = [
    "ATTENTION_PREFIX",
    "EXACT_ROPE_TYPES",
    "SUPPORTED_KERNELS",
    "ExactDynamicRope",
    "ExactDynamicRotaryEmbedding",
    "ForwardPlan",
    "apply_rotary",
    "cos_sin",
    "disable_exact_dynamic_cache",
    "enable_exact_dynamic_cache",
    "exact_dynamic_attention",
    "exact_rotary_at_init",
    "grid_rotations",
]
