"""What dmlshim and its emulator share: the emulator's switch names and plain-torch kernels.

A third top-level package because both sides import it and neither may bring the other along:
anything under ``dmlshim/`` would run ``dmlshim/__init__`` when the emulator imported it, and
the product must not import the emulator (tests/test_import_boundaries.py checks all three
rules). Nothing here imports dmlshim or emulated_dml, and this file imports nothing at all:
``dmlshim.config`` reads :mod:`dmlshared.emulator_switches` before torch is imported.

* :mod:`dmlshared.emulator_switches`: the names ``DMLSHIM_EMULATOR_GAPS`` takes (no torch).
* :mod:`dmlshared.lstm_cell`: the fused LSTM cell, forward and backward (CUDA's formulas), which
  dmlshim registers for DirectML and the emulator runs where its ``fallback`` gap is off.
* :mod:`dmlshared.autocast_kernels`: CUDA's autocast for ``privateuseone``, which dmlshim's AMP
  patch holds on DirectML and the emulator holds where its ``autocast`` gap is off.
"""
