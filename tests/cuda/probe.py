"""What a CUDA training script sees of torch on a real GPU, for tests/cuda/test_inert_on_cuda.py
to compare between a native run (``python probe.py``) and runs under dmlshim (the runner,
``import dmlshim``; auto and ``DMLSHIM_DEVICE=cuda``), where dmlshim must change nothing.

    python tests/cuda/probe.py api,amp,checkpoint,dataloader,errors,frames
    python tests/cuda/probe.py compile
    python tests/cuda/probe.py ddp          # NCCL, world size 1 (env:// under torchrun)
    python tests/cuda/probe.py uninstall    # imports dmlshim itself, after torch

Each section prints ``SECTION <name> <json>``, and the run ends with ``SHIM <json>``: whether
dmlshim is loaded and what it chose (the one line that differs from a native run by design).
Values are exact, so that equal lines mean equal behaviour: floats as ``float.hex()``, tensors
as their device, dtype, shape and the sha256 of their bytes, objects by their type's module and
qualified name, errors by type, message and the files their traceback passes through (a
wrapper of dmlshim's would add its own). Anything that varies between two native runs (free
memory, timings, the serialization id torch writes into each checkpoint) is left out; the test
also compares two native runs, so what still varies shows as the probe's fault, not dmlshim's.
"""

from __future__ import annotations

import os

# cuBLAS is deterministic with a fixed workspace (read when its first handle is made), and
# torch.use_deterministic_algorithms below needs it: the values of two runs are bit-identical
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import hashlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import linecache  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import traceback  # noqa: E402
import types  # noqa: E402
import warnings  # noqa: E402
import zipfile  # noqa: E402
from collections import Counter  # noqa: E402
from typing import Any, Callable, Dict, List  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# before anything of the script touches CUDA (dmlshim, when there, has already run)
STARTED_INITIALIZED = torch.cuda.is_initialized()
torch.use_deterministic_algorithms(True)
torch.backends.cudnn.benchmark = False

WARMUP, STEPS = 8, 5  # dmlshim's gradient check watches the first 3 optimizer steps only


# -- exact descriptions -----------------------------------------------------------------------

def kind(obj: Any) -> str:
    t = type(obj)
    return f"{t.__module__}.{t.__qualname__}"


def tensor(t: torch.Tensor) -> Dict[str, Any]:
    raw = t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return {"type": kind(t), "device": str(t.device), "dtype": str(t.dtype),
            "shape": list(t.shape), "sha256": hashlib.sha256(raw).hexdigest()}


def value(obj: Any) -> Any:
    """``obj`` as JSON that tells apart what a script could tell apart."""
    if isinstance(obj, torch.Tensor):
        return tensor(obj)
    if isinstance(obj, float):
        return {"float": obj.hex()}
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, (list, tuple)):
        return {"seq": kind(obj), "items": [value(v) for v in obj]}
    if isinstance(obj, dict):
        return {"map": kind(obj), "items": [[value(k), value(v)] for k, v in obj.items()]}
    if isinstance(obj, (torch.device, torch.dtype)):
        return {kind(obj): str(obj)}
    if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, type)):
        return {"callable": kind(obj), "name": f"{obj.__module__}.{obj.__qualname__}"}
    return {"object": kind(obj)}


def caught(fn: Callable[[], Any]) -> Any:
    """``fn()``'s value, or the error it raised: type, message and traceback files."""
    try:
        return value(fn())
    except Exception as err:  # noqa: BLE001 - the error is the answer being compared
        files = [os.path.basename(f.filename) for f in traceback.extract_tb(err.__traceback__)]
        return {"error": kind(err), "message": str(err), "traceback": files}


def namespace(module: Any) -> Dict[str, Any]:
    """Every public name of ``module`` and what it is (submodules left out: dmlshim may have
    imported one that the script has not, which is not a change of torch's)."""
    out = {}
    for name in sorted(dir(module)):
        if name.startswith("__"):
            continue
        try:
            obj = getattr(module, name)
        except Exception as err:  # noqa: BLE001 - a lazy attribute that fails: that is its answer
            out[name] = {"error": kind(err), "message": str(err)}
            continue
        if isinstance(obj, types.ModuleType):
            continue
        out[name] = value(obj) if isinstance(obj, (bool, int, float, str, type(None))) or \
            callable(obj) else {"object": kind(obj)}
    return out


