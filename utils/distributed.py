"""DDP set-up for torchrun (one or many nodes) and SLURM's srun, and the few collectives train.py needs."""

import datetime
import functools
import logging
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Callable, NamedTuple

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from utils.locks import claim_run_dir

TIMEOUT = datetime.timedelta(hours=3)  # rank 0 validates while the others wait: far more than the default 10 min


def setup_distributed(device_arg):
    """Returns (device, rank, local_rank, world_size, flags_group). Without torchrun/srun: one process.

    flags_group: a gloo group for the small yes/no votes of `any_rank`, so that they are exchanged
    between the hosts' CPUs and never wait for the GPU's queue of work (None for one process)."""
    if "RANK" not in os.environ and "SLURM_PROCID" in os.environ and int(os.environ.get("SLURM_NTASKS", 1)) > 1:
        # srun starts one task per GPU and tells each its ranks through SLURM_* variables
        os.environ["RANK"] = os.environ["SLURM_PROCID"]
        os.environ["LOCAL_RANK"] = os.environ["SLURM_LOCALID"]
        os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
        os.environ.setdefault("LOCAL_WORLD_SIZE", str(slurm_tasks_on_this_node(os.environ)))
        os.environ.update(slurm_rendezvous(os.environ))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    rank, local_rank = int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))
    gpus = parse_gpus(device_arg)
    if world_size == 1:
        if len(gpus) > 1:  # never train on one of them silently
            raise SystemExit(
                f"--device {device_arg}: one process trains on one GPU. To train on {len(gpus)} GPUs, "
                f"start one process per GPU:\n  torchrun --nproc_per_node {len(gpus)} {shlex.join(sys.argv)}"
            )
        return select_device(device_arg), 0, 0, 1, None
    if device_arg != "cpu" and torch.cuda.is_available():
        local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        if gpus and len(gpus) != local_world_size:
            raise SystemExit(
                f"--device {device_arg} names {len(gpus)} GPUs but {local_world_size} processes run on this node: "
                "name one GPU per process"
            )
        # pitfall T2: the device comes from LOCAL_RANK explicitly; left to guess from the global rank,
        # a second node picks GPUs it does not have and the run hangs. A scheduler that gives each task one
        # GPU of its own (SLURM --gpus-per-task=1) shows every task only cuda:0: local rank 1 is no ordinal there.
        device = torch.device("cuda", gpu_of_local_rank(gpus, local_rank, torch.cuda.device_count()))
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend, timeout=TIMEOUT, device_id=device if backend == "nccl" else None)
    stop_in_one_sentence_when_a_rank_is_lost(rank)
    flags_group = dist.new_group(backend="gloo", timeout=TIMEOUT) if backend == "nccl" else dist.group.WORLD
    return device, rank, local_rank, world_size, flags_group


# what gloo and nccl say when another rank of the run died (its sockets closed) or stopped answering
PEER_LOST_MESSAGES = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Timed out", "timed out")
_run_dir = []  # the run folder, once make_run_dir has it: the sentence names its last.pt


def peer_lost(error):
    """Whether `error` (or one in its chain) is a collective that failed because another rank is gone."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, dist.DistError) or (
            isinstance(error, RuntimeError) and any(m in str(error) for m in PEER_LOST_MESSAGES)
        ):
            return True
        error = error.__cause__ or error.__context__
    return False


def stop_in_one_sentence_when_a_rank_is_lost(rank):
    """A rank killed mid-epoch (OOM killer, a lost node): the others fail in their next collective. Each says so
    in one sentence with the command that continues from the last save, not a traceback per rank (rank 0's crash
    handler, installed after this, still writes crash/ first). Other errors keep their traceback."""
    previous = sys.excepthook

    def handler(kind, value, tb):
        if not peer_lost(value):
            return previous(kind, value, tb)
        reason = next((m for m in PEER_LOST_MESSAGES if m in str(value)), kind.__name__)  # not gloo's paragraph
        last = Path(_run_dir[0]) / "weights" / "last.pt" if _run_dir else Path("RUN/weights/last.pt")
        print(
            f"stopping: rank {rank} lost another process of this run ({reason}); every rank stops. Continue from "
            f"the last save with: torchrun ... train.py --resume {last}",
            file=sys.stderr,
        )

    sys.excepthook = handler


def slurm_rendezvous(env, run=subprocess.run):
    """MASTER_ADDR / MASTER_PORT for the tasks of one srun, so that `srun python train.py` needs nothing exported
    by hand; the values the user set are kept (MMEngine's and Lightning's SLURM launchers do the same).

    The address is the first host of the step's nodes: task 0, the rank that listens, runs there. The port comes
    from the job id, so that two jobs sharing a node do not both listen on one port."""
    found = {}
    if "MASTER_ADDR" not in env:
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", "")
        found["MASTER_ADDR"] = first_host(nodelist, env.get("SLURM_LAUNCH_NODE_IPADDR"), run)
    if "MASTER_PORT" not in env:
        found["MASTER_PORT"] = str(10000 + int(env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or 0) % 20000)
    return found


def first_host(nodelist, launch_addr, run=subprocess.run):
    """The first host of a SLURM node list such as 'gpu[01-04],cpu7'. Only scontrol knows every form of that
    syntax; without it a list of one plain name is taken as it is, else the address srun was started from
    (the batch script's node, the job's first node)."""
    try:
        result = run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
        hosts = result.stdout.split() if result.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired):
        hosts = []
    if hosts:
        return hosts[0]
    if nodelist and not any(c in nodelist for c in "[],"):
        return nodelist
    if launch_addr:
        return launch_addr
    raise SystemExit(
        f"SLURM node list {nodelist!r}: cannot find the first host (no scontrol); export MASTER_ADDR and MASTER_PORT"
    )


def slurm_tasks_on_this_node(env):
    """The tasks of this srun step on this node, from SLURM's compact form: '2(x3),1' is 2 tasks on each of the
    first 3 nodes and 1 on the fourth; SLURM_NODEID is this node's place in the list."""
    spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or env.get("SLURM_NTASKS_PER_NODE")
    if not spec:
        return 1
    counts = []
    for part in spec.split(","):
        count, _, repeat = part.partition("(x")
        counts += [int(count)] * int(repeat.rstrip(")") or 1)
    return counts[min(int(env.get("SLURM_NODEID", 0)), len(counts) - 1)]


