"""DMLSHIM_OPTIMIZER in-process: what rebind, reset and off do to optimizers, schedulers, tied
weights, GradScaler and AveragedModel when conversions replace Parameters.

Replacement is reproduced on the CPU with torch's overwrite flag (as DirectML does for every
CPU<->adapter move), or with moves to the ``meta`` device, which replace Parameters in every
torch build and so show state following its parameter to another device.
"""

from __future__ import annotations

import copy
import gc
import logging
import warnings
import weakref

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import dmlshim
from dmlshim import events
from dmlshim.rebind.boundaries import StaleOptimizerWarning
from dmlshim.rebind.workaround import RecreatedOptimizerWarning


@pytest.fixture
def overwrite():
    """Conversions replace Parameter objects, as on DirectML."""
    before = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        yield
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(before)


@pytest.fixture(autouse=True)
def _clean_events():
    events.reset()
    yield
    events.reset()


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Embedding(10, 4)
        self.decoder = nn.Linear(4, 10)
        self.decoder.weight = self.encoder.weight

    def forward(self, tokens):
        return self.decoder(self.encoder(tokens))


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


DATA = (torch.randn(32, 4, generator=torch.Generator().manual_seed(1)),
        torch.randint(0, 3, (32,), generator=torch.Generator().manual_seed(2)))


def train_steps(model, opt, n=3, scaler=None):
    x, y = DATA
    out = []
    for i in range(n):
        xb, yb = x[i * 8:(i + 1) * 8], y[i * 8:(i + 1) * 8]
        opt.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        out.append(loss.item())
    return out


def params_of(opt):
    return [p for g in opt.param_groups for p in g["params"]]


def same_objects(a, b):
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


# -- install / uninstall ----------------------------------------------------------------------

def _patched_attrs():
    from dmlshim.patches.optim import scheduler_classes_with_step
    from dmlshim.rebind.registry import SCHEDULER_TYPES

    attrs = [(nn.Module, "_apply"), (nn.Module, "load_state_dict"), (nn.Module, "train"),
             (torch.optim.Optimizer, "__init__"), (DataLoader, "__iter__")]
    attrs += [(cls, "__init__") for cls in dict.fromkeys(SCHEDULER_TYPES)]
    attrs += [(cls, "step") for cls in scheduler_classes_with_step()]
    return attrs


@pytest.mark.parametrize("policy", ["rebind", "reset", "off"])
def test_uninstall_restores_every_patched_attribute(shim, policy):
    attrs = _patched_attrs()
    before = [vars(owner).get(name) for owner, name in attrs]
    step_before = {cls: vars(cls)["step"] for cls in (torch.optim.SGD, torch.optim.Adam)}
    shim(device="cpu", optimizer=policy)
    assert "optim" in dmlshim.api.installed_patches()
    assert any(vars(owner).get(name) is not orig for (owner, name), orig in zip(attrs, before))
    # no hook on the hot path: optimizer.step is torch's own
    assert all(vars(cls)["step"] is fn for cls, fn in step_before.items())
    dmlshim.uninstall()
    for (owner, name), orig in zip(attrs, before):
        assert vars(owner).get(name) is orig, f"{owner.__name__}.{name} not restored"


# -- rebind -----------------------------------------------------------------------------------

def test_rebind_after_conversion_matches_right_order(shim, overwrite):
    ref_model = mlp()
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.1, momentum=0.9)
    with torch.no_grad():
        pass
    torch.__future__.set_overwrite_module_params_on_conversion(False)
    expected = train_steps(ref_model, ref_opt, 2) + train_steps(ref_model, ref_opt, 2)
    torch.__future__.set_overwrite_module_params_on_conversion(True)

    shim(device="cpu", optimizer="rebind")
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    got = train_steps(model, opt, 2)
    old = list(model.parameters())
    model.cuda()
    assert not any(p is q for p, q in zip(old, model.parameters())), "no replacement happened"
    assert same_objects(params_of(opt), list(model.parameters()))
    assert set(map(id, opt.state)) == set(map(id, model.parameters()))
    got += train_steps(model, opt, 2)
    assert got == expected
    assert events.notes["optimizer.rebind"] == 4


def test_old_parameters_and_state_are_not_kept_alive(shim, overwrite):
    shim(device="cpu", optimizer="rebind")
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    train_steps(model, opt, 1)
    old_refs = [weakref.ref(p) for p in model.parameters()]
    model.to("cuda")
    gc.collect()
    assert all(r() is None for r in old_refs)