def recorded_warnings(caught_warnings: List[warnings.WarningMessage]) -> List[Any]:
    # the line a warning points at by its text: the copy with ``import dmlshim`` has one line
    # more above it
    return [[w.category.__name__, str(w.message), os.path.basename(w.filename),
             linecache.getline(w.filename, w.lineno).strip()] for w in caught_warnings]


def digest(module: nn.Module) -> Dict[str, Any]:
    return {name: tensor(p)["sha256"] for name, p in module.state_dict().items()}


# -- sections ---------------------------------------------------------------------------------

def api() -> Dict[str, Any]:
    c = torch.cuda
    n = c.device_count()
    out: Dict[str, Any] = {
        "initialized at the script's first line": STARTED_INITIALIZED,
        "is_available": c.is_available(), "device_count": n, "is_initialized": c.is_initialized(),
        "current_device": c.current_device(),
        "names": [c.get_device_name(i) for i in range(n)],
        "capabilities": [value(c.get_device_capability(i)) for i in range(n)],
        "properties": [repr(c.get_device_properties(i)) for i in range(n)],
        "properties type": kind(c.get_device_properties(0)),
        "arch list": c.get_arch_list(), "is_bf16_supported": c.is_bf16_supported(),
        "cudnn": [torch.backends.cudnn.is_available(), torch.backends.cudnn.version(),
                  torch.backends.cudnn.enabled, torch.backends.cudnn.deterministic,
                  torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
                  torch.backends.cuda.is_built(), torch.get_float32_matmul_precision()],
        "torch.version.cuda": torch.version.cuda,
    }
    c.set_device(0)
    with c.device(0):
        out["current_device in device(0)"] = c.current_device()
    stream = c.Stream()
    default = c.current_stream()
    with c.stream(stream):
        out["current_stream in stream()"] = c.current_stream() == stream
    out["streams"] = [kind(stream), str(stream.device), kind(default), default.cuda_stream,
                      kind(c.default_stream()), c.default_stream() == default]
    start, end = c.Event(enable_timing=True), c.Event(enable_timing=True)
    start.record()
    torch.ones(256, 256, device="cuda").sum()
    end.record()
    end.synchronize()
    out["events"] = [kind(start), end.query(), kind(start.elapsed_time(end))]
    c.synchronize()

    c.reset_peak_memory_stats()
    before = c.memory_allocated()
    x = torch.empty(1 << 20, device="cuda")
    out["memory"] = {"allocated grows by": c.memory_allocated() - before,
                     "peak": c.max_memory_allocated(), "reserved": c.memory_reserved(),
                     "max reserved": c.max_memory_reserved()}
    del x
    c.empty_cache()
    free, total = c.mem_get_info()
    out["memory"].update({
        "after del and empty_cache": [c.memory_allocated(), c.memory_reserved()],
        "stats": {k: v for k, v in c.memory_stats().items() if isinstance(v, int)},
        "mem_get_info": [kind(free), total], "memory_summary": kind(c.memory_summary()),
    })

    torch.manual_seed(0)
    c.manual_seed(1)
    out["rng"] = {"initial_seed": c.initial_seed(), "state": tensor(c.get_rng_state()),
                  "states": len(c.get_rng_state_all()),
                  "randn": tensor(torch.randn(8, device="cuda")),
                  "generators": [kind(g) for g in c.default_generators]}
    t = torch.zeros(2, device="cuda")
    out["tensors"] = {
        "zeros": tensor(t), "is_cuda": t.is_cuda, "get_device": t.get_device(),
        "type()": t.type(), ".cuda() is itself": t.cuda() is t,
        ".to('cuda:0')": str(t.to("cuda:0").device),
        "cpu().cuda(non_blocking)": tensor(torch.arange(3.0).cuda(non_blocking=True)),
        "FloatTensor": caught(lambda: c.FloatTensor(2).zero_()),
        "tensor(device='cuda')": tensor(torch.tensor([1, 2], device="cuda")),
        "Module.cuda()": str(next(nn.Linear(2, 2).cuda().parameters()).device),
        "Tensor.to(other)": tensor(torch.ones(2).to(t)),
    }
    acc = getattr(torch, "accelerator", None)
    if acc is not None:  # torch >= 2.6
        out["torch.accelerator"] = {
            name: caught(getattr(acc, name))
            for name in ("is_available", "current_accelerator", "device_count",
                         "current_device_index") if hasattr(acc, name)}
        out["torch.accelerator namespace"] = namespace(acc)
    out["torch.cuda namespace"] = namespace(c)
    out["torch.backends.cudnn namespace"] = namespace(torch.backends.cudnn)
    out["torch.amp namespace"] = namespace(torch.amp)
    return out


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).cuda()


