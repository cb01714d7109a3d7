"""An offline RULER-style long-context suite (Hsieh et al. 2024, NVIDIA/RULER) with honest statistics.

RULER's synthetic tasks (needle-in-a-haystack variants, variable tracking, common- and
frequent-words extraction) plus a QA stand-in, built only from what ships with Python, each
prompt fitted to an exact token length with the model's tokenizer; accuracies come with their
sample counts and 95% Wilson intervals. ``hf-posext eval ruler`` (`hf_posext.commands.eval`)
wraps `ruler_accuracy` for checkpoints.
"""

from .fit import Prompt, fit_prompt, wrapper_for
from .run import auto_batch_size, ruler_accuracy, run_cell
from .score import (
    RULER_THRESHOLD,
    effective_length,
    string_match_all,
    string_match_part,
    mcnemar_exact,
    summary,
    wilson_interval,
)
from .tasks import GROUPS, QUICK, TASKS, Draft, Task, resolve_tasks

__all__ = [
    "GROUPS",
    "QUICK",
    "RULER_THRESHOLD",
    "TASKS",
    "Draft",
    "Prompt",
    "Task",
    "auto_batch_size",
    "effective_length",
    "fit_prompt",
    "resolve_tasks",
    "ruler_accuracy",
    "run_cell",
    "string_match_all",
    "string_match_part",
    "summary",
    "mcnemar_exact",
    "wilson_interval",
    "wrapper_for",
]
