"""The DirectML training stall, end to end: CUDA-style scripts (tests/corpus/stall/train.py) run
through ``python -m dmlshim`` on the CPU target, Parameter replacement forced with torch's
overwrite flag (``--overwrite-params``), against a native CPU run of the same script with its
optimizer built in the right order.

With ``DMLSHIM_OPTIMIZER=off`` the stall shows: every epoch prints the same losses (nothing
trains) and the shim reports the stale optimizer. With ``rebind`` the losses equal the native
run's bit for bit. The emulated-DirectML runs (where the replacement happens by itself) are in
test_optim_emulated.py.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from typing import Dict, List, Sequence

import pytest
from helpers import describe, first_difference, losses, run_native, run_shim

SCRIPT = "stall/train.py"
# An empty working directory of our own: `python -m` puts the cwd first on sys.path, so a stray
# module in the shared temp dir (an enum.py, say) must not shadow the standard library.
CWD = tempfile.mkdtemp(prefix="dmlshim-optim-")
atexit.register(shutil.rmtree, CWD, True)
DMLSHIM_WARNINGS = ("StaleOptimizerWarning", "RecreatedOptimizerWarning")

# Each case covers several items of the evidence list; together: SGD+momentum, Adam, AdamW,
# RMSprop; StepLR, OneCycleLR, ReduceLROnPlateau; tied weights; a cpu()/to() bounce every epoch;
# load_state_dict(assign=True); optimizer built before and after the move; an LSTM.
CASES: Dict[str, Sequence[str]] = {
    "sgd-steplr-built-before-move": ("--optim", "sgd", "--sched", "step", "--order", "wrong"),
    "adam-onecycle-built-after-move-bounce": ("--optim", "adam", "--sched", "onecycle",
                                              "--order", "right", "--bounce"),
    "lstm-adamw-plateau-load-assign": ("--model", "lstm", "--optim", "adamw", "--sched",
                                       "plateau", "--assign", "--order", "wrong"),
    "rmsprop-tied-bounce": ("--model", "tied", "--optim", "rmsprop", "--bounce",
                            "--order", "wrong"),
}


def right_order(args: Sequence[str]) -> List[str]:
    """The same script arguments with the optimizer built after the move/load."""
    out = list(args)
    i = out.index("--order")
    out[i + 1] = "right"
    return out


def train_losses_by_epoch(stdout: str) -> Dict[int, List[str]]:
    by_epoch: Dict[int, List[str]] = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == "loss" and parts[2] != "val":
            by_epoch.setdefault(int(parts[1]), []).append(parts[3])
    return by_epoch


def stalled(stdout: str) -> bool:
    """Nothing trained in the last epoch: it printed the very losses of the epoch before
    (data order is fixed, there is no dropout)."""
    by_epoch = train_losses_by_epoch(stdout)
    last = max(by_epoch)
    return last > 1 and by_epoch[last] == by_epoch[last - 1]


def native(args: Sequence[str]):
    proc = run_native(SCRIPT, *right_order(args), cwd=CWD)
    assert proc.returncode == 0, describe(proc)
    assert not stalled(proc.stdout), "the native run itself does not train" + describe(proc)
    return proc


def shimmed(args: Sequence[str], policy: str, device: str = "cpu", via: str = "runner"):
    extra = ["--overwrite-params"] if device == "cpu" else []
    proc = run_shim(SCRIPT, *args, *extra, device=device, via=via, cwd=CWD,
                    options={"optimizer": policy})
    assert proc.returncode == 0, describe(proc)
    return proc


@pytest.mark.parametrize("case", list(CASES))
def test_stall_with_off(case):
    args = CASES[case]
    ref = native(args)
    off = shimmed(args, "off")
    assert stalled(off.stdout), "expected the stall with DMLSHIM_OPTIMIZER=off" + describe(off)
    assert losses(off.stdout) != losses(ref.stdout)
    assert "StaleOptimizerWarning" in off.stderr and "DMLSHIM_OPTIMIZER" in off.stderr, \
        describe(off)
    # the no-gradient alarm names the fix, not a graph problem (a .detach()) or DMLSHIM_CHECK
    alarms = [line for line in off.stderr.splitlines() if "received no gradient" in line]
    if "--order" in args and args[args.index("--order") + 1] == "wrong":
        assert alarms, describe(off)  # the optimizer stepped dead copies from its first step
    for line in alarms:
        assert "unset DMLSHIM_OPTIMIZER" in line and ".detach()" not in line \
            and "DMLSHIM_CHECK" not in line, line


@pytest.mark.parametrize("case", list(CASES))
def test_rebind_equals_native_right_order(case):
    args = CASES[case]
    ref = native(args)
    # one case through `import dmlshim` as the script's first line, the rest through the runner
    via = "import" if case == "rmsprop-tied-bounce" else "runner"
    got = shimmed(args, "rebind", via=via)
    assert losses(got.stdout) == losses(ref.stdout), \
        first_difference(losses(got.stdout), losses(ref.stdout)) + describe(got)
    assert not any(w in got.stderr for w in DMLSHIM_WARNINGS), describe(got)


def test_recreate_every_epoch_workaround_keeps_state_and_schedule():
    """The article's workaround (new optimizer each epoch, StepLR on the first) under rebind
    trains exactly like the script with one optimizer, and says once that it is unnecessary."""
    args = ("--optim", "sgd", "--sched", "step", "--order", "right")
    ref = native(args)
    got = shimmed((*args, "--recreate"), "rebind")
    assert losses(got.stdout) == losses(ref.stdout), \
        first_difference(losses(got.stdout), losses(ref.stdout)) + describe(got)
    assert got.stderr.count("RecreatedOptimizerWarning") == 1, describe(got)
    assert "unnecessary" in got.stderr


def test_reset_is_the_workaround_done_for_the_user():
    """reset on the stalling script == the article's re-create-every-epoch run natively."""
    article = run_native(SCRIPT, "--optim", "adam", "--order", "right", "--recreate", cwd=CWD)
    assert article.returncode == 0, describe(article)
    got = shimmed(("--optim", "adam", "--order", "wrong"), "reset")
    assert losses(got.stdout) == losses(article.stdout), \
        first_difference(losses(got.stdout), losses(article.stdout)) + describe(got)
    assert not stalled(got.stdout)


