"""Guard logsumexp: PyTorch's composite hands the wheel's ``sum.out`` an empty result it does not
resize; a replacement on PrivateUse1.
"""

from __future__ import annotations

import torch

from dmlshim import current

Tensor = torch.Tensor

# -- logsumexp: PyTorch's composite hands sum.out an empty result, which the wheel's out=
# kernels do not resize (facts file: add(out=empty(0)) comes back empty), then adds the
# maxima into it: "The size of tensor a (0) must match ...". The same formula from functional
# ops, each of which allocates its result at its final shape (below autograd: logsumexp's
# derivative formula stays).


def logsumexp(self: Tensor, dim, keepdim: bool = False) -> Tensor:
    if (shim := current.session) is not None:
        shim.events.notes["guard.logsumexp"] += 1
    rank = max(self.dim(), 1)
    dims = [d % rank for d in (dim if isinstance(dim, (list, tuple)) else [dim])]
    if self.numel() == 0:
        return torch.log(torch.sum(torch.exp(self), dims, keepdim))
    x = self if self.is_floating_point() else self.to(torch.get_default_dtype())
    maxes = torch.amax(x, dims, True)
    # infinite maxima (all -inf, or an inf) are taken as 0, as PyTorch's kernel does
    maxes = torch.where(torch.isinf(maxes), torch.zeros_like(maxes), maxes)
    out = torch.log(torch.sum(torch.exp(torch.sub(x, maxes)), dims, True))
    out = torch.add(out, maxes)
    return out if keepdim else out.squeeze(dims)
