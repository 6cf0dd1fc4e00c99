"""Operators torch-directml 0.2.5.dev240914 implements for the PrivateUse1 dispatch key.

Read from the real package on torch 2.4.1 (no device needed):
``torch._C._dispatch_get_registrations_for_dispatch_key("PrivateUse1")`` after
``import torch_directml``. Every other operator that reaches a DirectML tensor either has a
CompositeExplicitAutograd kernel in PyTorch (it decomposes into other operators) or lands in
torch-directml's boxed CPU fallback (``dml_cpu_fallback.cpp``), which prints the warning the
emulator reproduces. It also registers ``AutogradPrivateUse1`` kernels for ``aten::reshape`` and
``torchvision::nms``, no ``AutocastPrivateUse1`` kernels, and these torchvision kernels:
torchvision::_roi_align_backward, torchvision::nms, torchvision::roi_align.
"""

from __future__ import annotations

DML_KERNELS_0_2_5: frozenset[str] = frozenset(
    """
aten::_adaptive_avg_pool2d aten::_adaptive_avg_pool2d.out aten::_adaptive_avg_pool2d_backward
aten::_adaptive_avg_pool2d_backward.out aten::_cdist_forward aten::_cdist_forward.out
aten::_copy_from aten::_copy_from.out aten::_copy_from_and_resize
aten::_copy_from_and_resize.out aten::_efficientzerotensor aten::_efficientzerotensor.out
aten::_index_put_impl_ aten::_local_scalar_dense aten::_log_softmax.out
aten::_log_softmax_backward_data.out aten::_prelu_kernel aten::_prelu_kernel_backward
aten::_reshape_alias aten::_softmax.out aten::_softmax_backward_data.out aten::_to_sparse
aten::_to_sparse.out aten::_unique2 aten::_unique2.out aten::_unsafe_view aten::_unsafe_view.out
aten::abs.out aten::acos.out aten::acosh.out aten::adaptive_avg_pool2d.out aten::add.out
aten::addcdiv.out aten::addcmul.out aten::addmm.out aten::alias aten::all.all_out aten::all.out
aten::amax.out aten::any.all_out aten::any.out aten::arange.start_out aten::argmax.out
aten::argmin.out aten::as_strided aten::as_strided_ aten::asin.out aten::asinh.out
aten::atan.out aten::atan2.out aten::atanh.out aten::avg_pool2d aten::avg_pool2d.out
aten::avg_pool2d_backward aten::avg_pool2d_backward.grad_input aten::avg_pool3d
aten::avg_pool3d.out aten::avg_pool3d_backward aten::avg_pool3d_backward.grad_input
aten::baddbmm.out aten::bernoulli.out aten::bernoulli_.Tensor aten::bernoulli_.float
aten::binary_cross_entropy_with_logits.out aten::bitwise_and.Tensor_out aten::bitwise_not.out
aten::bitwise_or.Tensor_out aten::bitwise_xor.Tensor_out aten::bmm.out aten::cat.out
aten::ceil.out aten::clamp.out aten::clamp_max.out aten::clamp_min.out aten::constant_pad_nd
aten::constant_pad_nd.out aten::convolution_backward_overrideable
aten::convolution_backward_overrideable.out aten::convolution_overrideable
aten::convolution_overrideable.out aten::copy_ aten::cos.out aten::cosh.out aten::cumsum.out
aten::diag.out aten::div.out aten::div.out_mode aten::dot aten::dot.out aten::embedding
aten::embedding.out aten::embedding_dense_backward aten::embedding_dense_backward.out
aten::empty.memory_format aten::empty.out aten::empty_strided aten::empty_strided.out
aten::eq.Scalar_out aten::eq.Tensor_out aten::equal aten::erf.out aten::erfc.out aten::exp.out
aten::exp2.out aten::expm1.out aten::exponential_ aten::fill_.Scalar aten::fill_.Tensor
aten::flip aten::flip.out aten::floor.out aten::floor_divide aten::floor_divide.out
aten::floor_divide_.Tensor aten::full aten::full.out aten::gather.out aten::ge.Scalar_out
aten::ge.Tensor_out aten::gelu.out aten::gelu_backward.grad_input aten::gt.Scalar_out
aten::gt.Tensor_out aten::hardsigmoid.out aten::hardsigmoid_backward.grad_input aten::hardswish
aten::hardswish.out aten::hardswish_ aten::hardswish_backward aten::hardswish_backward.out
aten::hardtanh aten::hardtanh.out aten::hardtanh_ aten::hardtanh_backward
aten::hardtanh_backward.grad_input aten::index.Tensor_out aten::index_select
aten::index_select.out aten::isin.Tensor_Tensor_out aten::isinf aten::isinf.out aten::isnan
aten::isnan.out aten::le.Scalar_out aten::le.Tensor_out aten::leaky_relu.out
aten::leaky_relu_backward.grad_input aten::linalg_vector_norm.out aten::linear.out
aten::linear_backward aten::linear_backward.out aten::linspace.out aten::log.out aten::log10.out
aten::log1p.out aten::log2.out aten::logical_and.out aten::logical_not.out aten::logical_or.out
aten::logical_xor.out aten::lt.Scalar_out aten::lt.Tensor_out aten::masked_fill_.Scalar
aten::masked_fill_.Tensor aten::masked_scatter_ aten::masked_select aten::masked_select.out
aten::max aten::max.dim_max aten::max.unary_out aten::max_pool2d_with_indices
aten::max_pool2d_with_indices.out aten::max_pool2d_with_indices_backward
aten::max_pool2d_with_indices_backward.grad_input aten::maximum.out aten::mean.out aten::min
aten::min.dim_min aten::min.unary_out aten::minimum.out aten::mm.out aten::mse_loss.out
aten::mse_loss_backward aten::mse_loss_backward.grad_input aten::mul.out aten::multinomial
aten::multinomial.out aten::native_batch_norm aten::native_batch_norm.out
aten::native_batch_norm_backward aten::native_batch_norm_backward.out aten::native_dropout
aten::native_dropout.out aten::native_dropout_backward aten::native_dropout_backward.out
aten::native_group_norm aten::native_group_norm.out aten::native_layer_norm
aten::native_layer_norm.out aten::native_layer_norm_backward
aten::native_layer_norm_backward.out aten::ne.Scalar_out aten::ne.Tensor_out aten::neg.out
aten::nll_loss2d_backward aten::nll_loss2d_backward.grad_input aten::nll_loss2d_forward
aten::nll_loss2d_forward.output aten::nll_loss_backward.grad_input aten::nll_loss_forward.output
aten::nonzero aten::nonzero.out aten::norm.out aten::normal_ aten::ones_like aten::ones_like.out
aten::pow.Scalar_out aten::pow.Tensor_Scalar_out aten::pow.Tensor_Tensor_out aten::prod
aten::prod.int_out aten::prod.out aten::random_ aten::random_.from aten::random_.to
aten::randperm.generator_out aten::reciprocal.out aten::reflection_pad1d.out
aten::reflection_pad1d_backward.grad_input aten::reflection_pad2d aten::reflection_pad2d.out
aten::reflection_pad2d_backward aten::reflection_pad2d_backward.grad_input aten::relu
aten::relu.out aten::relu_ aten::remainder.Tensor_out aten::repeat aten::repeat.out
aten::replication_pad1d.out aten::replication_pad2d.out aten::reshape aten::resize_
aten::round.out aten::rsqrt.out aten::rsub.Scalar aten::rsub.Scalar_out aten::rsub.Tensor
aten::rsub.Tensor_out aten::scatter.reduce_out aten::scatter.src_out aten::scatter.value_out
aten::scatter.value_reduce_out aten::scatter_add.out aten::sgn.out aten::sigmoid.out
aten::sigmoid_backward.grad_input aten::sign.out aten::silu.out aten::sin.out aten::sinc.out
aten::sinh.out aten::smooth_l1_loss.out aten::smooth_l1_loss_backward.grad_input
aten::softplus.out aten::softplus_backward.grad_input aten::sort.values_stable
aten::split.Tensor aten::split_with_sizes aten::sqrt.out aten::std_mean.correction
aten::std_mean.correction_out aten::sub.out aten::sum.IntList_out aten::tan.out aten::tanh.out
aten::tanh_backward.grad_input aten::threshold.out aten::threshold_backward.grad_input
aten::topk.values aten::tril.out aten::triu.out aten::unfold aten::uniform_
aten::upsample_bicubic2d.out aten::upsample_bicubic2d_backward.grad_input
aten::upsample_bilinear2d.out aten::upsample_bilinear2d_backward.grad_input
aten::upsample_nearest2d.out aten::upsample_nearest2d_backward.grad_input aten::var.correction
aten::var.correction_out aten::view aten::where.self aten::where.self_out aten::zero_
""".split()
)
