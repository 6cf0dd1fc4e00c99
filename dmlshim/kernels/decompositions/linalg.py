"""Matrix-vector products: ``addmv`` (``torch.mv``, ``matmul`` of a matrix and a vector, and
their backward; YOLOv8's loss calls it every step through a ``matmul`` with a 1-D operand).

``addmv(self, mat, vec, beta, alpha)`` is ``addmm`` with the vector as an (m, 1) matrix, which
torch-directml has. With beta = 0, ``self`` is ignored (NaN in it does not propagate), as in
the CPU kernel: ``mv`` calls ``addmv`` with an uninitialised ``self`` and beta 0.
"""

from __future__ import annotations

import torch

from dmlshim.kernels.decompositions.base import Decomposition, write_out

Tensor = torch.Tensor


def addmv_out(self: Tensor, mat: Tensor, vec: Tensor, *, beta=1, alpha=1, out: Tensor) -> Tensor:
    product = torch.mm(mat, vec.unsqueeze(1)).squeeze(1)
    if alpha != 1:
        product = product * alpha
    if beta == 0:
        value = product
    else:
        value = product + (self if beta == 1 else self * beta)
    if value.dim() == 0:
        value = value.expand(mat.size(0))
    if out.shape != value.shape:  # write_out, inline (YOLOv8's loss: every step)
        write_out(out, value)  # raises
    return out.copy_(value)


DECOMPOSITIONS = (
    Decomposition("aten::addmv.out", (), "matrix-vector products (`torch.mv`, `matmul` with a "
                  "1-D operand, `addmv`; their backward)", "`mm` with the vector as an (m, 1) "
                  "matrix, `mul`, `add`", addmv_out),
)
