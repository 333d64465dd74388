"""torch.linalg's norms (wr.linalg.norm, vector_norm, matrix_norm); decompositions are not
part of wgrumus."""
from __future__ import annotations

from .composite.reductions import linalg_norm as norm
from .composite.reductions import matrix_norm, vector_norm

__all__ = ["matrix_norm", "norm", "vector_norm"]
