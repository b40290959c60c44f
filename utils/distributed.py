"""DDP set-up for torchrun (one or many nodes) and SLURM's srun."""

import datetime
import os

import torch
import torch.distributed as dist


def setup_distributed(device_arg):
    """Returns (device, rank, local_rank, world_size). Without torchrun/srun: one process."""
    if "RANK" not in os.environ and "SLURM_PROCID" in os.environ and int(os.environ.get("SLURM_NTASKS", 1)) > 1:
        # srun starts one task per GPU and tells each its ranks through SLURM_* variables;
        # MASTER_ADDR / MASTER_PORT must be exported by the batch script (see README).
        os.environ["RANK"] = os.environ["SLURM_PROCID"]
        os.environ["LOCAL_RANK"] = os.environ["SLURM_LOCALID"]
        os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    rank, local_rank = int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))
    if world_size == 1:
        return select_device(device_arg), 0, 0, 1
    if device_arg != "cpu" and torch.cuda.is_available():
        # seed 001, T2: set the device from LOCAL_RANK explicitly; left to guess from the global
        # rank, a second node picks GPUs it does not have and the run hangs.
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    # Rank 0 validates while the others wait at a barrier: allow far more than the default 10 min.
    dist.init_process_group(backend, timeout=datetime.timedelta(hours=3), device_id=device if backend == "nccl" else None)
    return device, rank, local_rank, world_size


def select_device(device_arg):
    """'cpu', '0', '0,1' (first listed is used by one process), '' = first GPU if any."""
    if device_arg in ("", None):
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if device_arg == "cpu":
        return torch.device("cpu")
    if device_arg == "mps":
        return torch.device("mps")
    if not torch.cuda.is_available():
        raise SystemExit(f"--device {device_arg}: CUDA is not available on this machine (use --device cpu)")
    return torch.device("cuda", int(str(device_arg).split(",")[0]))


def barrier(world_size):
    if world_size > 1:
        dist.barrier()


def all_agree(flag, world_size, device):
    """True on every rank if any rank says True: a stop request seen by one rank stops all of them
    at the same step (otherwise the others wait forever in the next all-reduce)."""
    if world_size == 1:
        return flag
    t = torch.tensor([float(flag)], device=device)
    dist.all_reduce(t)
    return bool(t.item() > 0)
