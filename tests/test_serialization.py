"""Checkpoints both ways: CUDA checkpoints load onto the target in every map_location form, and
checkpoints written under the shim load in a plain Python (no dmlshim, no torch_directml).

"CUDA checkpoints" here are real CUDA-tagged files: CPU tensors saved while an extra
location tagger (the hook torch.serialization gives device packages) tags them ``cuda:N``,
exactly the bytes a CUDA machine writes (the tag is a string in data.pkl; the data is the
host copy torch writes for every device).
"""

from __future__ import annotations

import io
import os
import pickle
import re
import subprocess
import sys
import traceback
import warnings
import zipfile

import pytest
import torch
import torch.serialization as ser
from helpers import clean_env, describe, losses, run_native, run_shim

import dmlshim
from dmlshim import patching

TEST_TAGGER_PRIORITY = 1


def save_as_if_on_cuda(obj, f, index=0, keep_on_cpu=()):
    """torch.save ``obj`` with every CPU storage tagged ``cuda:<index>`` (as a CUDA machine
    writes it), except the storages of the tensors in ``keep_on_cpu`` (e.g. Adam's ``step``)."""
    cpu_ptrs = {t.untyped_storage().data_ptr() for t in keep_on_cpu}

    def tagger(storage):
        if storage.device.type == "cpu" and storage.data_ptr() not in cpu_ptrs:
            return f"cuda:{index}"
        return None

    entry = (TEST_TAGGER_PRIORITY, tagger, lambda storage, location: None)
    ser._package_registry.insert(0, entry)
    try:
        torch.save(obj, f)
    finally:
        ser._package_registry.remove(entry)


def tags_in(data: bytes):
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        pkl = next(n for n in z.namelist() if n.endswith("data.pkl"))
        raw = z.read(pkl)
    return {tag for tag in (b"cuda:0", b"cuda:1", b"cpu", b"privateuseone") if tag in raw}


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)
        self.bn = torch.nn.BatchNorm1d(3)

    def forward(self, x):
        return self.bn(self.fc(x))


def cuda_checkpoint(index=0):
    """(bytes of a CUDA-tagged training checkpoint, the tensors it holds as CPU copies)."""
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(8, 4)).sum().backward()
    opt.step()
    steps = [s["step"] for s in opt.state.values()]  # CPU tensors on CUDA machines too
    ckpt = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "scaler": {"scale": 32768.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                   "growth_interval": 2000, "_growth_tracker": 17},
        "nested": [torch.arange(3), (torch.ones(2), {"deep": torch.eye(2)})],
        "epoch": 3,
    }
    buf = io.BytesIO()
    save_as_if_on_cuda(ckpt, buf, index=index, keep_on_cpu=steps)
    return buf.getvalue(), ckpt


def tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from tensors(v)


def test_the_fixture_is_a_real_cuda_checkpoint():
    data, _ = cuda_checkpoint()
    assert tags_in(data) == {b"cuda:0", b"cpu"}  # params on CUDA, Adam steps on the CPU
    with pytest.raises(RuntimeError, match="CUDA"):
        torch.load(io.BytesIO(data))  # what a CPU-only torch does with it


FORMS = {
    "none": None,
    "str": "cuda",
    "str_index": "cuda:0",
    "device": torch.device("cuda", 0),
    "device_noindex": torch.device("cuda"),
    "dict": {"cuda:0": "cuda:0"},
    "dict_other_ordinal": {"cuda:0": "cuda:1"},
    "callable_cuda": lambda storage, loc: storage.cuda(0),
    "callable_cuda_default": lambda storage, loc: storage.cuda(),
    "callable_none": lambda storage, loc: None,
}
# (form, where CUDA puts the parameters: "target" or "cpu")
EMULATOR_FORMS = ["none", "str", "str_index", "device", "dict", "callable_cuda", "callable_none"]


@pytest.mark.parametrize("form", list(FORMS))
def test_cpu_target_loads_cuda_checkpoint_in_every_form(shim, form):
    data, saved = cuda_checkpoint()
    shim(device="cpu")
    ckpt = torch.load(io.BytesIO(data), map_location=FORMS[form])
    got, want = list(tensors(ckpt)), list(tensors(saved))
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.device.type == "cpu" and a.dtype == b.dtype and torch.equal(a, b)
    model = Tiny()
    model.load_state_dict(ckpt["model"])
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    opt.load_state_dict(ckpt["optimizer"])
    scaler = torch.cuda.amp.GradScaler()
    scaler.load_state_dict(ckpt["scaler"])
    assert scaler.state_dict()["_growth_tracker"] == 17


