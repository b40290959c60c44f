import os
import resource

import pytest
from slurm_cluster import slurm_cluster  # noqa: F401  a fixture: the local SLURM cluster of test_slurm.py

# libgomp's threads spin at each parallel region's end by default. Two workers of torch threads on 2 cores: a thread
# whose partner is descheduled spins its time slice away, and the tiny runs here spent most of their time so (the
# killed-run test: 80 s of CPU and wall spinning, 19 s passive, on a 2-core AVX2 host). Set before anything imports
# torch; the train.py runs, the warm interpreter and the SLURM jobs inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def cap_memory(share=0.8):
    """Each worker, and each process it starts, may allocate its share of the machine's memory and no more: a test
    that runs away fails with a MemoryError naming it, where the kernel's out-of-memory killer would take the whole
    worker (pytest.ini: --max-worker-restart 0 then stops the run, naming the test). RLIMIT_DATA counts what a
    process allocates, not the libraries it maps (RLIMIT_AS would count torch's 3 GB of libraries and reservations).
    """
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    cap = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * share / workers)
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    cap = min([cap] + [limit for limit in (soft, hard) if limit != resource.RLIM_INFINITY])
    resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))


cap_memory()

# The fixtures several test files share, each defined beside the helpers it goes with (loaded after the line above:
# they import torch): tiny_data (train_runs.py), data (emulated_runs.py), sets (format_sets.py), log_lines and
# user_cache_dir (data_helpers.py)
pytest_plugins = ["train_runs", "emulated_runs", "format_sets", "data_helpers"]


@pytest.fixture
def emulated_gpu(request):
    """One CUDA GPU emulated on the CPU (tests/cuda_emulator.py) for the duration of a test. Compute capability
    (8, 0) by default (bf16 autocast); parametrise with indirect=True for another, e.g. (7, 0) for fp16 + GradScaler.
    """
    from cuda_emulator import emulated_cuda  # here, not at the top: the rest of the suite need not import torch

    with emulated_cuda(getattr(request, "param", (8, 0))) as gpu:
        yield gpu


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    """Two workers (pytest-xdist, pytest.ini: -n 2 --dist loadgroup) on this 2-core machine, where one worker used
    ~0.9 cores: each test file runs whole on one worker, so its module fixtures (a trained model, an export) are
    built once; the tests that start a SLURM cluster share a worker, so one cluster runs at a time; the
    test_train_*.py files, the longest, start first so that the two workers end together."""
    for item in items:
        group = "slurm" if "slurm_cluster" in getattr(item, "fixturenames", ()) else item.module.__name__
        item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: not item.module.__name__.startswith("test_train_"))  # stable: the rest keep their order


@pytest.hookimpl(tryfirst=True)  # before the fixtures are set up: a module fixture exports to every format
def pytest_runtest_setup(item):
    """A test marked needs(...) (tests/runtimes.py) skips where that format's packages are missing, naming their pip
    line; under CI=true, where .ci/run installs them all, it fails."""
    for mark in item.iter_markers("needs"):
        from runtimes import need  # here, not at the top: it imports torch, after cap_memory() above

        need(*mark.args, **mark.kwargs)