class NodeShare(NamedTuple):
    """What the processes of one machine need to share one thing between them (utils.data.images.cache_images:
    one copy of the decoded images): who they are, a name unique to the run, and the collectives to agree by."""

    local_rank: int
    local_world_size: int  # the processes of this machine (1: this one alone)
    run_key: str  # the same on every rank of this run, different for another run on the machine
    broadcast: Callable[[list], None]  # replaces the list's items by rank 0's, on every rank
    barrier: Callable[[], None]


def node_share(local_rank, world_size, group=None):
    """This process's NodeShare, called after setup_distributed (on every rank: the collectives are then
    called on all of them). The environment is read here, not in the code that uses it: LOCAL_WORLD_SIZE
    (torchrun sets it; setup_distributed does under srun) and MASTER_PORT (two runs on one machine listen
    on two ports)."""
    if world_size == 1:
        return NodeShare(0, 1, "", lambda objects: None, lambda: None)
    return NodeShare(
        local_rank,
        int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
        str(os.environ.get("MASTER_PORT")),
        functools.partial(dist.broadcast_object_list, src=0, group=group),
        functools.partial(dist.barrier, group=group),
    )


def gpu_of_local_rank(gpus, local_rank, visible):
    """The CUDA ordinal a process uses: its entry of --device, else its local rank, else (one GPU visible
    to each task) 0."""
    if gpus:
        return gpus[local_rank]
    if visible == 1:
        return 0
    if local_rank >= visible:
        raise SystemExit(
            f"local rank {local_rank} has no GPU: this process sees {visible} GPU(s); "
            "start at most one process per visible GPU"
        )
    return local_rank


def parse_gpus(device_arg):
    """'0,1' -> [0, 1]; '', 'cpu', 'mps' -> []."""
    if device_arg in ("", None, "cpu", "mps"):
        return []
    try:
        return [int(g) for g in str(device_arg).split(",")]
    except ValueError:
        raise SystemExit(
            f"--device {device_arg}: expected cpu, mps, a GPU index (0) or a list of them (0,1,2,3)"
        ) from None


def select_device(device_arg):
    """'cpu', 'mps', '0', '0,1' (the first listed is used by one process), '' = first GPU if any.
    The GPU chosen is made the current one, so that nothing else lands on GPU 0 by default."""
    if device_arg in ("cpu", "mps"):
        return torch.device(device_arg)
    if not torch.cuda.is_available():
        if device_arg in ("", None):
            return torch.device("cpu")
        raise SystemExit(f"--device {device_arg}: CUDA is not available on this machine (use --device cpu)")
    gpus = parse_gpus(device_arg) or [0]
    if gpus[0] >= torch.cuda.device_count():
        raise SystemExit(f"--device {device_arg}: this machine has {torch.cuda.device_count()} GPU(s), numbered from 0")
    device = torch.device("cuda", gpus[0])
    torch.cuda.set_device(device)
    return device


def amp_settings(device, amp=None, choice="auto"):
    """(use_amp, amp_dtype) of --amp / --no-amp (default: on for CUDA only) and --amp-dtype. bf16 on a CPU that
    only emulates it is allowed, with one line saying how much slower it is there."""
    use_amp = amp if amp is not None else device.type == "cuda"
    dtype = amp_dtype_for(device, choice)
    if use_amp and device.type == "cpu" and dtype == torch.bfloat16 and not cpu_has_native_bf16():
        logging.getLogger("yolo").warning(BF16_EMULATED)
    return use_amp, dtype


