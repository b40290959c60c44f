"""A CUDA GPU emulated on the CPU, so that the CUDA code paths of train.py, val.py, detect.py and export.py
run in CI on machines that have no GPU.

    with CudaEmulator(capability=(8, 0)) as gpu:
        ...  # torch.cuda.is_available() is True, x.to("cuda") gives a tensor on cuda:0
        gpu.host_syncs  # Counter: device-to-host synchronisations, by kind

How it works, and why each part is needed:
- `EmulatedCudaTensor` (cuda_emulator_tensor.py, with its conversions) is a wrapper subclass holding a CPU
  tensor (`.elem`) that tells Python its device is cuda:0. To C++ it stays a CPU tensor: a tensor that C++
  believes is on CUDA makes autograd ask the CUDA runtime for the current stream and abort the process (no
  driver). So `.device`, `.is_cuda`, `.is_cpu` and `.get_device()` are overridden in Python, and the few places
  where torch reads the device in C++ (optimizer and clip-grad grouping by device) are patched to see cuda:0 too.
- `_DispatchMode` (a TorchDispatchMode) runs every aten op of emulated tensors on their CPU tensors and wraps
  the results. It raises, as a CUDA kernel would, when an op mixes an emulated CUDA tensor with a CPU tensor
  of one or more dimensions (0-dim CPU tensors are scalars, which CUDA kernels accept), and it counts the ops
  that make the host wait for the GPU.
- `_FunctionMode` (a TorchFunctionMode, cuda_emulator_tensor.py) turns `.to("cuda")`, `.cuda()` and factories
  with device="cuda" into wraps, `.cpu()`/`.to("cpu")`/`.tolist()` into unwraps (counted as host syncs), and makes
  pin_memory a no-op. These must be caught above C++: torch's C++ bindings initialise CUDA (and fail) as soon as
  they see device="cuda".
- `torch.autocast("cuda", dtype)` runs as CPU autocast with the same dtype (the tensors are CPU tensors to
  the autocast dispatch key); torch.is_autocast_enabled("cuda") reports it as well.
- torch.cuda's bookkeeping (is_available, device_count, capability, memory, RNG, synchronize, ...) is
  patched; GradScaler("cuda") then works unchanged (its kernels have CPU implementations).
Everything is restored on exit.
"""

import contextlib
import functools
import importlib
import types
from collections import Counter

import cuda_emulator_tensor
import torch
import torch.utils.data._utils.pin_memory as pin_memory_utils
from cuda_emulator_tensor import (
    CPU,
    CUDA0,
    EmulatedCudaTensor,
    _FunctionMode,
    _index,
    _is_cuda,
    _leaves,
    _map,
    _map_one,
    _module_on_host,
    _unwrap,
    _wrap,
)
from torch.utils._python_dispatch import TorchDispatchMode

from bench.host_syncs import ALWAYS

aten = torch.ops.aten


class _DispatchMode(TorchDispatchMode):
    def __init__(self, emulator):
        super().__init__()
        self.emulator = emulator

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # torch.ops calls and tensor attributes would go through the function mode again: not for the emulator's own
        with torch._C.DisableTorchFunction():
            return self.emulator._run_op(func, args, kwargs or {})


# Ops of a CUDA tensor that accept CPU tensors by design: copies, and index tensors (moved to the GPU by torch)
_CROSS_DEVICE = {aten.copy_.default, aten._to_copy.default, aten.copy.default, aten._copy_from.default}
_INDEX_OPS = {aten.index.Tensor, aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default}
# Ops that wait for the GPU whatever their arguments (a scalar read, an output sized by the data): the list
# bench/host_syncs.py counts by; repeat_interleave too (that bench waives it when given its output size)
_WAITS = ALWAYS | {"repeat_interleave"}


