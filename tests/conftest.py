"""Test-process setup: `import dmlshim` must not patch the pytest process itself.

Unit tests call dmlshim.install()/uninstall() explicitly (see the `shim` fixture); scripts run
through the runner in subprocesses get a clean environment from tests/helpers.py.

Tiers: a plain `pytest` runs the fast tier (every area, a few minutes); `--tier rest` runs the
tests marked ``slow`` (framework matrices, model zoos, long subprocess runs), `--tier all`
both. .ci/run runs the fast tier, then the rest, on each lane.

``--windows-python PATH``: the Windows lane (.ci/windows-lane): only tests/windows/ runs, on that
Windows python.exe under wine; without it tests/windows/ is not collected.

Ctrl-C: a suite started with SIGINT ignored (in the background of a script, nohup) gives it back,
so the Ctrl-C tests interrupt their children as a terminal would (helpers.restore_ctrl_c).

CUDA: hidden from the pytest process and every process a test starts (``CUDA_VISIBLE_DEVICES=""``
from here on, before torch initialises CUDA; tests/helpers.py says why). The tests marked
``cuda`` (tests/cuda/: dmlshim is inert on a real NVIDIA GPU) give their children the GPUs back;
they run where torch sees a CUDA device and are deselected, with one line saying why, where it
sees none. ``-m cuda`` asks for them: there, without CUDA, pytest stops with a usage error
instead of passing on no test (docs/testing-on-cuda.md).
"""

import os

os.environ["DMLSHIM_DISABLE"] = "1"

import sys  # noqa: E402

import helpers  # noqa: E402  (no torch: nothing has initialised CUDA yet)
import pytest  # noqa: E402

helpers.hide_cuda()
helpers.restore_ctrl_c()

TIERS = ("fast", "rest", "all")


def pytest_addoption(parser):
    parser.addoption("--tier", choices=TIERS, default="fast",
                     help="fast (default): every area in minutes; rest: the tests marked slow; "
                          "all: both")
    parser.addoption("--real-d3d12", metavar="PATH", default=None,
                     help="the real-wheel lane: run only the tests marked real_d3d12, on the "
                          "real torch-directml wheel installed here over the real D3D12 library "
                          "PATH (vkd3d-proton's libvkd3d-proton-d3d12.so) in the WSL harness")
    parser.addoption("--windows-python", metavar="PATH", default=None,
                     help="run tests/windows/ (only) on this Windows python.exe under wine "
                          "(.ci/windows-lane sets it up)")
    parser.addoption("--windows-d3d12", action="store_true",
                     help="with --windows-python: that python's folder holds a real D3D12 "
                          "library (d3d12.dll, d3d12core.dll), which every Windows process "
                          "loads; tests/windows/test_windows_d3d12.py and the real-wheel suite "
                          "(the tests marked real_d3d12 and users_path) run too, on the Windows "
                          "DirectML.dll (.ci/windows-lane with DMLSHIM_WINDOWS_D3D12 sets it up)")


WINDOWS_TESTS = "tests/windows/"
WINDOWS_D3D12_TESTS = "test_windows_d3d12.py"
# the real-wheel suite (markers real_d3d12 and users_path): the Windows lane runs it too where it
# has a real D3D12 library (these files import no torch: the lane's host has pytest only)
REAL_SUITE = ("tests/test_real_wheel.py", "tests/test_users_path_zoo.py",
              "tests/frameworks/test_fw_users_path.py")


def pytest_ignore_collect(collection_path, config):
    # tests/windows/ runs in the Windows lane only, and only it: the host of that lane has
    # pytest and no torch
    inside = WINDOWS_TESTS.rstrip("/") in collection_path.as_posix()
    windows = config.getoption("--windows-python") is not None
    if collection_path.is_dir() and not inside:
        return None
    if collection_path.name == WINDOWS_D3D12_TESTS and not config.getoption("--windows-d3d12"):
        return True  # the real D3D12 library's tests need its python folder
    if windows and config.getoption("--windows-d3d12") \
            and collection_path.as_posix().endswith(REAL_SUITE):
        return None
    return (not inside) if windows else (inside or None)


