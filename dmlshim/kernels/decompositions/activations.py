"""ELU (and SELU, CELU, which call it) and LogSigmoid (``nn.LogSigmoid``, and the
``log_sigmoid`` inside ``binary_cross_entropy_with_logits`` on newer torch), forward and backward.

The formulas are the CPU kernels' (aten/src/ATen/native/cpu/Activation.cpp). ``log_sigmoid_forward``
returns (output, buffer); the CPU keeps ``exp(-|x|)`` as the buffer, CUDA an empty tensor, and
both backwards recompute from ``self``: so does this one, and the buffer is CUDA's empty one.
Half input is computed in float32 and rounded once, as the CPU and CUDA kernels' opmath does.
"""

from __future__ import annotations

from typing import Tuple

import torch

from dmlshim.kernels.decompositions.base import Decomposition, write_out

Tensor = torch.Tensor
_LOW = (torch.float16, torch.bfloat16)


# Torch's C functions, not the names a shim's wrapper may stand behind (torch.empty, Tensor.to:
# a frame each); the opmath cast (half computed in float32) written inline for the same reason.
_TO = torch._C.TensorBase.to
_EMPTY = torch._C._VariableFunctions.empty
_F32 = torch.float32


def elu_out(self: Tensor, alpha=1, scale=1, input_scale=1, *, out: Tensor) -> Tensor:
    x = _TO(self, _F32) if self.dtype in _LOW else self
    negative = torch.expm1(x * input_scale) * (alpha * scale)
    value = torch.where(torch.gt(x, 0), x * scale, negative)
    return write_out(out, _TO(value, out.dtype))


def elu_backward_grad_input(grad_output: Tensor, alpha, scale, input_scale, is_result: bool,
                            self_or_result: Tensor, *, grad_input: Tensor) -> Tensor:
    x = _TO(self_or_result, _F32) if self_or_result.dtype in _LOW else self_or_result
    grad = _TO(grad_output, _F32) if grad_output.dtype in _LOW else grad_output
    if is_result:  # in-place ELU: the saved tensor is the output, alpha*scale*(e^(x*is) - 1)
        negative = grad * input_scale * (x + alpha * scale)
    else:
        negative = grad * (input_scale * alpha * scale) * torch.exp(x * input_scale)
    value = torch.where(torch.le(x, 0), negative, grad * scale)
    return write_out(grad_input, _TO(value, grad_input.dtype))


def log_sigmoid_forward(self: Tensor) -> Tuple[Tensor, Tensor]:
    # min(x, 0) - log1p(exp(-|x|)): exact for large |x| on both sides (no exp overflow).
    x = _TO(self, _F32) if self.dtype in _LOW else self
    value = torch.clamp_max(x, 0) - torch.log1p(torch.exp(torch.neg(torch.abs(x))))
    return _TO(value, self.dtype), _EMPTY((0,), dtype=self.dtype, device=self.device)


def log_sigmoid_backward(grad_output: Tensor, self: Tensor, buffer: Tensor) -> Tensor:
    # d/dx log(sigmoid(x)) = 1 - sigmoid(x) = sigmoid(-x)
    x = _TO(self, _F32) if self.dtype in _LOW else self
    grad = _TO(grad_output, _F32) if grad_output.dtype in _LOW else grad_output
    value = grad * torch.sigmoid(torch.neg(x))
    return _TO(value, grad_output.dtype)


def log_sigmoid_backward_grad_input(grad_output: Tensor, self: Tensor, buffer: Tensor, *,
                                    grad_input: Tensor) -> Tensor:
    return write_out(grad_input, log_sigmoid_backward(grad_output, self, buffer))


DECOMPOSITIONS = (
    Decomposition("aten::elu.out", (), "activations (`nn.ELU`, `nn.SELU`, `nn.CELU`, `F.elu`)",
                  "`expm1`, `mul`, `gt`, `where`", elu_out),
    Decomposition("aten::elu_backward.grad_input", (), "activations backward (ELU/SELU/CELU, "
                  "in place too)", "`exp`, `mul`, `le`, `where`", elu_backward_grad_input),
    Decomposition("aten::log_sigmoid_forward", (), "activations (`nn.LogSigmoid`, "
                  "`F.logsigmoid`; YOLOv8's loss)", "`clamp_max`, `abs`, `neg`, `exp`, `log1p`, "
                  "`sub` (CUDA's empty buffer)", log_sigmoid_forward),
    Decomposition("aten::log_sigmoid_backward", (), "activations backward (LogSigmoid)",
                  "`sigmoid(-x)`, `mul`", log_sigmoid_backward),
    Decomposition("aten::log_sigmoid_backward.grad_input", (), "activations backward "
                  "(LogSigmoid, out=)", "as `log_sigmoid_backward`",
                  log_sigmoid_backward_grad_input),
)
