import pytest
from slurm_cluster import slurm_cluster  # noqa: F401  a fixture: the local SLURM cluster of test_slurm.py


@pytest.fixture
def emulated_gpu(request):
    """One CUDA GPU emulated on the CPU (tests/cuda_emulator.py) for the duration of a test. Compute capability
    (8, 0) by default (bf16 autocast); parametrise with indirect=True for another, e.g. (7, 0) for fp16 + GradScaler.
    """
    from cuda_emulator import emulated_cuda  # here, not at the top: the rest of the suite need not import torch

    with emulated_cuda(getattr(request, "param", (8, 0))) as gpu:
        yield gpu