def test_whole_pickled_module_from_cuda(shim):
    torch.manual_seed(0)
    model = Tiny()
    buf = io.BytesIO()
    save_as_if_on_cuda(model, buf)
    shim(device="cpu")
    loaded = torch.load(io.BytesIO(buf.getvalue()), weights_only=False)
    assert isinstance(loaded, Tiny) and isinstance(loaded.fc.weight, torch.nn.Parameter)
    assert torch.equal(loaded.fc.weight, model.fc.weight)


def test_weights_only_default_is_torchs(shim):
    class NotAllowed:
        pass

    globals()["NotAllowed"] = NotAllowed  # picklable by reference
    NotAllowed.__qualname__ = "NotAllowed"
    buf = io.BytesIO()
    save_as_if_on_cuda({"obj": NotAllowed(), "w": torch.ones(2)}, buf)
    data = buf.getvalue()
    try:  # what the installed torch does by default (2.6+: safe unpickler; 2.4: full pickle)
        torch.load(io.BytesIO(data), map_location="cpu")
        native_error = None
    except pickle.UnpicklingError as err:
        native_error = err
    shim(device="cpu")
    if native_error is not None:
        with pytest.raises(pickle.UnpicklingError) as shimmed:
            torch.load(io.BytesIO(data))  # no weights_only: torch's default (True) must hold
        assert "weights_only" in str(shimmed.value) and type(shimmed.value) is type(native_error)
    else:
        assert isinstance(torch.load(io.BytesIO(data))["obj"], NotAllowed)
    ok = torch.load(io.BytesIO(data), weights_only=False)
    assert isinstance(ok["obj"], NotAllowed) and ok["w"].device.type == "cpu"


def test_checkpoint_saved_on_cpu_target_is_plain(shim, tmp_path):
    shim(device="cpu")
    path = tmp_path / "ckpt.pt"
    torch.save({"w": torch.ones(3, device="cuda")}, path)
    assert tags_in(path.read_bytes()) == {b"cpu"}


def test_uninstall_restores_load_save_and_registry():
    registry = list(ser._package_registry)
    before = {(o, n): getattr(o, n) for o, n in [
        (torch, "load"), (ser, "load"), (torch, "save"), (ser, "save"),
        (torch.storage._StorageBase, "cuda")]}
    for device in ("cpu", "emulated-dml"):
        dmlshim.install(device=device)
        try:
            assert len(ser._package_registry) == len(registry) + 1
            assert torch.load is not before[(torch, "load")]
            if device == "emulated-dml":
                assert torch.save is not before[(torch, "save")]
        finally:
            dmlshim.uninstall()
        assert ser._package_registry == registry
        assert all(ser._package_registry[i] is registry[i] for i in range(len(registry)))
        for (owner, name), original in before.items():
            assert getattr(owner, name) is original
            assert not patching.is_patched(owner, name)


# -- emulated DirectML -----------------------------------------------------------------------

@pytest.mark.emulator
@pytest.mark.parametrize("form", EMULATOR_FORMS)
def test_emulator_loads_cuda_checkpoint_onto_the_device(shim, form):
    data, saved = cuda_checkpoint()
    shim(device="emulated-dml")
    ckpt = torch.load(io.BytesIO(data), map_location=FORMS[form])
    params = list(tensors(ckpt["model"]))
    assert all(t.device == torch.device("privateuseone", 0) for t in params)
    assert ckpt["optimizer"]["state"][0]["exp_avg"].device.type == "privateuseone"
    step_dev = ckpt["optimizer"]["state"][0]["step"].device.type
    # CPU-tagged storages stay on the CPU unless a string/device map_location moves everything.
    moves_all = form in ("str", "str_index", "device", "callable_cuda")
    assert step_dev == ("privateuseone" if moves_all else "cpu")
    for a, b in zip(tensors(ckpt), tensors(saved)):
        assert torch.equal(a.cpu(), b)
    model = Tiny().cuda()
    model.load_state_dict(ckpt["model"])
    assert model.fc.weight.device.type == "privateuseone"