# The rest tier besides tests marked slow where they are written: the longest tests of the
# suite (measured with --durations): a function name (all its parameters) or one node id with
# its parameters; each area keeps shorter tests (or another parameter) in the fast tier.
SLOW_TESTS = frozenset((
    "tests/test_corpus.py::test_shim_bit_identical",
    "tests/frameworks/test_fw_timm.py::test_timm_train_and_validate",
    "tests/frameworks/test_fw_transformers.py::test_auto_find_batch_size_keeps_a_batch_that_fits",
    "tests/frameworks/test_fw_transformers.py::test_trainer_on_emulated_dml",
    "tests/frameworks/test_fw_misc.py::test_nanogpt_loop",
    "tests/test_decompose_zoo.py::test_zoo_model_trains_on_the_device_with_zero_fallbacks",
    "tests/test_distributed.py::test_shimmed_launcher_passes_the_shim_to_its_ranks",
    "tests/test_distributed.py::test_mp_spawn_ddp_on_cpu_and_two_emulated_adapters",
    "tests/test_processes.py::test_hogwild_workers_update_the_parents_shared_model",
    "tests/test_processes.py::test_dataloader_spawn_workers_train_like_native",
    "tests/test_amp.py::test_amp_train_unmodified_on_emulator",
    "tests/test_amp.py::test_half_input_into_float32_model_under_cuda_autocast",
    "tests/test_runner_and_config.py::test_emulated_dml_keeps_torchs_weights_only_allow_list",
    "tests/test_serialization.py::test_corpus_roundtrip_every_form",
    "tests/test_dml_facts.py::test_guards_give_the_cpu_result",
    "tests/test_optim_emulated.py::test_emulated_lstm_load_assign_rebind_equals_right_order",
    "tests/test_check.py::test_emulator_gaps_are_named_with_op_and_line",
    "tests/test_storage_ddp.py::test_bfloat16_on_the_device_aborts_the_process",
    "tests/frameworks/test_fw_lightning.py::test_ddp_two_devices_on_two_emulated_adapters",
    "tests/test_amp.py::test_amp_train_unmodified_on_cpu_matches_native",
    "tests/test_amp.py::test_fp16_models_train_on_the_device_with_zero_fallbacks",
    "tests/test_wsl_path.py::test_wheel_folder_on_library_path_says_so_once_and_trains_on_cpu"
    "[import]",
    "tests/test_wsl_path.py::test_dataloader_spawn_workers_on_the_users_path_train_like_native",
    "tests/test_wsl_path.py::test_auto_trains_on_the_adapter_like_native[cnn.py-runner]",
    "tests/test_wsl_path.py::test_amp_script_on_the_adapter_matches_the_emulated_target",
    "tests/test_wsl_path.py::test_lstm_trains_on_the_adapter_to_float32_precision",
    "tests/test_oom.py::test_hf_trainer_auto_find_batch_size_settles_on_a_smaller_batch",
    "tests/test_decompose.py::test_mixed_model_trains_on_the_device_like_the_cpu",
    "tests/test_decompose.py::test_corpus_trains_on_the_device_like_the_cpu[transformer]",
    "tests/test_decompose.py::test_corpus_trains_on_the_device_like_the_cpu[cnn]",
    "tests/test_processes.py::test_every_kind_of_child_carries_the_shim[cpu-args0-kinds0-cpu]",
    "tests/frameworks/test_fw_accelerate.py::test_accelerator_loop_fp16[cpu]",
    "tests/frameworks/test_fw_accelerate.py::test_accelerate_launch_two_processes[cpu]",
    "tests/frameworks/test_fw_misc.py::test_diffusers_unet_accelerate_fp16[cpu]",
    "tests/frameworks/test_fw_misc.py::test_tensorboard_add_graph[cpu]",
    "tests/test_check.py::test_the_gradient_alarm_names_what_a_native_run_leaves_unchanged"
    "[check_resnet---steps-1-cpu]",
    "tests/test_check.py::test_the_gradient_alarm_names_what_a_native_run_leaves_unchanged"
    "[check_resnet---optimizer-adam---steps-2-cpu]",
    "tests/test_check.py::test_the_gradient_alarm_names_what_a_native_run_leaves_unchanged"
    "[check_lightning---detach-cpu]",
    "tests/test_check.py::test_the_gradient_alarm_names_what_a_native_run_leaves_unchanged"
    "[check_lightning-cpu]",
    "tests/test_check.py::test_the_check_changes_nothing_on_the_strict_emulator"
    "[check_resnet-2-off]",
    "tests/test_check.py::test_the_check_changes_nothing_on_the_strict_emulator"
    "[check_resnet-2-on]",
    "tests/test_check.py::test_the_check_changes_nothing_on_the_strict_emulator"
    "[check_gpt-masked_fill_-off]",
    "tests/test_check.py::test_the_check_changes_nothing_on_the_strict_emulator"
    "[check_gpt-masked_fill-off]",
    "tests/test_check.py::test_no_false_positives_on_the_cpu[mlp-cpu]",
    "tests/test_check.py::test_no_false_positives_on_the_cpu[lstm_lm-cpu]",
    "tests/test_check.py::test_no_false_positives_on_the_cpu[cnn-cpu]",
    "tests/frameworks/test_fw_lightning.py::test_gpu_accelerator_one_device[32-true-cpu]",
    "tests/frameworks/test_fw_lightning.py::test_gpu_accelerator_one_device[16-mixed-cpu]",
    "tests/frameworks/test_fw_lightning.py::test_gpu_accelerator_one_device[32-true-emulated-dml]",
    "tests/frameworks/test_fw_transformers.py::test_trainer_on_cpu_target_equals_native_cpu"
    "[gpt2-fp32]",
    "tests/test_hotpath.py::test_no_more_device_launches_than_the_wheels_own_path[mlp]",
    "tests/test_optim_emulated.py::test_emulated_tied_bounce_stalls_with_off_and_rebind_equals_native",
    "tests/test_distributed.py::test_torchrun_ddp_written_for_nccl_on_cpu",
    "tests/test_corpus.py::test_native_run[dataloader_workers-spawn]",
    "tests/test_optim_stall.py::test_stall_with_off[adam-onecycle-built-after-move-bounce]",
))


