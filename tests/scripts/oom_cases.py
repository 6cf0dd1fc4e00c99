"""Out-of-memory cases on an emulated DirectML adapter capped by DMLSHIM_EMULATOR_MEMORY.

``python tests/scripts/oom_cases.py CASE MIB``: installs dmlshim for ``emulated-dml`` with the
cap and prints ``result <key> <value>`` lines. The emulator's C++ device guard is installed
first: with torch >= 2.5's Python guard, an exception raised in the autograd engine's device
thread aborts the process (any exception, not only this one).

Cases: ``except`` (``except torch.cuda.OutOfMemoryError`` at entry points; inside forward,
backward and the optimizer step the wheel's RuntimeError), ``accelerate`` (``find_executable_batch_size``), ``hf``
(``Trainer(auto_find_batch_size=True)``), ``lightning`` (``Tuner.scale_batch_size``).
"""

import gc
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import emulated_dml as emulator  # noqa: E402

emulator.install_device_guard(cpp=True)

import torch  # noqa: E402

import dmlshim  # noqa: E402

MIB = 2**20
CASE, CAP = sys.argv[1], sys.argv[2]
dmlshim.install(device="emulated-dml", emulator_memory=CAP)


def result(key, value):
    print("result", key, value, flush=True)


# torch-directml's own error, untranslated (what real DirectML raises below the shim's frames)
WHEEL_ERROR = RuntimeError("Could not allocate tensor with 1048576 bytes. There is not enough "
                           "GPU video memory available!")


def case_except():
    def attempt(where, fn):
        try:
            fn()
        except torch.cuda.OutOfMemoryError as exc:
            result(where, type(exc).__name__)
            result(where + ":text", repr(exc.args))
        except RuntimeError as exc:  # what torch-directml raises where the shim has no frame
            result(where, "RuntimeError")
            result(where + ":text", repr(exc.args))

    attempt("factory", lambda: torch.zeros(2 * MIB, device="cuda"))  # 8 MiB
    attempt("Tensor.cuda", lambda: torch.zeros(2 * MIB).cuda())
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 512)).cuda()  # 2 MiB of weights
    x = torch.randn(1024, 512, device="cuda")  # 2 MiB: 4 MiB in use
    attempt("forward", lambda: model(x))  # the first activation needs 2 MiB more
    x = torch.randn(256, 512, device="cuda")  # 0.5 MiB
    loss = model(x).square().mean()  # keeps 2 MiB of activations: 4.5 MiB in use
    attempt("backward", loss.backward)  # the gradients need 2 MiB more
    del loss
    model.zero_grad(set_to_none=True)
    gc.collect()
    model(torch.randn(8, 512, device="cuda")).sum().backward()  # fits: 2 + 2 MiB
    opt = torch.optim.Adam(model.parameters())
    attempt("optimizer-step", opt.step)  # Adam's first moments need 2 MiB more
    model = x = opt = None  # noqa: F841 - frees the adapter
    gc.collect()
    result("allocated-after", torch.cuda.memory_allocated())


WIDTH = 256


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(4)])

    def forward(self, x, labels=None):
        out = self.net(x)
        if labels is None:
            return out
        return {"loss": (out - labels).square().mean(), "logits": out}


def train_step(batch_size):
    torch.manual_seed(0)
    model = MLP().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(batch_size, WIDTH, device="cuda")
    model(x).square().mean().backward()
    opt.step()


def fits(batch_size):
    try:
        train_step(batch_size)
        return True
    except RuntimeError as exc:  # translated, or the wheel's own text (inside forward)
        if isinstance(exc, torch.cuda.OutOfMemoryError) or "not enough GPU video memory" in str(exc):
            return False
        raise
    finally:
        gc.collect()


def case_accelerate():
    from accelerate.utils import find_executable_batch_size

    tried = []

    from accelerate.utils import memory

    result("recognises-wheel-error", memory.should_reduce_batch_size(WHEEL_ERROR))

    @find_executable_batch_size(starting_batch_size=2048)
    def train(batch_size):
        tried.append(batch_size)
        train_step(batch_size)
        return batch_size

    settled = train()
    result("tried", ",".join(map(str, tried)))
    result("settled", settled)
    result("settled-fits", fits(settled))
    result("double-fits", fits(2 * settled))


class Pairs(torch.utils.data.Dataset):
    def __init__(self, n=8192):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, WIDTH, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.x[i]}


def case_hf():
    import tempfile

    from accelerate.utils import memory
    from transformers import Trainer, TrainingArguments

    result("recognises-wheel-error", memory.should_reduce_batch_size(WHEEL_ERROR))

    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=4096,
                                 auto_find_batch_size=True, max_steps=2, report_to=[],
                                 save_strategy="no", logging_strategy="no", use_cpu=False,
                                 dataloader_num_workers=0, disable_tqdm=True)
        trainer = Trainer(model=MLP(), args=args, train_dataset=Pairs())
        output = trainer.train()
        result("device", str(next(trainer.model.parameters()).device))
        result("steps", output.global_step)
        result("settled", trainer.state.train_batch_size)


def case_lightning():
    import tempfile

    import lightning.pytorch as pl
    from lightning.pytorch.tuner import Tuner, batch_size_scaling

    result("recognises-wheel-error", batch_size_scaling.is_oom_error(WHEEL_ERROR))
    seen = set()

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.batch_size = 2
            self.model = MLP()

        def train_dataloader(self):
            return torch.utils.data.DataLoader(Pairs(), batch_size=self.batch_size)

        def training_step(self, batch, batch_idx):
            seen.add(str(batch["x"].device))
            return self.model(batch["x"], batch["labels"])["loss"]

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    module = Module()
    with tempfile.TemporaryDirectory() as root:
        trainer = pl.Trainer(accelerator="gpu", devices=1, max_epochs=1, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, default_root_dir=root)
        settled = Tuner(trainer).scale_batch_size(module, mode="power", init_val=64,
                                                  max_trials=10, steps_per_trial=1)
    result("device", ",".join(sorted(seen)))
    result("settled", settled)


{"except": case_except, "accelerate": case_accelerate, "hf": case_hf,
 "lightning": case_lightning}[CASE]()
