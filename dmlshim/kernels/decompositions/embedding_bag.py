"""``nn.EmbeddingBag`` / ``F.embedding_bag`` (#724): forward and backward from gathers and
accumulating ``index_put_`` (not ``scatter_add``, which raises on the software adapter).

``embedding_bag`` (a composite) flattens 2-D input into indices + offsets and calls
``_embedding_bag`` (``_embedding_bag_forward_only`` when the weight needs no gradient); the
weight gradient is ``_embedding_bag_backward`` (a CPU kernel on newer torch, a composite over
``_embedding_bag_dense_backward`` on torch 2.4) and the per-sample-weights gradient
``_embedding_bag_per_sample_weights_backward``. All of them fall back on torch-directml.

The forward returns (output, offset2bag, bag_size, max_indices) as the backward kernels here
read them: offset2bag[i] is the bag of index i (always filled), bag_size counts each bag's
non-padding indices, max_indices is (bags, dim) for mode "max" and a copy of bag_size
otherwise. Mode "max" needs the longest bag's length, one scalar read from the device.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from dmlshim.kernels.decompositions.base import Decomposition

Tensor = torch.Tensor
MODE_SUM, MODE_MEAN, MODE_MAX = 0, 1, 2


def _bag_starts(offsets: Tensor, include_last_offset: bool) -> Tensor:
    offsets = offsets.long()
    return offsets[:-1] if include_last_offset else offsets


def _offset2bag(starts: Tensor, n: int) -> Tensor:
    """The bag of each of the ``n`` indices: how many bags start at or before it, minus one."""
    marks = torch.zeros(n + 1, dtype=torch.long, device=starts.device)
    later = starts[1:]
    if later.numel():
        marks.index_put_((later,), torch.ones_like(later), accumulate=True)
    return marks.cumsum(0)[:n]


def embedding_bag(weight: Tensor, indices: Tensor, offsets: Tensor,
                  scale_grad_by_freq: bool = False, mode: int = MODE_SUM, sparse: bool = False,
                  per_sample_weights: Optional[Tensor] = None, include_last_offset: bool = False,
                  padding_idx: int = -1) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    device, dtype = weight.device, weight.dtype
    dim = weight.size(1)
    n = indices.numel()
    indices = indices.reshape(-1).long()
    starts = _bag_starts(offsets, include_last_offset)
    bags = starts.numel()
    offset2bag = _offset2bag(starts, n)
    rows = weight.index_select(0, indices)
    padding = torch.eq(indices, padding_idx) if padding_idx >= 0 else None
    counted = (torch.ones_like(indices) if padding is None
               else torch.ne(indices, padding_idx).long())
    bag_size = torch.zeros(bags, dtype=torch.long, device=device).index_put_(
        (offset2bag,), counted, accumulate=True)
    if mode == MODE_MAX:
        output, max_indices = _bag_max(rows, indices, starts, offset2bag, bag_size, padding)
        return output, offset2bag, bag_size, max_indices
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.reshape(-1, 1)
    if padding is not None:
        rows = rows.masked_fill(padding.unsqueeze(1), 0)
    output = torch.zeros(bags, dim, dtype=dtype, device=device)
    output.index_put_((offset2bag,), rows, accumulate=True)
    if mode == MODE_MEAN:
        output = output / bag_size.clamp_min(1).to(dtype).unsqueeze(1)
    return output, offset2bag, bag_size, bag_size.clone()


def _bag_max(rows: Tensor, indices: Tensor, starts: Tensor, offset2bag: Tensor,
             bag_size: Tensor, padding: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """Per-bag maximum and the weight row it came from, through a (bags, longest, dim) layout."""
    device, dtype = rows.device, rows.dtype
    n, dim = rows.shape
    bags = starts.numel()
    ends = torch.cat([starts[1:], torch.full((1,), n, dtype=torch.long, device=device)])
    longest = int((ends - starts).max().item()) if bags and n else 0
    empty = torch.eq(bag_size, 0).unsqueeze(1)
    if longest <= 0:
        return (torch.zeros(bags, dim, dtype=dtype, device=device),
                torch.zeros(bags, dim, dtype=torch.long, device=device))
    slot = offset2bag * longest + (torch.arange(n, device=device)
                                   - starts.index_select(0, offset2bag))
    if padding is not None:
        rows = rows.masked_fill(padding.unsqueeze(1), float("-inf"))
    dense = torch.full((bags * longest, dim), float("-inf"), dtype=dtype, device=device)
    dense = dense.scatter(0, slot.unsqueeze(1).expand(n, dim), rows)
    values, position = dense.view(bags, longest, dim).max(dim=1)
    dense_indices = torch.zeros(bags * longest, dtype=torch.long, device=device)
    dense_indices = dense_indices.scatter(0, slot, indices).view(bags, longest)
    max_indices = dense_indices.gather(1, position)
    return values.masked_fill(empty, 0), max_indices.masked_fill(empty, 0)


def embedding_bag_dense_backward(grad: Tensor, indices: Tensor, offset2bag: Tensor,
                                 bag_size: Tensor, maximum_indices: Tensor, num_weights: int,
                                 scale_grad_by_freq: bool, mode: int,
                                 per_sample_weights: Optional[Tensor],
                                 padding_idx: int = -1) -> Tensor:
    num_weights = int(num_weights)
    dim = grad.size(1)
    result = torch.zeros(num_weights, dim, dtype=grad.dtype, device=grad.device)
    if mode == MODE_MAX:
        # Each output element came from one weight row; empty bags gave 0 and take nothing.
        per_bag = grad.masked_fill(torch.eq(bag_size, 0).unsqueeze(1), 0)
        columns = torch.arange(dim, device=grad.device).unsqueeze(0).expand_as(per_bag)
        return result.index_put_((maximum_indices.long(), columns), per_bag, accumulate=True)
    indices = indices.reshape(-1).long()
    offset2bag = offset2bag.long()
    rows = grad.index_select(0, offset2bag)
    if mode == MODE_MEAN:
        sizes = bag_size.index_select(0, offset2bag).clamp_min(1).to(grad.dtype)
        rows = rows / sizes.unsqueeze(1)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.reshape(-1, 1)
    if scale_grad_by_freq:
        counts = torch.zeros(num_weights, dtype=torch.long, device=grad.device)
        counts.index_put_((indices,), torch.ones_like(indices), accumulate=True)
        rows = rows / counts.index_select(0, indices).to(grad.dtype).unsqueeze(1)
    if padding_idx >= 0:
        rows = rows.masked_fill(torch.eq(indices, padding_idx).unsqueeze(1), 0)
    return result.index_put_((indices,), rows, accumulate=True)


def embedding_bag_backward(grad: Tensor, indices: Tensor, offsets: Tensor, offset2bag: Tensor,
                           bag_size: Tensor, maximum_indices: Tensor, num_weights: int,
                           scale_grad_by_freq: bool, mode: int, sparse: bool,
                           per_sample_weights: Optional[Tensor], padding_idx: int = -1) -> Tensor:
    if sparse:
        # The composite (what torch 2.4's _embedding_bag_backward does for sparse=True).
        return torch.ops.aten._embedding_bag_sparse_backward(
            grad, indices, offsets, offset2bag, bag_size, num_weights, scale_grad_by_freq, mode,
            per_sample_weights, padding_idx)
    return embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices,
                                        num_weights, scale_grad_by_freq, mode,
                                        per_sample_weights, padding_idx)


def embedding_bag_per_sample_weights_backward(grad: Tensor, weight: Tensor, indices: Tensor,
                                              offsets: Tensor, offset2bag: Tensor, mode: int,
                                              padding_idx: int = -1) -> Tensor:
    indices = indices.reshape(-1).long()
    per_index = (grad.index_select(0, offset2bag.long())
                 * weight.index_select(0, indices)).sum(1)
    if padding_idx >= 0:
        per_index = per_index.masked_fill(torch.eq(indices, padding_idx), 0)
    return per_index


_FORWARD = ("`index_select` of the rows, `index_put_(accumulate=True)` into the bags "
            "(offset2bag from the same + `cumsum`), `div` for mean; max: `scatter` into a (bags, longest, "
            "dim) layout + `max(dim)` + `gather`")
DECOMPOSITIONS = (
    Decomposition("aten::_embedding_bag", (724,), "embedding bags (`nn.EmbeddingBag`)",
                  _FORWARD, embedding_bag),
    Decomposition("aten::_embedding_bag_forward_only", (724,), "embedding bags (no grad)",
                  _FORWARD, embedding_bag),
    Decomposition("aten::_embedding_bag_backward", (724,), "embedding bags backward (torch versions where it is a "
                  "CPU kernel, not torch 2.4's composite)",
                  "`index_select` + `index_put_(accumulate=True)` into the weight rows", embedding_bag_backward),
    Decomposition("aten::_embedding_bag_dense_backward", (724,), "embedding bags backward",
                  "`index_select` + `index_put_(accumulate=True)` into the weight rows",
                  embedding_bag_dense_backward),
    Decomposition("aten::_embedding_bag_per_sample_weights_backward", (724,),
                  "embedding bags backward (`per_sample_weights`)",
                  "`index_select`, `mul`, `sum`", embedding_bag_per_sample_weights_backward),
)