def amp() -> Dict[str, Any]:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0**16, growth_interval=2)
    x, y = torch.randn(8, 16, device="cuda"), torch.randn(8, 4, device="cuda")
    steps = []
    for step in range(6):
        with torch.autocast("cuda", dtype=torch.float16):
            out = model(x)
            inside = [str(out.dtype), torch.is_autocast_enabled()]
            loss = F.mse_loss(out.float(), y)
        if step == 2:
            loss = loss * float("inf")  # the scaler skips this step and halves its scale
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        steps.append(inside + [loss.item().hex(), scaler.get_scale()])
    a, b = torch.randn(8, 8, device="cuda"), torch.randn(8, 8, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        bf16 = a @ b
    with torch.autocast("cuda"):
        default = a @ b
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with torch.cuda.amp.autocast():
            old = a @ b
        old_scaler = torch.cuda.amp.GradScaler()
    return {"steps": steps, "scaler state": value(scaler.state_dict()),
            "parameters": digest(model), "bfloat16": tensor(bf16), "default": tensor(default),
            "torch.cuda.amp": [tensor(old), kind(old_scaler), old_scaler.get_scale()],
            "warnings": recorded_warnings(seen),
            "types": [value(torch.autocast), value(torch.amp.GradScaler)],
            "get_autocast_dtype": caught(lambda: torch.get_autocast_dtype("cuda"))}


def _describe_loaded(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _describe_loaded(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_describe_loaded(v) for v in obj]
    return value(obj)


def _archive(data: bytes) -> Dict[str, str]:
    # every record but the id torch draws for each save (torch >= 2.1), which no two runs share
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return {n: hashlib.sha256(z.read(n)).hexdigest() for n in sorted(z.namelist())
                if not n.endswith("serialization_id")}


def checkpoint() -> Dict[str, Any]:
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cuda")
    x = torch.randn(4, 16, device="cuda")
    model(x).square().mean().backward()
    opt.step()
    state = {"model": model.state_dict(), "opt": opt.state_dict(), "scaler": scaler.state_dict(),
             "tensor": torch.arange(4.0, device="cuda"), "rng": torch.cuda.get_rng_state()}
    out: Dict[str, Any] = {}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        buf = io.BytesIO()
        torch.save(state, buf)
        out["archive"] = _archive(buf.getvalue())
        for name, kw in (("default", {}), ("cpu", {"map_location": "cpu"}),
                         ("cuda:0", {"map_location": "cuda:0"}),
                         ("weights_only", {"weights_only": True}),
                         ("callable", {"map_location": lambda s, loc: s, "weights_only": False})):
            buf.seek(0)
            out["load " + name] = caught(lambda kw=kw: _describe_loaded(torch.load(buf, **kw)))
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "ckpt.pt")
            torch.save(state, path)
            loaded = torch.load(path)
        fresh = _model()
        opt2 = torch.optim.Adam(fresh.parameters(), lr=1e-2)
        out["load_state_dict"] = repr(fresh.load_state_dict(loaded["model"]))
        opt2.load_state_dict(loaded["opt"])
        fresh(x).square().mean().backward()
        opt2.step()
        out["resumed step"] = digest(fresh)
    out["warnings"] = recorded_warnings(seen)
    return out


def dataloader() -> Dict[str, Any]:
    from torch.utils.data import DataLoader, TensorDataset

    ds = TensorDataset(torch.arange(64.0).view(32, 2), torch.arange(32))
    out: Dict[str, Any] = {}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for workers in (0, 2):
            loader = DataLoader(ds, batch_size=8, shuffle=True, pin_memory=True,
                                num_workers=workers, generator=torch.Generator().manual_seed(0))
            out[f"workers={workers}"] = [
                [xb.is_pinned(), yb.is_pinned(), tensor(xb), tensor(yb),
                 str(xb.cuda(non_blocking=True).device)] for xb, yb in loader]
            out[f"workers={workers} attributes"] = [
                loader.pin_memory, getattr(loader, "pin_memory_device", "<absent>")]
        out["pin_memory_device='cuda'"] = caught(lambda: [
            [xb.is_pinned(), tensor(xb)] for xb, _ in DataLoader(
                ds, batch_size=16, pin_memory=True, pin_memory_device="cuda")])
    out["warnings"] = recorded_warnings(seen)
    out["Tensor.pin_memory"] = caught(lambda: torch.randn(4).pin_memory().is_pinned())
    out["empty(pin_memory=True)"] = caught(lambda: torch.empty(4, pin_memory=True).is_pinned())
    out["is_pinned of a cuda tensor"] = caught(lambda: torch.ones(1, device="cuda").is_pinned())
    return out


def errors() -> Dict[str, Any]:
    n = torch.cuda.device_count()
    big = 1 << 50  # bytes no GPU has

    def oom() -> Any:
        try:
            torch.empty(big, dtype=torch.uint8, device="cuda")
        except Exception as err:  # noqa: BLE001 - the error is the answer being compared
            # the message goes on with the free memory of the moment
            return [kind(err), str(err).split(". GPU")[0], isinstance(err, RuntimeError),
                    isinstance(err, torch.cuda.OutOfMemoryError)]
        return "no error"

    return {
        "set_device(n)": caught(lambda: torch.cuda.set_device(n)),
        "get_device_name(n)": caught(lambda: torch.cuda.get_device_name(n)),
        "get_device_properties(n)": caught(lambda: torch.cuda.get_device_properties(n)),
        "zeros(device=cuda:n)": caught(lambda: torch.zeros(1, device=f"cuda:{n}")),
        "cuda + cpu": caught(lambda: torch.ones(2, device="cuda") + torch.ones(2)),
        "matmul shapes": caught(lambda: torch.ones(2, 3, device="cuda") @ torch.ones(2, 3,
                                                                              device="cuda")),
        "memory_allocated('cpu')": caught(lambda: torch.cuda.memory_allocated("cpu")),
        "pin_memory of a cuda tensor": caught(lambda: torch.ones(2, device="cuda").pin_memory()),
        "out of memory": oom(),
        "after the errors": tensor(torch.ones(3, device="cuda") * 2),
    }


class FrameCounter:
    """``sys.setprofile`` (and ``threading.setprofile``: the pin-memory thread) counting the
    Python calls whose code lies in the dmlshim package, as tests/test_hotpath.py does."""

    def __init__(self) -> None:
        mod = sys.modules.get("dmlshim")
        files = getattr(mod, "__file__", None)
        # not loaded (a native run): no dmlshim code can run, and none is counted
        self.prefix = os.path.dirname(os.path.abspath(files)) + os.sep if files else None
        self.calls: Counter = Counter()

    def _profile(self, frame: Any, event: str, arg: Any) -> None:  # noqa: ARG002
        if event == "call" and self.prefix and frame.f_code.co_filename.startswith(self.prefix):
            self.calls[f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}"] += 1

    def __enter__(self) -> FrameCounter:
        threading.setprofile(self._profile)
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


def frames() -> Dict[str, Any]:
    from torch.utils.data import DataLoader, TensorDataset

    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3)
    scaler = torch.amp.GradScaler("cuda")
    ds = TensorDataset(torch.randn(64, 16), torch.randn(64, 4))

    def epoch() -> None:
        # a CUDA script's loop: pinned batches moved with .cuda()/.to("cuda"), a factory on
        # "cuda", autocast, the scaler, the scheduler, and the queries such loops print
        for xb, yb in DataLoader(ds, batch_size=16, pin_memory=True):
            x, y = xb.cuda(non_blocking=True), yb.to("cuda", non_blocking=True)
            x = x + torch.zeros(1, device="cuda")
            with torch.autocast("cuda", dtype=torch.float16):
                loss = F.mse_loss(model(x).float(), y)
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            sched.step()
            torch.cuda.is_available()
            torch.cuda.memory_allocated()
            torch.cuda.synchronize()

    for _ in range(WARMUP // 4):  # 4 steps an epoch
        epoch()
    with FrameCounter() as counter:
        for _ in range(STEPS):
            epoch()
    steps = STEPS * 4
    return {"dmlshim frames per step": sum(counter.calls.values()) / steps,
            "dmlshim functions": dict(counter.calls), "parameters": digest(model)}


def compile_() -> Dict[str, Any]:
    import torch._dynamo
    from torch._dynamo.utils import counters

    out: Dict[str, Any] = {}
    for backend in ("aot_eager", "inductor"):
        def run(backend: str = backend) -> Any:
            torch._dynamo.reset()
            counters.clear()
            model = _model()
            compiled = torch.compile(model, backend=backend)
            x = torch.randn(8, 16, device="cuda")
            y = compiled(x)
            y.square().mean().backward()
            again = compiled(torch.randn(8, 16, device="cuda"))
            return {"out": tensor(y), "again": tensor(again),
                    "grads": [tensor(p.grad) for p in model.parameters()],
                    "stats": dict(counters["stats"]),
                    "graph breaks": dict(counters["graph_break"])}

        out[backend] = caught(run)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ddp() -> Dict[str, Any]:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    if "RANK" in os.environ:  # torchrun
        dist.init_process_group("nccl")
    else:
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0,
                                world_size=1)
    torch.cuda.set_device(0)
    model = DistributedDataParallel(_model(), device_ids=[0])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 16, device="cuda"), torch.randn(8, 4, device="cuda")
    losses = []
    for _ in range(3):
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item().hex())
    t = torch.arange(4.0, device="cuda")
    dist.all_reduce(t)
    gathered = [torch.empty(4, device="cuda")]
    dist.all_gather(gathered, t)
    dist.broadcast(t, 0)
    out = {"backend": dist.get_backend(), "world": [dist.get_rank(), dist.get_world_size()],
           "nccl available": dist.is_nccl_available(),
           "nccl version": value(torch.cuda.nccl.version()),
           "losses": losses, "parameters": digest(model.module),
           "all_reduce": tensor(t), "all_gather": [tensor(g) for g in gathered],
           "ddp type": kind(model), "process group": kind(dist.group.WORLD)}
    dist.barrier()
    dist.destroy_process_group()
    return out