def test_state_follows_parameter_device_step_stays_on_host(shim):
    shim(device="cpu", optimizer="rebind")
    model, other = mlp(), mlp()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    fused = torch.optim.Adam(other.parameters(), lr=0.01, fused=True)
    train_steps(model, opt, 1)
    train_steps(other, fused, 1)
    model.to("meta")  # meta replaces Parameters in every torch build
    other.to("meta")
    assert same_objects(params_of(opt), list(model.parameters()))
    for p in model.parameters():
        st = opt.state[p]
        assert st["exp_avg"].device.type == "meta" and st["exp_avg_sq"].device.type == "meta"
        assert st["step"].device.type == "cpu"  # torch keeps it a host scalar
    for p in other.parameters():
        assert fused.state[p]["step"].device.type == "meta"  # fused: step lives with p
    assert events.notes["optimizer.state_moved"] == 8
    assert events.notes["optimizer.recreated"] == 0


def test_dtype_conversion_keeps_state_dtype(shim, overwrite):
    shim(device="cpu", optimizer="rebind")
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train_steps(model, opt, 1)
    model.double()
    assert same_objects(params_of(opt), list(model.parameters()))
    # as with CUDA, where .double() keeps the Parameter and its optimizer state untouched
    assert all(opt.state[p]["momentum_buffer"].dtype == torch.float32 for p in model.parameters())


def test_tied_weights_stay_tied_and_optimizer_holds_one(shim, overwrite):
    shim(device="cpu", optimizer="rebind")
    model = Tied()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss = model(torch.tensor([1, 2, 3])).sum()
    loss.backward()
    opt.step()
    model.cuda()
    assert model.decoder.weight is model.encoder.weight
    assert model.encoder.weight.grad is not None
    assert same_objects(params_of(opt), list(model.parameters()))
    assert events.notes["optimizer.retie"] == 1


def test_tied_weights_off_are_left_as_torch_leaves_them(shim, overwrite):
    shim(device="cpu", optimizer="off")
    model = Tied()
    model.cuda()
    assert model.decoder.weight is not model.encoder.weight  # torch's own _apply unties them


def test_lstm_flat_weights_follow_rebind(shim, overwrite):
    shim(device="cpu", optimizer="rebind")
    torch.manual_seed(0)
    lstm = nn.LSTM(3, 4)
    opt = torch.optim.Adam(lstm.parameters(), lr=0.01)
    lstm.cuda()
    assert same_objects(params_of(opt), list(lstm.parameters()))
    assert all(a is b for a, b in zip(lstm._flat_weights, lstm.parameters()))


def test_load_state_dict_assign_rebinds_and_reties(shim):
    shim(device="cpu", optimizer="rebind")
    model = Tied()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sd = copy.deepcopy(model.state_dict())  # one tensor under both tied names, as saved
    model.load_state_dict(sd, assign=True)
    assert model.decoder.weight is model.encoder.weight
    assert same_objects(params_of(opt), list(model.parameters()))


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_load_state_dict_assign_untied_tensors_stay_separate(shim):
    shim(device="cpu", optimizer="rebind")
    records = _Records()
    logging.getLogger("dmlshim").addHandler(records)  # the shim's logger does not propagate
    try:
        model = Tied()
        sd = {k: v.clone() for k, v in model.state_dict().items()}
        model.load_state_dict(sd, assign=True)
    finally:
        logging.getLogger("dmlshim").removeHandler(records)
    assert model.decoder.weight is not model.encoder.weight
    assert any("tied parameters (Embedding.weight, Linear.weight)" in line
               for line in records.lines)


def test_optimizer_built_before_install_is_found(shim, overwrite):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    shim(device="cpu", optimizer="rebind")
    model.cuda()
    assert same_objects(params_of(opt), list(model.parameters()))


def test_optimizer_built_over_stale_list_is_rebound(shim, overwrite):
    shim(device="cpu", optimizer="rebind")
    model = mlp()
    params = list(model.parameters())
    model.cuda()
    opt = torch.optim.SGD(params, lr=0.1)
    assert same_objects(params_of(opt), list(model.parameters()))


def test_lbfgs_keeps_its_params_list(shim, overwrite):
    shim(device="cpu", optimizer="rebind")
    model = mlp()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.1, history_size=3)
    x, y = DATA

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss

    opt.step(closure)
    model.cuda()
    assert opt._params is opt.param_groups[0]["params"]
    assert same_objects(opt._params, list(model.parameters()))
    opt.step(closure)


def test_grad_scaler_and_scheduler_keep_working(shim, overwrite):
    torch.__future__.set_overwrite_module_params_on_conversion(False)
    ref = mlp()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, 1, gamma=0.5)
    ref_scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
    expected = train_steps(ref, ref_opt, 2, ref_scaler)
    ref_sched.step()
    expected += train_steps(ref, ref_opt, 2, ref_scaler)
    torch.__future__.set_overwrite_module_params_on_conversion(True)

    shim(device="cpu", optimizer="rebind")
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
    got = train_steps(model, opt, 2, scaler)
    sched.step()
    model.cpu()
    model.cuda()
    got += train_steps(model, opt, 2, scaler)
    assert got == expected
    assert opt.param_groups[0]["lr"] == ref_opt.param_groups[0]["lr"]