@pytest.mark.emulator
def test_emulator_whole_module_and_bad_ordinal(shim):
    torch.manual_seed(0)
    model = Tiny()
    buf = io.BytesIO()
    save_as_if_on_cuda(model, buf)
    shim(device="emulated-dml")
    loaded = torch.load(io.BytesIO(buf.getvalue()), weights_only=False)
    assert loaded.fc.weight.device.type == "privateuseone"
    assert isinstance(loaded.fc.weight, torch.nn.Parameter) and loaded.fc.weight.requires_grad
    assert torch.equal(loaded.fc.weight.cpu(), model.fc.weight)
    with pytest.raises(RuntimeError, match="cuda:3"):
        torch.load(io.BytesIO(buf.getvalue()), map_location="cuda:3", weights_only=False)


CLEAN_LOAD = r"""
import sys, torch
def flat(o):
    if isinstance(o, torch.Tensor): yield o
    elif isinstance(o, dict):
        for v in o.values(): yield from flat(v)
    elif isinstance(o, (list, tuple)):
        for v in o: yield from flat(v)
for path in sys.argv[1:]:
    ckpt = torch.load(path, weights_only=True)
    ts = list(flat(ckpt))
    assert ts and all(t.device.type == "cpu" for t in ts), [t.device for t in ts]
    print("tensors", len(ts), float(sum(t.double().sum() for t in ts)).hex(),
          type(ckpt["param"]).__name__, ckpt["param"].requires_grad)
assert "dmlshim" not in sys.modules and "torch_directml" not in sys.modules
"""


@pytest.mark.emulator
def test_emulator_checkpoint_loads_in_plain_python(shim, tmp_path):
    shim(device="emulated-dml")
    torch.manual_seed(0)
    model = Tiny().cuda()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    # no backward here: the autograd engine of a process that already ran a CPU backward has
    # no queue for devices registered later (the emulator); the subprocess tests cover training
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.5)
    opt.step()
    base = torch.arange(6.0, device="cuda")
    ckpt = {"model": model.state_dict(), "optimizer": opt.state_dict(),
            "views": [base, base[2:]], "param": torch.nn.Parameter(torch.ones(2, device="cuda"))}
    expected = sum(float(t.detach().cpu().double().sum()) for t in tensors(ckpt))
    path = tmp_path / "emu.pt"
    torch.save(ckpt, path)
    torch.save(ckpt, str(tmp_path / "emu_kw.pt"), pickle_module=pickle)
    dmlshim.uninstall()
    assert b"privateuseone" not in tags_in(path.read_bytes())
    proc = subprocess.run([sys.executable, "-c", CLEAN_LOAD, str(path), str(tmp_path / "emu_kw.pt")],
                          capture_output=True, text=True, env=clean_env(PYTHONPATH=None),
                          timeout=120, cwd=str(tmp_path))
    assert proc.returncode == 0, describe(proc)
    lines = proc.stdout.splitlines()
    assert len(lines) == 2, describe(proc)
    for line in lines:
        _, n, total, param_type, requires_grad = line.split()
        assert int(n) == len(list(tensors(ckpt)))
        assert float.fromhex(total) == expected
        assert (param_type, requires_grad) == ("Parameter", "True")


# -- the corpus script, through the runner ---------------------------------------------------

@pytest.fixture(scope="module")
def native_roundtrip(tmp_path_factory):
    """The native CPU run of the corpus script, which also leaves its checkpoint file."""
    path = tmp_path_factory.mktemp("native") / "checkpoint.pt"
    proc = run_native("checkpoint_roundtrip.py", "--save", str(path))
    assert proc.returncode == 0, describe(proc)
    return proc, path


def corpus_lines(stdout, prefix):
    return [line for line in stdout.splitlines() if line.startswith(prefix + " ")]


@pytest.mark.parametrize("device", ["cpu", pytest.param("emulated-dml", marks=pytest.mark.emulator)])
def test_corpus_roundtrip_every_form(device, native_roundtrip):
    native, _ = native_roundtrip
    proc = run_shim("checkpoint_roundtrip.py", device=device)
    assert proc.returncode == 0, describe(proc)
    assert "CUDA is not available" not in proc.stderr, describe(proc)
    assert losses(proc.stdout) == losses(native.stdout), describe(proc)
    same = corpus_lines(proc.stdout, "same")
    assert len(same) == 7 and all(line.endswith(" ok") for line in same), describe(proc)
    # every form resumes training identically, and as the native CPU run does
    resumed = corpus_lines(proc.stdout, "resume")
    assert len(resumed) == 21 and resumed == corpus_lines(native.stdout, "resume"), describe(proc)
    if device == "emulated-dml":
        where = {tuple(line.split()[1:3]): line.split()[3] for line in corpus_lines(proc.stdout, "where")}
        # written under the shim: CPU tags; forms naming the device move everything there
        assert where[("none", "model")] == "cpu" and where[("dict", "model")] == "cpu"
        for form in ("str", "str_index", "device", "callable"):
            assert where[(form, "model")] == "gpu" and where[(form, "optimizer")] == "gpu"
        assert where[("whole", "model")] == "gpu"