# -- import dmlshim, then uninstall -----------------------------------------------------------

def _owners() -> Dict[str, Any]:
    import torch.distributed
    import torch.optim.lr_scheduler
    import torch.serialization
    import torch.utils.data

    out = {"torch": torch, "torch.cuda": torch.cuda, "torch.cuda.amp": torch.cuda.amp,
           "torch.nn": nn, "torch.nn.functional": F, "torch.optim": torch.optim,
           "torch.Tensor": torch.Tensor, "torch.nn.Module": nn.Module, "torch.amp": torch.amp,
           "torch.amp.GradScaler": torch.amp.GradScaler, "torch.autograd": torch.autograd,
           "torch.backends.cudnn": torch.backends.cudnn, "torch.backends.cuda": torch.backends.cuda,
           "torch.distributed": torch.distributed, "torch.serialization": torch.serialization,
           "torch.utils.data": torch.utils.data,
           "torch.utils.data.DataLoader": torch.utils.data.DataLoader,
           "torch.optim.Optimizer": torch.optim.Optimizer,
           "torch.optim.lr_scheduler": torch.optim.lr_scheduler}
    if hasattr(torch, "accelerator"):
        out["torch.accelerator"] = torch.accelerator
    for mod in (nn, torch.optim, torch.optim.lr_scheduler, torch.cuda):
        for obj in vars(mod).values():
            if isinstance(obj, type) and obj.__module__.startswith("torch"):
                out.setdefault(f"{obj.__module__}.{obj.__qualname__}", obj)
    return out