class CudaEmulator:
    """Context manager; see the module docstring. `capability` (8, 0) and newer: bf16; (7, 0): fp16 only.

    host_syncs: Counter of the device-to-host synchronisations of emulated tensors, by kind
        (aten op names: `_local_scalar_dense` for .item()/bool()/int()/float(), `nonzero`, `masked_select`,
        `_unique2` and the other unique ops, `equal`, `repeat_interleave`; `index[bool]`, `index_put[bool]` and
        `index_put_[bool]` for boolean-mask indexing; `to_cpu`, `tolist` and `copy_to_cpu` for copies to the
        host; `synchronize` for torch.cuda.synchronize).
    ops: Counter of (aten op name, dtype of its first output) for every op run on an emulated tensor.
    """

    def __init__(self, capability=(8, 0), total_memory=16 * 2**30, name="Emulated GPU (CPU)"):
        self.capability, self.total_memory, self.name = tuple(capability), total_memory, name
        self.host_syncs, self.ops = Counter(), Counter()
        self.pinned, self.empty_cache_calls = 0, 0
        self.current_device = 0
        # torch functions being run by the function mode: on emulated tensors / on host tensors only
        self._emulated_calls, self._host_calls = 0, 0
        self._undo, self._modes, self._overwrite = [], [], None
        self._rng = {}

    # ------------------------------------------------------------------ op execution
    def _sync(self, kind):
        self.host_syncs[kind] += 1

    def _check_devices(self, func, args, kwargs):
        if func in _CROSS_DEVICE:
            return
        checked = _leaves(args[:1] + args[2:] if func in _INDEX_OPS else args, kwargs)
        for t in checked:
            if type(t) is torch.Tensor and t.dim() > 0 and t.device.type == "cpu":
                raise RuntimeError(
                    "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu! "
                    f"({func} got a CPU tensor of shape {tuple(t.shape)} next to a CUDA tensor)"
                )

    def _count(self, func, name, args):
        if name in _WAITS:
            self._sync(name)
        elif func in _INDEX_OPS and len(args) > 1 and isinstance(args[0], EmulatedCudaTensor):
            if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1] or ()):
                self._sync(f"{name}[bool]")  # a boolean mask is turned into indices with nonzero: a sync

    def _made_for_the_gpu(self, leaves):
        """Whether a factory op (no tensor argument) that C++ ran creates a tensor for a CUDA tensor. C++ code
        creates tensors with the options of the tensors at hand (`at::zeros(sizes, grad.options())` in backward
        formulas, composite ops); those of an emulated tensor say CPU, where a real one's say CUDA. So: a factory
        inside a call on emulated tensors or inside a backward, unless it came from the host code itself."""
        if any(isinstance(t, torch.Tensor) for t in leaves) or self._host_calls:
            return False
        return self._emulated_calls > 0 or torch._C._current_graph_task_id() != -1

    def _run_op(self, func, args, kwargs):
        leaves = list(_leaves(args, kwargs))
        emulated = [t for t in leaves if isinstance(t, EmulatedCudaTensor)]
        if not emulated:
            if _is_cuda(kwargs.get("device")):  # a factory that came past the function mode
                return _wrap(func(*args, **{**kwargs, "device": CPU}))
            out = func(*args, **kwargs)
            if self._made_for_the_gpu(leaves):
                out = _wrap(out)
            return out
        self._check_devices(func, args, kwargs)
        name = func.overloadpacket.__name__
        if func is aten.copy_.default and not isinstance(args[0], EmulatedCudaTensor):
            self._sync("copy_to_cpu")
        self._count(func, name, args)
        out = func(*_map(_unwrap, args), **{k: _map_one(_unwrap, v) for k, v in kwargs.items()})
        by_elem = {id(t.elem): t for t in emulated}

        def rewrap(t):
            if type(t) is not torch.Tensor:
                return t
            if id(t) in by_elem:  # in-place ops and out=: the very tensor that was passed in
                wrapper = by_elem[id(t)]
                if wrapper.shape != t.shape:
                    raise RuntimeError(f"the CUDA emulator does not support {func}, which resizes its input")
                return wrapper
            return EmulatedCudaTensor(t)

        out = _map_one(rewrap, out)
        first = out[0] if isinstance(out, (tuple, list)) and out else out
        self.ops[(name, first.dtype if isinstance(first, torch.Tensor) else None)] += 1
        return out

    # ------------------------------------------------------------------ patching
    def _patch(self, owner, name, value):
        missing = object()
        old = getattr(owner, name, missing)
        self._undo.append((owner, name, old, missing))
        setattr(owner, name, value)

    def _rng_state(self, device=None):
        index = _index(device)
        if index not in self._rng:
            self._rng[index] = torch.random.default_generator.get_state().clone()
        return self._rng[index].clone()

    def _set_rng_state(self, state, device=None):
        self._rng[_index(device)] = state.clone()

    def _seed(self, seed):
        self._rng[0] = torch.Generator().manual_seed(seed).get_state()

    def __enter__(self):
        if cuda_emulator_tensor._active is not None:
            raise RuntimeError("a CUDA emulator is already active")
        try:
            self._start()
        except BaseException:
            self._restore()
            raise
        return self

    def _start(self):
        self._patch_torch_cuda()
        self._patch_torch_internals()
        # module.to("cuda") replaces each parameter by a new one (a wrapper cannot take over the old one's data)
        self._overwrite = torch.__future__.get_overwrite_module_params_on_conversion()
        torch.__future__.set_overwrite_module_params_on_conversion(True)
        cuda_emulator_tensor._active = self
        for mode in (_DispatchMode(self), _FunctionMode(self)):
            mode.__enter__()
            self._modes.append(mode)

    def _cuda_functions(self):
        """torch.cuda's bookkeeping as the emulated GPU answers it, by function name."""
        capability, total = self.capability, self.total_memory

        def properties(device=None):
            return types.SimpleNamespace(
                name=self.name,
                major=capability[0],
                minor=capability[1],
                total_memory=total,
                multi_processor_count=80,
            )

        def synchronize(device=None):
            self._sync("synchronize")

        def empty_cache():
            self.empty_cache_calls += 1

        def set_device(device):
            index = _index(device)
            if index != 0:
                raise RuntimeError(f"CUDA error: invalid device ordinal (the emulator has one GPU; got {device})")
            self.current_device = index

        return {
            "is_available": lambda: True,
            "device_count": lambda: 1,
            "is_initialized": lambda: True,
            "_lazy_init": lambda: None,
            "init": lambda: None,
            "current_device": lambda: self.current_device,
            "set_device": set_device,
            "_exchange_device": lambda device: 0,
            "_maybe_exchange_device": lambda device: 0,
            "get_device_capability": lambda device=None: capability,
            "get_device_name": lambda device=None: self.name,
            "get_device_properties": properties,
            "is_bf16_supported": lambda including_emulation=True: capability >= (8, 0) or including_emulation,
            "mem_get_info": lambda device=None: (total * 3 // 4, total),
            "memory_reserved": lambda device=None: 0,
            "memory_allocated": lambda device=None: 0,
            "max_memory_allocated": lambda device=None: 0,
            "max_memory_reserved": lambda device=None: 0,
            "reset_peak_memory_stats": lambda device=None: None,
            "synchronize": synchronize,
            "empty_cache": empty_cache,
            "is_current_stream_capturing": lambda: False,
            "get_rng_state": self._rng_state,
            "set_rng_state": self._set_rng_state,
            "get_rng_state_all": lambda: [self._rng_state(0)],
            "set_rng_state_all": lambda states: [self._set_rng_state(s, i) for i, s in enumerate(states)],
            "manual_seed": self._seed,
            "manual_seed_all": self._seed,
            "seed": lambda: None,
            "seed_all": lambda: None,
            "initial_seed": lambda: 0,
        }

    def _patch_torch_cuda(self):
        """torch.cuda's functions (in torch.cuda.random and torch.cuda.memory too), its streams, torch.accelerator."""
        cuda = torch.cuda
        patches = self._cuda_functions()
        synchronize = patches["synchronize"]
        for name, value in patches.items():
            self._patch(cuda, name, value)
        for module in (torch.cuda.random, torch.cuda.memory):
            for name, value in patches.items():
                if hasattr(module, name):
                    self._patch(module, name, value)
        stream = types.SimpleNamespace(
            is_capturing=lambda: False, synchronize=synchronize, query=lambda: True, device=CUDA0, cuda_stream=0
        )
        self._patch(cuda, "current_stream", lambda device=None: stream)
        self._patch(cuda, "default_stream", lambda device=None: stream)
        # the DataLoader pins batches only when it sees an accelerator; optimizers ask it about graph capture
        self._patch(torch.accelerator, "current_stream", lambda device=None: stream)
        self._patch(torch.accelerator, "synchronize", synchronize)
        self._patch(torch.accelerator, "is_available", lambda: True)
        self._patch(torch.accelerator, "current_accelerator", lambda check_available=False: torch.device("cuda"))
        self._patch(torch.accelerator, "device_count", lambda: 1)
        self._patch(torch.accelerator, "current_device_index", lambda: 0)

    def _patch_torch_internals(self):
        """autocast, torch's grouping of tensors by device, the foreach types, the tracers, the DataLoader's pinning."""
        self._patch(torch, "autocast", _emulated_autocast)
        self._patch(torch.amp, "autocast", _emulated_autocast)
        # torch groups tensors by their C++ device, the CPU here: report cuda:0 for emulated ones
        real_group = torch._C._group_tensors_by_device_and_dtype

        def group(tensorlistlist, with_indices=False):
            grouped = real_group(tensorlistlist, with_indices)
            return {
                ((CUDA0 if isinstance(lists[0][0], EmulatedCudaTensor) else device), dtype): (lists, indices)
                for (device, dtype), (lists, indices) in grouped.items()
            }

        self._patch(torch._C, "_group_tensors_by_device_and_dtype", group)
        # the optimizers' and clip_grad_norm_'s foreach (multi-tensor) path, as CUDA tensors get it
        for module in map(importlib.import_module, ("torch.optim.optimizer", "torch.utils._foreach_utils")):
            self._patch(module, "_foreach_supported_types", [*module._foreach_supported_types, EmulatedCudaTensor])
        # The JIT tracer (torch.onnx.export, torch.jit.trace) cannot see through wrapper tensors: trace the
        # model as it is, on the host, with the modes off
        self._patch(torch.onnx, "export", self._on_host(torch.onnx.export))
        self._patch(torch.jit, "trace", _no_torchscript)
        # the DataLoader's pinning thread (workers > 0) has no modes: pinning must be a no-op there too
        self._patch(pin_memory_utils, "pin_memory", self._pin)

    def __exit__(self, *exc):
        self._restore()
        return False

    def _restore(self):
        for mode in reversed(self._modes):
            mode.__exit__(None, None, None)
        self._modes.clear()
        if self._overwrite is not None:
            torch.__future__.set_overwrite_module_params_on_conversion(self._overwrite)
        for owner, name, old, missing in reversed(self._undo):
            if old is missing:
                delattr(owner, name)
            else:
                setattr(owner, name, old)
        self._undo.clear()
        cuda_emulator_tensor._active = None

    def _pin(self, data, device=None):
        self.pinned += 1
        return data

    def _on_host(self, trace):
        @functools.wraps(trace)
        def run(module, args, *rest, **kwargs):
            with self.suspended(), _module_on_host(module):
                return trace(module, _map_one(_unwrap, args), *rest, **kwargs)

        return run

    @contextlib.contextmanager
    def suspended(self):
        """The modes off (the torch.cuda patches stay): torch sees the CPU tensors as they are."""
        for mode in reversed(self._modes):
            mode.__exit__(None, None, None)
        try:
            yield
        finally:
            for mode in self._modes:
                mode.__enter__()

    # ------------------------------------------------------------------ helpers for tests
    def count(self, op, dtype=None):
        """How many times aten `op` ran on emulated tensors (with that output dtype, if given)."""
        return sum(n for (name, dt), n in self.ops.items() if name == op and (dtype is None or dt == dtype))


_RealAutocast = torch.amp.autocast_mode.autocast


class _emulated_autocast(_RealAutocast):
    """torch.autocast("cuda", dtype): also CPU autocast with that dtype, which is what acts on the emulated
    tensors (CPU tensors to C++). The CUDA autocast state is set as well, for code that reads it."""

    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        super().__init__(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
        self._cpu = None
        if self.device == "cuda":
            self._cpu = _RealAutocast("cpu", dtype=self.fast_dtype, enabled=self._enabled, cache_enabled=cache_enabled)

    def __enter__(self):
        out = super().__enter__()
        if self._cpu is not None:
            self._cpu.__enter__()
        return out

    def __exit__(self, *exc):
        if self._cpu is not None:
            self._cpu.__exit__(*exc)
        return super().__exit__(*exc)


def _no_torchscript(*args, **kwargs):
    raise NotImplementedError(
        "the CUDA emulator cannot run TorchScript: a traced graph holds its device, and a scripted module's "
        "kernels would run outside the emulator; test TorchScript on the CPU"
    )


@contextlib.contextmanager
def emulated_cuda(capability=(8, 0), threads=1):
    """CudaEmulator with `threads` intra-op CPU threads. One by default: the emulated runs check code paths, not
    CPU speed, and where cores are shared (CI), OpenMP's spinning threads make these small ops 10-50x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with CudaEmulator(capability) as emulator:
            yield emulator
    finally:
        torch.set_num_threads(before)