@pytest.mark.emulator
def test_corpus_resumes_from_a_cuda_checkpoint(tmp_path, native_roundtrip):
    # The native run wrote the checkpoint; rewritten with CUDA tags, as a CUDA machine writes.
    native, cpu_file = native_roundtrip
    ckpt = torch.load(cpu_file)
    ckpt["scaler"] = {"scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                      "growth_interval": 2000, "_growth_tracker": 6}  # an enabled CUDA scaler
    steps = [s["step"] for s in ckpt["optimizer"]["state"].values()]
    cuda_file = tmp_path / "cuda.pt"
    host_made = [ckpt["rng"], ckpt["extra"]["list"][1][1]["deep"]]  # CPU tensors there too
    save_as_if_on_cuda(ckpt, cuda_file, keep_on_cpu=steps + host_made)
    assert b"cuda:0" in tags_in(cuda_file.read_bytes())
    proc = run_shim("checkpoint_roundtrip.py", "--from", str(cuda_file), device="emulated-dml")
    assert proc.returncode == 0, describe(proc)
    where = {tuple(line.split()[1:3]): line.split()[3] for line in corpus_lines(proc.stdout, "where")}
    for form in ("none", "str", "str_index", "device", "dict", "callable"):
        assert where[(form, "model")] == "gpu", describe(proc)
    assert where[("cpu", "model")] == "cpu"
    resumed = corpus_lines(proc.stdout, "resume")
    native_resumed = corpus_lines(native.stdout, "resume")
    assert len(resumed) == 21 and resumed == native_resumed, describe(proc)



# -- torch's warnings at the user's line -------------------------------------------------------

def test_a_wrapped_apis_stacklevel_2_warning_names_the_callers_line():
    # torch 2.4's torch.load warns about weights_only with stacklevel=2: its caller's line. A
    # dmlshim wrapper between them would take that place; call_at_callers_line gives it back
    def api():
        warnings.warn("from the api", FutureWarning, stacklevel=2)
        return 7

    wrappers = {}
    for name, body in (("through", "return call_at_callers_line(api, args, kwargs)"),
                       ("direct", "return api(*args, **kwargs)")):
        namespace = {"__name__": "dmlshim._a_wrapper", "api": api,
                     "call_at_callers_line": patching.call_at_callers_line}
        exec(f"def wrapper(*args, **kwargs):\n    {body}\n", namespace)  # noqa: S102
        wrappers[name] = namespace["wrapper"]
    sites = {}
    for name, wrapper in wrappers.items():
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            line = sys._getframe().f_lineno + 1
            assert wrapper() == 7
        sites[name] = [(w.filename, w.lineno, str(w.message)) for w in seen]
    assert sites["through"] == [(__file__, line, "from the api")]
    assert sites["direct"] == [("<string>", 2, "from the api")]  # what the helper fixes


def test_a_traceback_through_call_at_callers_line_names_the_callers_line_once():
    # the frame that stands at the caller's line for warnings must not print as a second copy
    # of the caller in a traceback; the wrapped API's own frames stay
    def api():
        raise ValueError("from the api")

    namespace = {"__name__": "dmlshim._a_wrapper", "api": api,
                 "call_at_callers_line": patching.call_at_callers_line}
    exec("def wrapper():\n    return call_at_callers_line(api, (), {})\n", namespace)  # noqa: S102
    with pytest.raises(ValueError) as caught:
        line = sys._getframe().f_lineno + 1
        namespace["wrapper"]()
    here = sys._getframe().f_code.co_name
    frames = [(f.filename, f.lineno, f.name) for f in traceback.extract_tb(caught.value.__traceback__)]
    assert frames == [(__file__, line, here), ("<string>", 2, "wrapper"),
                      (patching.__file__, frames[2][1], "call_at_callers_line"),
                      (__file__, api.__code__.co_firstlineno + 1, "api")], frames


LOADING_SCRIPT = """\
import os, tempfile, torch
path = os.path.join(tempfile.mkdtemp(), "ckpt.pt")
torch.save({"w": torch.ones(3)}, path)
state = torch.load(path)
print("loaded", state["w"].sum().item())
"""
LOADING_LINE = 4  # the torch.load line above

# The warning torch.load gives its caller (stacklevel=2) without weights_only, by torch version:
# 2.4 and 2.5 warn that weights_only=False is the default (a FutureWarning on every load);
# from 2.6 on the default is True and plain loads are silent, but TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD
# (set for these runs; the older versions ignore it) makes it warn that it forced False.
_OLD_DEFAULT = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) < (2, 6)
LOAD_WARNING = ("FutureWarning", "weights_only=False") if _OLD_DEFAULT else \
    ("UserWarning", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")


@pytest.mark.parametrize("device", ["cpu", "emulated-dml"])
def test_torch_load_warns_at_the_users_line_as_without_the_shim(device, tmp_path):
    script = tmp_path / "load_it.py"
    script.write_text(LOADING_SCRIPT, encoding="utf-8")
    env = {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
    native = run_native(script, env=env, cached=False)
    shimmed = run_shim(script, device=device, env=env)
    assert native.returncode == shimmed.returncode == 0, describe(shimmed)
    assert shimmed.stdout == native.stdout == "loaded 3.0\n", describe(shimmed)
    category, words = LOAD_WARNING
    sites = _warning_sites(native.stderr)
    assert len(sites) == 1, describe(native)  # torch warned, once, at the user's line
    assert sites[0].startswith(f"{script}:{LOADING_LINE}: {category}: ") and words in sites[0], \
        describe(native)
    assert _warning_sites(shimmed.stderr) == sites, describe(shimmed)


def _warning_sites(stderr: str):
    """The ``file:line: Category: message`` lines of Python's warnings (the emulator's build
    prints a line of its own)."""
    return [line for line in stderr.splitlines() if re.match(r"\S.*:\d+: \w*Warning: ", line)]


# -- the user's frames in a traceback through a wrapped API -----------------------------------

RAISING_SCRIPT = """\
import sys, torch


def resume(path):
    return torch.load(path, map_location="cuda")


resume(sys.argv[1])
"""


def _frames_outside(stderr: str, *packages: str):
    """The traceback's ``File "...", line N, in NAME`` entries (with the source line printed
    under each) that lie outside ``packages``' folders: the script's own."""
    folders = tuple(os.path.dirname(os.path.abspath(p.__file__)) + os.sep for p in packages)
    lines = stderr.splitlines()
    frames = []
    for i, line in enumerate(lines):
        m = re.match(r'  File "(.*)", line (\d+), in (.*)$', line)
        if m and not os.path.abspath(m.group(1)).startswith(folders):
            frames.append((m.group(1), int(m.group(2)), m.group(3), lines[i + 1].strip()))
    return frames


@pytest.mark.parametrize("checkpoint, device", [("missing", "cpu"), ("corrupt", "emulated-dml")])
def test_an_error_inside_torch_load_shows_the_users_frames_as_without_the_shim(
        checkpoint, device, tmp_path):
    # call_at_callers_line calls torch.load from a frame standing at the user's line (for
    # torch's warnings); a traceback printing that frame would show the user's line twice.
    # Both paths of the wrapper: the CPU target's, and DirectML's (storages read to the host)
    script = tmp_path / "resume.py"
    script.write_text(RAISING_SCRIPT, encoding="utf-8")
    path = tmp_path / "ckpt.pt"
    if checkpoint == "corrupt":
        path.write_bytes(b"not a checkpoint")
    native = run_native(script, str(path), cached=False)
    shimmed = run_shim(script, str(path), device=device)
    assert native.returncode == shimmed.returncode == 1, describe(shimmed)
    frames = _frames_outside(native.stderr, torch, dmlshim)
    assert frames == [(str(script), 8, "<module>", "resume(sys.argv[1])"),
                      (str(script), 5, "resume",
                       'return torch.load(path, map_location="cuda")')], describe(native)
    assert _frames_outside(shimmed.stderr, torch, dmlshim) == frames, describe(shimmed)
    error = _error_text(native.stderr)
    assert error.startswith(("FileNotFoundError: ", "_pickle.UnpicklingError: ")), describe(native)
    assert _error_text(shimmed.stderr) == error, describe(shimmed)


def _error_text(stderr: str) -> str:
    """The exception's own lines, after its traceback (torch's can be several)."""
    lines = stderr.splitlines()
    first = lines.index("Traceback (most recent call last):") + 1
    while lines[first].startswith(" "):
        first += 1
    return "\n".join(lines[first:]).rstrip()