def test_averaged_model_keeps_working(shim, overwrite):
    from torch.optim.swa_utils import AveragedModel

    torch.__future__.set_overwrite_module_params_on_conversion(False)
    ref = mlp()
    ref_swa = AveragedModel(ref)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.01)
    for _ in range(2):
        train_steps(ref, ref_opt, 2)
        ref_swa.update_parameters(ref)
    torch.__future__.set_overwrite_module_params_on_conversion(True)

    shim(device="cpu", optimizer="rebind")
    model = mlp()
    swa = AveragedModel(model)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(2):
        train_steps(model, opt, 2)
        model.cpu()
        swa.cuda()
        model.cuda()
        swa.update_parameters(model)
    for a, b in zip(swa.parameters(), ref_swa.parameters()):
        assert torch.equal(a, b)
    assert int(swa.n_averaged) == 2


# -- the article's workaround: a new optimizer every epoch ------------------------------------

def test_recreated_optimizer_continues_and_scheduler_follows(shim):
    ref = mlp()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, 1, gamma=0.5)
    expected = []
    for _ in range(3):
        expected += train_steps(ref, ref_opt, 2)
        ref_sched.step()

    shim(device="cpu", optimizer="rebind")
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    got = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)  # the workaround
            got += train_steps(model, opt, 2)
            sched.step()
    assert got == expected
    assert sched.optimizer is opt
    recreated = [w for w in caught if issubclass(w.category, RecreatedOptimizerWarning)]
    assert len(recreated) == 1, [str(w.message) for w in caught]
    assert "unnecessary" in str(recreated[0].message)
    assert not [w for w in caught if "overridden" in str(w.message)]  # torch's step check holds


def test_recreated_with_new_lr_keeps_the_users_lr(shim):
    shim(device="cpu", optimizer="rebind")
    model = mlp()
    opts = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for lr in (0.1, 0.03):  # a hand-made schedule: one line, a new lr each epoch
            opts.append(torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9))
            train_steps(model, opts[-1], 1)
    first, new = opts
    assert new.param_groups[0]["lr"] == 0.03
    p = next(model.parameters())
    assert new.state[p] is first.state[p]  # the momentum goes on


def _fine_tune(helper: bool):
    """A CUDA program with a deliberate restart: train, then a new Adam for a fine-tuning
    stage, built at another line (or by one helper called from two lines)."""
    def make(model, lr):
        return torch.optim.Adam(model.parameters(), lr=lr)

    model = mlp()
    opt = make(model, 0.01) if helper else torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    out = []
    for _ in range(4):
        out += train_steps(model, opt, 3)
        sched.step()
    first = opt
    opt = make(model, 0.002) if helper else torch.optim.Adam(model.parameters(), lr=0.002)
    out += train_steps(model, opt, 3) + train_steps(model, opt, 2)
    p = next(model.parameters())
    return out, int(opt.state[p]["step"]), opt.param_groups[0]["lr"], sched.optimizer is first


@pytest.mark.parametrize("helper", [False, True])
def test_deliberate_restart_at_another_call_site_starts_fresh(shim, helper):
    native = _fine_tune(helper)
    assert native[1:] == (5, 0.002, True)
    shim(device="cpu", optimizer="rebind")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _fine_tune(helper)
    assert got == native  # losses bit for bit, 5 steps (not 17), lr 0.002, scheduler stays
    assert not [w for w in caught if issubclass(w.category, RecreatedOptimizerWarning)]
    assert events.notes["optimizer.recreated"] == 0


def test_other_class_or_other_params_is_not_a_recreation(shim):
    shim(device="cpu", optimizer="rebind")
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train_steps(model, opt, 1)
    adam = torch.optim.Adam(model.parameters(), lr=0.01)
    assert not adam.state
    head = torch.optim.SGD(model[2].parameters(), lr=0.1, momentum=0.9)
    assert not head.state
    assert events.notes["optimizer.recreated"] == 0


def test_reset_policy_does_not_carry_state_to_recreated(shim):
    shim(device="cpu", optimizer="reset")
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train_steps(model, opt, 1)
    new = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    assert not new.state


# -- epoch boundaries: reset and the audit ----------------------------------------------------

def _loader():
    return DataLoader(TensorDataset(*DATA), batch_size=8)