def _slow(item) -> bool:
    return item.get_closest_marker("slow") is not None or item.nodeid in SLOW_TESTS \
        or item.nodeid.split("[", 1)[0] in SLOW_TESTS


def pytest_collection_modifyitems(config, items):
    # The real-wheel lane is a lane of its own: with --real-d3d12 only its tests run (all of
    # them), without it none do (they need the library, which the project does not build).
    real = config.getoption("--real-d3d12") is not None
    tier = config.getoption("--tier")
    if config.getoption("--windows-python"):
        return  # tests/windows/ only (pytest_ignore_collect), every tier
    cuda = helpers.cuda_state().get("present", False)
    keep, drop = [], []
    for item in items:
        if item.get_closest_marker("cuda") is not None and not cuda:
            drop.append(item)  # said once at the end (pytest_terminal_summary)
            config.stash[CUDA_DESELECTED] += 1
        elif item.get_closest_marker("real_d3d12") is not None and not real:
            drop.append(item)
        elif real and item.get_closest_marker("real_d3d12") is None \
                and item.get_closest_marker("users_path") is None:
            drop.append(item)
        elif real or tier == "all" or _slow(item) == (tier == "rest"):
            keep.append(item)
        else:
            drop.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


CUDA_DESELECTED = pytest.StashKey[int]()


def _asks_for_cuda(markexpr: str) -> bool:
    """Whether ``-m markexpr`` selects the tests marked cuda for that mark: it matches a test
    marked cuda alone and not an unmarked one (``-m cuda``, ``-m "cuda or slow"``; not
    ``-m "not users_path"``, which .ci/run passes)."""
    if not markexpr:
        return False
    # pytest's own parser of -m (private, stable since pytest 6); the matcher takes the
    # marker's keyword arguments since pytest 8.3
    from _pytest.mark.expression import Expression

    expr = Expression.compile(markexpr)
    return expr.evaluate(lambda name, **_: name == "cuda") and not expr.evaluate(
        lambda name, **_: False)


def _configure_cuda(config) -> None:
    config.stash[CUDA_DESELECTED] = 0
    if config.getoption("--windows-python"):
        return  # tests/windows/ only, on a host without torch
    state = helpers.record_cuda_probe()
    if not state["present"] and _asks_for_cuda(config.getoption("markexpr")):
        # asked for by name: a run that passes on no test would read as "inert on CUDA: proved"
        raise pytest.UsageError(
            f"-m {config.getoption('markexpr')!r} asks for the tests marked cuda, which need a "
            f"CUDA device torch can use, and {state['why']} (docs/testing-on-cuda.md)")


def pytest_configure(config):
    _configure_cuda(config)
    real = config.getoption("--real-d3d12")
    if real is not None:
        if not os.path.isfile(real):
            raise pytest.UsageError(f"--real-d3d12 {real}: no such file")
        helpers.REAL_D3D12 = os.path.abspath(real)
    if config.getoption("--windows-python") and config.getoption("--windows-d3d12"):
        from tests.windows.wine import WindowsPython

        # the real-wheel suite on the Windows DirectML.dll (helpers: REAL_WINDOWS)
        helpers.REAL_WINDOWS = WindowsPython(config.getoption("--windows-python"),
                                             real_d3d12=True)
        helpers.REAL_D3D12 = str(helpers.REAL_WINDOWS.exe.parent)
    # PyTorch's autograd engine sizes its per-device queues at the first backward() of the
    # process: the emulated device's guard must exist before any CPU test runs backward().
    if "torch_directml" not in sys.modules and not config.getoption("--windows-python"):
        import emulated_dml as emulator

        emulator.install_device_guard()


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: its controller prints the line
        workeroutput["cuda_deselected"] = session.config.stash.get(CUDA_DESELECTED, 0)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    # xdist's controller collects nothing itself: each worker collected every test
    seen = getattr(node, "workeroutput", {}).get("cuda_deselected", 0)
    stash = node.config.stash
    stash[CUDA_DESELECTED] = max(stash.get(CUDA_DESELECTED, 0), seen)


def pytest_terminal_summary(terminalreporter, config):
    count = config.stash.get(CUDA_DESELECTED, 0)
    if count:
        terminalreporter.write_line(
            f"cuda: {count} tests marked cuda deselected: {helpers.cuda_state()['why']}; they "
            f"run where torch sees a CUDA device (docs/testing-on-cuda.md)")


@pytest.fixture
def shim():
    """Install dmlshim in this test process with the given options; always uninstalled after.

    Usage: ``def test_x(shim): shim(device="cpu")``.
    """
    import dmlshim

    def _install(**options):
        return dmlshim.install(**options)

    try:
        yield _install
    finally:
        dmlshim.uninstall()
