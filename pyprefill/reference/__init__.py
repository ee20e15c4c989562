"""The NumPy reference ("the oracle"): spec.md §0-§3 as readable NumPy, reading GGUF files through
the `gguf` package. It never imports the CUDA binding.

    from pyprefill.reference import ReferenceModel
    m = ReferenceModel("model.gguf")            # float64 by default
    s = m.session()
    last = s.prefill([1, 2, 3])                 # logits of the last token, (V,)
    nxt = s.prefill([4])                        # a decode step continues from position 3
"""
from . import ops
from .model import ReferenceModel, ReferenceSession

__all__ = ["ops", "ReferenceModel", "ReferenceSession"]
