"""Test-process setup: `import dmlshim` must not patch the pytest process itself.

Unit tests call dmlshim.install()/uninstall() explicitly (see the `shim` fixture); scripts run
through the runner in subprocesses get a clean environment from tests/helpers.py.

Tiers: a plain `pytest` runs the fast tier (every area, a few minutes); `--tier rest` runs the
tests marked ``slow`` (framework matrices, model zoos, long subprocess runs), `--tier all`
both. .ci/run runs the fast tier, then the rest, on each lane.
"""

import os

os.environ["DMLSHIM_DISABLE"] = "1"

import sys  # noqa: E402

import pytest  # noqa: E402

TIERS = ("fast", "rest", "all")


def pytest_addoption(parser):
    parser.addoption("--tier", choices=TIERS, default="fast",
                     help="fast (default): every area in minutes; rest: the tests marked slow; "
                          "all: both")


# The rest tier besides tests marked slow where they are written: the longest test functions
# of the suite (measured with --durations, all their parameters), each of whose areas keeps
# shorter tests in the fast tier.
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
))


def _slow(item) -> bool:
    return item.get_closest_marker("slow") is not None \
        or item.nodeid.split("[", 1)[0] in SLOW_TESTS


def pytest_collection_modifyitems(config, items):
    tier = config.getoption("--tier")
    if tier == "all":
        return
    want_slow = tier == "rest"
    keep, drop = [], []
    for item in items:
        (keep if _slow(item) == want_slow else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_configure(config):
    # PyTorch's autograd engine sizes its per-device queues at the first backward() of the
    # process: the emulated device's guard must exist before any CPU test runs backward().
    if "torch_directml" not in sys.modules:
        import emulated_dml as emulator

        emulator.install_device_guard()


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
