"""The guards: dmlshim's fixes of torch-directml 0.2.5's wrong results and failures.

:mod:`~dmlshim.kernels.guards.records` holds one record per guard (what the wheel does, where it
was seen, the fix, the emulator switch, the tests); the code is grouped by family: creation,
arithmetic, losses, masking, spatial, shape, indexing, norms, reductions, readback. Most guards
are device kernels of two kinds (see :mod:`dmlshim.kernels`): input fixes above autograd, which
hand the wheel's own kernel fixed inputs (:mod:`~dmlshim.kernels.guards.passthrough`), and
replacements on PrivateUse1. The rest are a policy of ``Tensor.to`` (readback), a setting of
autograd's (shape) and wrappers of Python entry points (arithmetic, norms).
:mod:`dmlshim.patches.guards` installs them.
"""
