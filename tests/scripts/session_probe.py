"""What a session does, as JSON: ``session_probe.py OPTIONS_JSON [OPTIONS_JSON ...]``.

Installs each option set in turn (``dmlshim.install(**options)``); under every one but the last
it runs the same work and uninstalls; under the last it runs the work and prints what came of
it (the training result, the dtypes and devices the script saw, what the shim recorded, its
report minus times and process facts). tests/test_session.py compares a process that installed
A, uninstalled and installed B with a fresh process that installed only B.
"""

import json
import logging
import sys
import warnings

import torch
from torch.utils.data import DataLoader, TensorDataset

import dmlshim
import emulated_dml
from dmlshim import api

# As the test process does (tests/conftest.py): torch sizes autograd's device queues at the
# first backward() of a process, so a device registered after one (a CPU session, then an
# emulated one) could not run backward; that is torch's, not a session's, and real DirectML
# has it too (its guard comes with `import torch_directml`).
emulated_dml.install_device_guard()

VOLATILE = ("started", "ended", "duration_s", "process", "environment")


def attempt(fn):
    try:
        return fn()
    except Exception as err:  # noqa: BLE001 - the error is the observation
        return f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"


def work():
    out = {}
    out["devices"] = torch.cuda.device_count()
    out["cuda1"] = attempt(lambda: str(torch.empty(1, device="cuda:1").device))
    out["float64"] = attempt(lambda: str(torch.zeros(2, dtype=torch.float64, device="cuda").dtype))
    shim = api.session()
    if shim.capabilities.directml and shim.config.guards == "off":
        out["bf16"] = "not tried: aborts the process (the wheel's own behaviour, guards off)"
    else:
        out["bf16"] = attempt(lambda: str(torch.ones(2, dtype=torch.bfloat16).cuda().dtype))
    out["bf16_supported"] = attempt(torch.cuda.is_bf16_supported)

    def autocast():
        with torch.autocast("cuda"):
            return str(torch.mm(torch.ones(2, 2, device="cuda"), torch.ones(2, 2, device="cuda")).dtype)

    out["autocast"] = attempt(autocast)
    out["eye"] = attempt(lambda: torch.eye(3, device="cuda").sum().item())
    out["mul_bool"] = attempt(lambda: (torch.ones(3, device="cuda") * torch.tensor(
        [True, False, True], device="cuda")).tolist())
    out["big_alloc"] = attempt(lambda: str(torch.empty(64 * 2**20, device="cuda").shape))

    # the trap: an optimizer built before the move (rebind / reset / off decide what it steps)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    model.cuda()
    data = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 2)), batch_size=4)
    for _ in range(2):
        for x, y in data:
            loss = ((model(x.cuda()) - y.cuda()) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    out["loss"] = round(loss.item(), 5)
    out["weights"] = [round(p.detach().cpu().double().sum().item(), 5) for p in model.parameters()]
    out["optimizer_state"] = len(opt.state)
    out["logger_level"] = logging.getLogger("dmlshim").level
    return out


def main(argv):
    sets = [json.loads(a) for a in argv]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for options in sets[:-1]:
            dmlshim.install(**options)
            work()
            dmlshim.uninstall()
        dmlshim.install(**sets[-1])
        out = work()
    shim = api.session()
    diagnostics = shim.patch("diagnostics")
    report = diagnostics.report() if diagnostics is not None else {}
    for key in VOLATILE:
        report.pop(key, None)
    rewriters = shim.rewriters
    out["rules"] = {"dtype": sorted(str(d) for d in rewriters.dtype_rules),
                    "memory_format": rewriters.memory_format_rule is not None,
                    "policies": sorted(rewriters.policies)}
    out["tracked_optimizers"] = len(shim.rebind.live_optimizers())
    out["report"] = report
    print("SESSION " + json.dumps(out, sort_keys=True, default=str))


if __name__ == "__main__":
    main(sys.argv[1:])