def amp_dtype_for(device, choice="auto"):
    """--amp-dtype: bf16 or fp16, or auto: bf16 where the hardware computes in it (CPUs, GPUs of compute
    capability 8 and above; on older GPUs torch.cuda.is_bf16_supported() is true too, but emulated and slow),
    else fp16, which needs loss scaling."""
    if choice != "auto":
        return {"bf16": torch.bfloat16, "fp16": torch.float16}[choice]
    native_bf16 = device.type == "cpu" or (device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0))
    return torch.bfloat16 if native_bf16 else torch.float16


def teacher_dtype_for(device, use_amp, amp_dtype):
    """train.py --teacher: the dtype its frozen network runs in. Under AMP, the run's (its forward then costs what
    the student's does under autocast). In an fp32 run on a CPU that computes bf16 itself, bf16 too: the teacher's
    forward is far cheaper there (AMX; bench/RESULTS.md#distillation), and its scores, targets of a
    KL and not gradients, keep enough of their digits in bf16. Else fp32."""
    if use_amp:
        return amp_dtype
    return torch.bfloat16 if device.type == "cpu" and cpu_has_native_bf16() else torch.float32


# bf16 is emulated and far slower than fp32 with AVX2 kernels only, faster with AVX512_BF16
# (bench/RESULTS.md#bf16-on-the-cpu)
BF16_EMULATED = (
    "--amp on this CPU: it has no native bf16 (AVX512_BF16 or AMX), so bf16 is emulated and about 10x slower than fp32 "
    "(bench/RESULTS.md); training goes on, leave out --amp to train faster"
)


def cpu_has_native_bf16():
    """Whether this CPU computes in bf16 itself (AVX512_BF16 or AMX on x86, the BF16 extension on Arm). Without
    it, torch and oneDNN emulate bf16 with conversions around fp32 arithmetic: slower than plain fp32."""
    try:
        capabilities = torch.cpu.get_capabilities()
    except (AttributeError, RuntimeError):  # older torch, or a platform it does not describe: assume emulated
        return False
    return any(capabilities.get(k) for k in ("avx512_bf16", "amx_bf16", "bf16", "sve_bf16"))


def sync_batchnorm(model, device):
    """--sync-bn under DDP: BatchNorm statistics over every rank's batch. torch's SyncBatchNorm has no CPU kernel:
    there each process keeps its own statistics, and says so."""
    if device.type == "cpu":
        logging.getLogger("yolo").warning(
            "--sync-bn: torch's SyncBatchNorm has no CPU kernel; each process keeps its own BN statistics"
        )
        return model
    return torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)


def wrap_ddp(model, device):
    """DistributedDataParallel on the process's own device. device_ids is the CUDA ordinal, not the local rank:
    under `--device 2,3` local rank 0 trains on cuda:2, and DDP told cuda:0 mixes the two in the first forward.
    pitfall M2: broadcast_buffers=False keeps each rank's BN statistics (no broadcast from rank 0 every
    forward); validation and best.pt use the EMA, one consistent model."""
    return DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None, broadcast_buffers=False
    )


def make_run_dir(out, is_main, world_size):
    """Rank 0 makes and claims the run folder (--out, else runs/train/exp, exp2, ...) with its weights/: a second
    run on the same folder, or one it cannot write in, stops with one sentence (utils/locks.py). Under DDP every
    rank gets its path (they write nothing, but all must agree on it)."""
    run_dir = None
    if is_main:
        run_dir = claim_run_dir(out)
        (run_dir / "weights").mkdir(parents=True, exist_ok=True)
    if world_size > 1:
        shared = [str(run_dir) if is_main else None]
        dist.broadcast_object_list(shared, src=0)
        run_dir = Path(shared[0])
    _run_dir[:] = [str(run_dir)]
    return run_dir


def barrier(world_size, group=None):
    if world_size > 1:
        dist.barrier(group=group)


def leave_together(world_size, group=None):
    """The end of a DDP run: every rank waits for the others, then tears the process group down. A rank that tore
    gloo down while rank 0 still evaluated died at exit in std::terminate ("terminate called without an active
    exception"), and srun then failed the whole job."""
    if world_size > 1:
        dist.barrier(group=group)
        dist.destroy_process_group()


def any_rank(flags, world_size, group=None):
    """For each flag, True on every rank if it is True on any rank. A decision that must be the same
    everywhere (stop, skip a step) is taken this way; otherwise the ranks that went on wait forever
    in the next all-reduce for the ones that did not."""
    if world_size == 1:
        return list(flags)
    t = torch.tensor([int(bool(f)) for f in flags], dtype=torch.int32)  # on the CPU: the flags group is gloo
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return [bool(v) for v in t.tolist()]