@pytest.mark.filterwarnings("ignore:Detected call of:UserWarning")
def test_reset_clears_state_at_epoch_start_not_mid_epoch(shim):
    shim(device="cpu", optimizer="reset")
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.01, total_steps=100)
    plateau_opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step_sched = torch.optim.lr_scheduler.StepLR(plateau_opt, 1)
    train_loader, val_loader = _loader(), _loader()
    seen = []
    for _epoch in range(2):
        model.train()
        for i, (x, y) in enumerate(train_loader):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            sched.step()  # per batch: never an epoch boundary
            if i == 1:
                step_sched.step()  # inside a pass: not a boundary either
                model.eval()
                for _ in val_loader:  # mid-epoch validation
                    pass
                model.train()
            seen.append(int(opt.state[next(model.parameters())]["step"]))
        model.eval()
    # the step count restarts with each epoch and only then
    assert seen == [1, 2, 3, 4, 1, 2, 3, 4]
    assert events.notes["optimizer.reset"] >= 1


def test_reset_at_scheduler_step_between_epochs(shim):
    shim(device="cpu", optimizer="reset")
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    train_steps(model, opt, 2)
    assert opt.state
    sched.step()
    assert not opt.state
    assert opt.param_groups[0]["lr"] == 0.05  # param groups and the schedule are kept


def test_reset_after_train_following_eval(shim):
    shim(device="cpu", optimizer="reset")
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train_steps(model, opt, 1)
    model.train()  # already training: nothing
    assert opt.state
    model.eval()
    assert opt.state
    model.train()
    assert not opt.state


def test_off_reports_stale_optimizer_once_and_changes_nothing(shim, overwrite):
    shim(device="cpu", optimizer="off")
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    old = params_of(opt)
    model.cuda()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            for _ in _loader():
                pass
    assert same_objects(params_of(opt), old)
    stale = [w for w in caught if issubclass(w.category, StaleOptimizerWarning)]
    assert len(stale) == 1
    text = str(stale[0].message)
    assert "SGD" in text and "DMLSHIM_OPTIMIZER" in text and "rebind" in text
    assert events.notes["optimizer.stale"] == 4


def test_audit_rebinds_what_conversion_missed(shim, overwrite):
    shim(device="cpu", optimizer="rebind")
    from dmlshim.rebind import registry

    tracked = registry.current()
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    del tracked.optimizers[opt]  # as if built by code the hooks did not see
    model.cuda()
    assert not same_objects(params_of(opt), list(model.parameters()))
    tracked.track_optimizer(opt)
    for _ in _loader():
        break
    assert same_objects(params_of(opt), list(model.parameters()))


def test_torch_scheduler_warnings_keep_their_location(shim):
    """torch warns from scheduler.step() (with stacklevel=2 in recent versions: at the user's
    line); the hook must not move that location onto dmlshim's code."""
    def where():
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.StepLR(opt, 1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sched.step()  # before any optimizer.step(): torch warns
        found = [w for w in caught if "before `optimizer.step()`" in str(w.message)]
        assert found
        return found[0].filename, found[0].lineno

    native = where()
    shim(device="cpu", optimizer="rebind")
    assert where() == native


def test_recreated_adam_follows_onecycle_lr_and_betas(shim):
    """OneCycleLR also schedules Adam's beta1 (cycle_momentum): the re-created optimizer takes
    over the scheduled values, not its constructor's."""
    def run(recreate):
        model = mlp()
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=6)
        out = []
        for _ in range(3):
            if recreate:
                opt = torch.optim.Adam(model.parameters(), lr=0.01)
            for _ in range(2):
                out += train_steps(model, opt, 1)
                sched.step()
        return out, opt.param_groups[0]["betas"]

    expected, betas = run(recreate=False)
    shim(device="cpu", optimizer="rebind")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecreatedOptimizerWarning)
        got, got_betas = run(recreate=True)
    assert got == expected
    assert got_betas == betas


def test_conversion_of_another_tree_inside_apply_is_covered(shim, overwrite):
    class Holder(nn.Module):
        """Converts a model it keeps outside its children (e.g. an EMA copy) along with itself."""

        def __init__(self, other):
            super().__init__()
            self.fc = nn.Linear(2, 2)
            self.__dict__["other"] = other  # not a submodule

        def _apply(self, fn, recurse=True):
            self.other._apply(fn)
            return super()._apply(fn, recurse)

    shim(device="cpu", optimizer="rebind")
    other = mlp()
    holder = Holder(other)
    root = nn.Sequential(nn.Linear(2, 2), holder)  # the other tree is converted mid-way
    opt_other = torch.optim.SGD(other.parameters(), lr=0.1)
    opt_root = torch.optim.SGD(root.parameters(), lr=0.1)
    old = params_of(opt_other)
    root.cuda()
    assert not any(p is q for p, q in zip(old, other.parameters()))
    assert same_objects(params_of(opt_other), list(other.parameters()))
    assert same_objects(params_of(opt_root), list(root.parameters()))
