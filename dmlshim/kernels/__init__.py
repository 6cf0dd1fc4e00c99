"""dmlshim's device kernels, in one place: the functions it registers for DirectML devices.

* :mod:`dmlshim.kernels.guards`: fixes of torch-directml 0.2.5's wrong results and failures
  (one record per guard, the kernels by family), installed by :mod:`dmlshim.patches.guards`.
* :mod:`dmlshim.kernels.decompositions`: ops the wheel runs on the CPU, computed from ops it
  has (installed by :mod:`dmlshim.patches.decompose`).
* :mod:`dmlshim.kernels.vision`: the autograd layer torchvision's ops lack for the device.

Kernels the emulator runs too (the fused LSTM cell, CUDA's autocast kernels) live in
:mod:`dmlshared`, which imports neither dmlshim nor the emulator.

Guard kernels come in two kinds, by the key they are registered for:

* **Input fixes, on ``AutogradPrivateUse1``** (above autograd): where the wheel's kernel is
  right for part of the inputs (or for all, once they are fixed: float × bool, a negative
  ``ignore_index``, negative ``flip`` dims), the kernel fixes the inputs and hands them to the
  wheel's own kernel through torch's autograd kernel for the op (see
  :mod:`dmlshim.kernels.guards.passthrough`), which records the derivative formula and goes on
  to the wheel's kernel as any call does. Where the result must be computed otherwise (reflect
  padding of unequal sides, the 2-D ``nll_loss`` forward with reduction none, ``unique``
  counts), it is built from functional ops above autograd, which then records their
  derivatives. The wheel's own C++ kernels, which call other ops below autograd (its batch
  norm, dropout and attention multiply by wrapped-number scalars), never pass through Python.
* **Replacements, on ``PrivateUse1``** (below autograd: PyTorch's derivative formula stays in
  force): ``eye``, bilinear interpolation and ``logsumexp``, computed from functional ops the
  wheel gets right, never calling the wheel's kernel for the op itself.

The wheel's rules every kernel here follows (the emulator enforces them;
tests/test_device_kernel_rules.py): it accepts every argument form the dispatcher hands it (a
wrapped-number scalar arrives as a Python number: ``x * 2.0``, ``2.0 * x``); it never calls an
``out=`` overload of the wheel (its ``out=`` kernels return dangling tensors to a boxed caller:
heap corruption; ``nll_loss_forward.output`` aborts the process) and calls the wheel's in-place
kernels through torch's C functions (unboxed: a boxed call of its ``masked_fill_`` loses the
write); each dimension it passes is non-negative (``flip`` with a negative dim segfaults in the
wheel); each output is allocated at its final shape by a functional op; no scatter updates part
of a dimension and none accumulates (``scatter_add`` raises on the software adapter). A kernel
is one Python frame on the paths every call takes: no helpers there, no factory call that
dmlshim's device rule wraps (``aten.*`` overloads instead of ``torch.empty``/``torch.arange``).
"""