def _state() -> Dict[str, Any]:
    """The process-wide state a patch could leave changed, beside the attributes of torch."""
    from torch.nn.modules import module as nn_module
    from torch.optim import optimizer

    return {
        "default dtype": str(torch.get_default_dtype()),
        "default device": caught(lambda: torch.get_default_device()),
        "grad enabled": torch.is_grad_enabled(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "float32 matmul precision": torch.get_float32_matmul_precision(),
        "anomaly mode": torch.is_anomaly_enabled(),
        "cuda initialized": torch.cuda.is_initialized(),
        "cpu rng": tensor(torch.get_rng_state())["sha256"],
        "torch function modes": torch._C._len_torch_function_stack(),
        "dispatch modes": torch._C._len_torch_dispatch_stack(),
        "optimizer global hooks": [len(optimizer._global_optimizer_pre_hooks),
                                   len(optimizer._global_optimizer_post_hooks)],
        "module global hooks": [len(getattr(nn_module, n)) for n in sorted(vars(nn_module))
                                if n.startswith("_global_") and n.endswith("hooks")],
        "sys.meta_path": [kind(f) for f in sys.meta_path],
        "sys.path_hooks": [repr(h) for h in sys.path_hooks],
        "sys.excepthook": repr(sys.excepthook), "threading.excepthook": repr(threading.excepthook),
        "warnings.showwarning": repr(warnings.showwarning),
        "warnings.filters": repr(warnings.filters),
        "os.environ": dict(os.environ),
        "sys.path": list(sys.path),
    }


def uninstall() -> Dict[str, Any]:
    """``import dmlshim`` in a script that has imported torch, then ``dmlshim.uninstall()``:
    what differs from before the import, while imported and after (attributes by identity)."""
    owners = _owners()
    before = {k: dict(vars(o)) for k, o in owners.items()}
    state = _state()

    def changed() -> Dict[str, Any]:
        diff: Dict[str, Any] = {}
        for key, owner in owners.items():
            now = vars(owner)
            for name in sorted(set(before[key]) | set(now)):
                old, new = before[key].get(name, "<absent>"), now.get(name, "<absent>")
                if old is new:
                    continue
                if isinstance(old, str) and old == "<absent>" and isinstance(new, types.ModuleType):
                    continue  # a submodule imported on the way: not a change of torch's
                diff[f"{key}.{name}"] = [repr(old)[:200], repr(new)[:200]]
        now_state = _state()
        diff.update({k: [state[k], now_state[k]] for k in state if state[k] != now_state[k]})
        return diff

    import dmlshim

    while_imported = changed()
    target = dmlshim.current_target()
    dmlshim.uninstall()
    return {"target": None if target is None else [target.kind, target.inert],
            "changed while imported": while_imported, "changed after uninstall": changed()}


SECTIONS: Dict[str, Callable[[], Dict[str, Any]]] = {
    "api": api, "amp": amp, "checkpoint": checkpoint, "dataloader": dataloader,
    "errors": errors, "frames": frames, "compile": compile_, "ddp": ddp, "uninstall": uninstall}


def shim() -> Dict[str, Any]:
    """What dmlshim is in this process (None of it in a native run)."""
    mod = sys.modules.get("dmlshim")
    if mod is None:
        return {"loaded": False}
    target = mod.current_target()
    with FrameCounter() as control:  # proves the counter sees dmlshim's frames when they run
        mod.current_target()
    from dmlshim import api as shim_api

    return {"loaded": True, "installed": mod.is_installed(),
            "target": None if target is None else {"kind": target.kind, "inert": target.inert,
                                                   "reason": target.reason},
            "patches": shim_api.installed_patches(),
            "control frames": sum(control.calls.values())}


def main() -> None:
    names = sys.argv[1].split(",")
    for name in names:
        print(f"SECTION {name} {json.dumps(SECTIONS[name](), sort_keys=True)}", flush=True)
    print(f"SHIM {json.dumps(shim(), sort_keys=True)}", flush=True)


if __name__ == "__main__":
    main()