FINE_TUNE = '''
import torch
import torch.nn.functional as F

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
device = "cuda" if torch.cuda.is_available() else "cpu"
model = model.to(device)
x, y = torch.randn(64, 8, device=device), torch.randint(0, 3, (64,), device=device)


def train(opt, steps, stage):
    for i in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        print("loss", stage, i, loss.item().hex())


opt = torch.optim.Adam(model.parameters(), lr=0.01)
sched = torch.optim.lr_scheduler.StepLR(opt, 5, gamma=0.5)
for _ in range(20):
    train(opt, 1, 0)
    sched.step()
opt = torch.optim.Adam(model.parameters(), lr=0.002)  # fine-tuning: a fresh optimizer, on purpose
train(opt, 5, 1)
p = next(model.parameters())
print("step", int(opt.state[p]["step"]), "lr", opt.param_groups[0]["lr"])
'''


def test_deliberate_optimizer_restart_starts_fresh_as_without_the_shim(tmp_path):
    """A second optimizer built at another line is a restart, not the workaround: it starts
    fresh (5 steps, its own lr), and the run equals the native one bit for bit."""
    script = tmp_path / "fine_tune.py"
    script.write_text(FINE_TUNE)
    ref = run_native(script, cwd=CWD, cached=False)
    assert ref.returncode == 0, describe(ref)
    got = run_shim(script, cwd=CWD, options={"optimizer": "rebind"})
    assert got.returncode == 0, describe(got)
    assert "step 5 lr 0.002" in ref.stdout
    assert got.stdout == ref.stdout, describe(got)
    assert "RecreatedOptimizerWarning" not in got.stderr, describe(got)
