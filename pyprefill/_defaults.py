"""The defaults the Python layer writes out itself, each once. They mirror constants of the
library (cuda/plan/defaults.h) and the "default" comments of include/prefill.h, which
tests/python/test_defaults.py compares them with: change both sides together.

Pure Python: imported by the binding (model.py), the CLI and the benchmarks alike.
"""

# Positions of a session (pf_session_options.max_tokens "default 4096") and the largest session
# capacity a batch plans for (pf_batch_options.max_context "default 0 = 4096"). C: kDefaultCapacity.
DEFAULT_CAPACITY = 4096

# Rows per step: a session's chunk (pf_session_options.chunk_tokens "auto: 2048 rows", before the
# free-memory cap) and a batch's step (pf_batch_options.step_tokens "default 0 = 2048").
# C: kDefaultStepRows.
DEFAULT_STEP_TOKENS = 2048

# A batch's tokens per plan, all items together, in steps: pf_batch_options.max_tokens
# "default 0 = 8 x step_tokens".
DEFAULT_BATCH_STEPS = 8


def batch_max_tokens(step_tokens: int = 0) -> int:
    """pf_batch_options.max_tokens when left at 0: DEFAULT_BATCH_STEPS steps of step_tokens (0:
    DEFAULT_STEP_TOKENS)."""
    return DEFAULT_BATCH_STEPS * (step_tokens or DEFAULT_STEP_TOKENS)


__all__ = ["DEFAULT_CAPACITY", "DEFAULT_STEP_TOKENS", "DEFAULT_BATCH_STEPS", "batch_max_tokens"]
