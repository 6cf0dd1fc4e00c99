"""What the framework scripts print besides their own losses, for tests/frameworks/fwcommon.py to
compare with the reference run: what the framework itself logged, and a digest of the trained
parameters. Not a user's code: the scripts' instrumentation (they import it as a sibling module;
python puts a script's folder first on ``sys.path``, under ``python -m dmlshim`` too).

- ``logged <key> <step> <float.hex()>``: a value the framework logged (HF Trainer's
  ``log_history``, a Lightning logger's records, a CSV the framework wrote, TensorBoard's event
  files read back, ...). A script's own ``loss`` lines show what the model computed; these show
  what the user reads, after the framework's own accumulators and reductions (HF Trainer's
  ``tr_loss -= tr_loss`` logged garbage on the torch-directml wheel while training was right).
- ``param <name> <numel> <sum> <sum of |x|> <sum of x*x>`` (the sums as ``float.hex()``) per
  parameter and floating point buffer (BatchNorm's running statistics), in float64 on the CPU after training: a wrong
  update anywhere changes one of the three.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Tuple


def log(key: str, step: int, value: Any) -> None:
    """One ``logged`` line (``key`` without spaces; ``value`` a number or a one-element tensor)."""
    assert " " not in key, key
    print(f"logged {key} {int(step)} {float(value).hex()}", flush=True)


def log_csv(path: Any, step_column: Optional[str] = None, skip: Iterable[str] = ()) -> None:
    """``logged`` lines for every numeric cell of the CSV file a framework wrote (column name
    stripped of spaces; the step is ``step_column``'s value, else the row's index)."""
    import csv

    skip = set(skip)
    with open(path, newline="", encoding="utf-8") as f:
        for index, row in enumerate(csv.DictReader(f)):
            row = {k.strip(): v.strip() for k, v in row.items() if k is not None}
            step = int(float(row[step_column])) if step_column else index
            for key, text in row.items():
                if key in skip or key == step_column or not text:
                    continue
                try:
                    value = float(text)
                except ValueError:
                    continue
                log(key.replace(" ", ""), step, value)


def _param(name: str, tensor: Any) -> None:
    import torch

    # to the CPU first, in its own dtype, then float64 there: no float64 on the adapter
    x = tensor.detach().to("cpu").to(torch.float64)
    print(f"param {name} {x.numel()} {x.sum().item().hex()} {x.abs().sum().item().hex()} "
          f"{x.square().sum().item().hex()}", flush=True)


def params(module: Any, prefix: str = "") -> None:
    """``param`` lines for ``module``'s parameters and floating point buffers."""
    tensors: List[Tuple[str, Any]] = list(module.named_parameters())
    tensors += [(n, b) for n, b in module.named_buffers() if b.is_floating_point()]
    for name, t in tensors:
        _param(prefix + name, t)


def tensors(named: Iterable[Tuple[str, Any]], prefix: str) -> None:
    """``param`` lines for ``(name, tensor)`` pairs (an EMA's shadow parameters under the names
    of the parameters they follow)."""
    for name, t in named:
        _param(prefix + name, t)


def accelerate_tracker() -> Any:
    """An accelerate tracker (``Accelerator(log_with=[tracker])``, accelerate's documented way to
    add one) that prints what ``accelerator.log`` hands it, as ``logged`` lines: numbers only
    (accelerate's own trackers drop other values too)."""
    from accelerate.tracking import GeneralTracker

    class Printing(GeneralTracker):
        name = "printing"
        requires_logging_directory = False

        def __init__(self) -> None:
            super().__init__()
            self.config: Dict[str, Any] = {}

        @property
        def tracker(self) -> Any:
            return self

        def store_init_configuration(self, values: dict) -> None:
            self.config = dict(values)

        def log(self, values: dict, step: Optional[int] = None, **kwargs: Any) -> None:
            for key, value in values.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    log(key, -1 if step is None else step, value)
                elif hasattr(value, "numel") and value.numel() == 1:
                    log(key, -1 if step is None else step, value.item())

    return Printing()
