"""The tensor of the CUDA emulator (cuda_emulator.py): EmulatedCudaTensor, a CPU tensor Python sees on cuda:0, its
conversions between host and device, and _FunctionMode, which routes torch's conversions and factories to them."""

import contextlib
import copy

import torch
from torch.overrides import TorchFunctionMode

CUDA0 = torch.device("cuda", 0)
CPU = torch.device("cpu")

_active = None  # the CudaEmulator in effect (cuda_emulator.py sets it); wrappers outlive it only as errors


def _is_cuda(device):
    if device is None:
        return False
    if isinstance(device, int):  # torch accepts a bare index for a CUDA device
        return True
    return torch.device(device).type == "cuda"


class EmulatedCudaTensor(torch.Tensor):
    """A CPU tensor (`elem`) presented to Python as a tensor on cuda:0."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem):
        assert type(elem) is torch.Tensor and elem.device.type == "cpu", (type(elem), elem.device)
        r = torch.Tensor._make_wrapper_subclass(
            cls,
            elem.shape,
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            layout=elem.layout,
            device=CPU,  # to C++: see the module docstring
            requires_grad=False,
        )
        r.elem = elem
        return r

    # Seen from Python, the tensor is on the GPU.
    device = property(lambda self: CUDA0)
    is_cuda = property(lambda self: True)
    is_cpu = property(lambda self: False)

    def get_device(self):
        return 0

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        # Reached only where the dispatch mode is not on the stack: another thread, or after the emulator ended
        if _active is None:
            raise RuntimeError(f"{func}: an emulated CUDA tensor was used after the CUDA emulator ended")
        with torch._C.DisableTorchFunction():
            return _active._run_op(func, args, kwargs or {})

    # Conversions also as methods: they must work where the function mode is not on the stack (other threads)
    def to(self, *args, **kwargs):
        return _convert(torch.Tensor.to, self, args, kwargs)

    def cuda(self, *args, **kwargs):
        return _convert(torch.Tensor.cuda, self, args, kwargs)

    def cpu(self, *args, **kwargs):
        return _convert(torch.Tensor.cpu, self, args, kwargs)

    def tolist(self):
        return _convert(torch.Tensor.tolist, self, (), {})

    def numpy(self, *args, **kwargs):
        return _convert(torch.Tensor.numpy, self, args, kwargs)

    def __array__(self, dtype=None):
        return _convert(torch.Tensor.numpy, self, (), {})

    def __reduce_ex__(self, protocol):
        # torch.save of a CUDA tensor copies it to the host; the file then holds a CPU tensor (checkpoints here
        # are always loaded with map_location="cpu")
        return self.elem.detach().__reduce_ex__(protocol)

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        with torch.no_grad():
            new = EmulatedCudaTensor(self.elem.clone(memory_format=torch.preserve_format))
        new.requires_grad_(self.requires_grad)
        memo[id(self)] = new
        for key, value in self.__dict__.items():
            if key != "elem":
                setattr(new, key, copy.deepcopy(value, memo))
        if self.grad is not None:
            new.grad = self.grad.__deepcopy__(memo)
        return new

    def __repr__(self):
        return f"EmulatedCudaTensor(device='cuda:0', {self.elem!r})"


def _unwrap(t):
    return t.elem if isinstance(t, EmulatedCudaTensor) else t


def _wrap(t):
    """A CPU tensor -> a new emulated CUDA tensor holding it (in tuples and lists too; other values as they are)."""
    return _map_one(lambda x: EmulatedCudaTensor(x) if type(x) is torch.Tensor and x.device.type == "cpu" else x, t)


# aten ops take and return tensors, scalars and flat lists of them: no need for pytree's generality (and cost)
def _leaves(args, kwargs):
    for a in (*args, *kwargs.values()):
        if isinstance(a, (list, tuple)):
            yield from a
        else:
            yield a


def _map_one(f, a):
    return type(a)(f(x) for x in a) if isinstance(a, (list, tuple)) else f(a)


def _map(f, args):
    return [_map_one(f, a) for a in args]


class _ToCuda(torch.autograd.Function):
    """Host -> device copy that autograd sees through (gradients flow back to the CPU tensor)."""

    @staticmethod
    def forward(ctx, x):
        return EmulatedCudaTensor(x.detach().clone(memory_format=torch.preserve_format))

    @staticmethod
    def backward(ctx, grad):
        return _unwrap(grad).clone()


class _ToCpu(torch.autograd.Function):
    """Device -> host copy that autograd sees through."""

    @staticmethod
    def forward(ctx, x):
        return x.elem.detach().clone(memory_format=torch.preserve_format)

    @staticmethod
    def backward(ctx, grad):
        return EmulatedCudaTensor(grad.detach().clone())


def _parse_to(args, kwargs):
    """Tensor.to's overloads -> (device or None, dtype or None, non_blocking, copy, memory_format). The device
    is swapped for the CPU before torch parses the rest: its parser would initialise CUDA (and fail)."""
    kwargs = dict(kwargs)
    make_copy = kwargs.pop("copy", False)
    if args and isinstance(args[0], torch.Tensor):  # .to(other): other's device (as Python sees it) and dtype
        other = args[0]
        non_blocking = args[1] if len(args) > 1 else kwargs.get("non_blocking", False)
        make_copy = args[2] if len(args) > 2 else make_copy
        return other.device, other.dtype, non_blocking, make_copy, kwargs.get("memory_format")
    args, device = list(args), None
    device_first = bool(args) and not isinstance(args[0], torch.dtype)
    if device_first:
        device, args[0] = args[0], None
    elif kwargs.get("device") is not None:
        device, kwargs["device"] = kwargs["device"], None
    if len(args) > (3 if device_first else 2):  # copy, positionally: to(device, dtype, non_blocking, copy)
        make_copy = args.pop(3 if device_first else 2)
    _, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
    if isinstance(device, int):
        device = torch.device("cuda", device)
    return (None if device is None else torch.device(device)), dtype, non_blocking, make_copy, memory_format


def _convert(func, self, args, kwargs):
    """Tensor.to / .cuda / .cpu / .tolist / .numpy of a plain or an emulated tensor."""
    emu = _active
    emulated = isinstance(self, EmulatedCudaTensor)
    if func is torch.Tensor.tolist:
        if emulated:
            emu._sync("tolist")
            return self.elem.tolist()
        return func(self)
    if func is torch.Tensor.numpy:
        if emulated:  # the real error: numpy() never copies from the GPU
            raise TypeError(
                "can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host "
                "memory first."
            )
        return func(self, *args, **kwargs)
    if func is torch.Tensor.cuda:
        device = args[0] if args else kwargs.get("device")
        non_blocking = args[1] if len(args) > 1 else kwargs.get("non_blocking", False)
        target = CUDA0 if device is None else torch.device("cuda", _index(device))
        dtype, make_copy, memory_format = None, False, kwargs.get("memory_format")
    elif func is torch.Tensor.cpu:
        target, dtype, non_blocking, make_copy, memory_format = CPU, None, False, False, kwargs.get("memory_format")
    else:
        target, dtype, non_blocking, make_copy, memory_format = _parse_to(args, kwargs)
    if target is not None and target.type == "cuda" and (target.index or 0) != 0:
        raise RuntimeError(f"CUDA error: invalid device ordinal (the emulator has one GPU, cuda:0; got {target})")
    rest = dict(dtype=dtype, copy=make_copy)
    if memory_format is not None:
        rest["memory_format"] = memory_format
    if target is not None and target.type == "cuda" and not emulated:  # host -> device
        return _ToCuda.apply(torch.Tensor.to(self, **rest))
    if target is not None and target.type == "cpu" and emulated:  # device -> host
        if not non_blocking:
            emu._sync("to_cpu")
        return torch.Tensor.to(_ToCpu.apply(self), dtype=dtype, memory_format=memory_format or torch.preserve_format)
    if target is not None and target.type not in ("cuda", "cpu"):
        raise RuntimeError(f"the CUDA emulator cannot move a tensor to {target}")
    # Same device: dtype / layout changes only (an emulated result comes back through the dispatch mode)
    return torch.Tensor.to(self, **rest, non_blocking=non_blocking)


_CONVERSIONS = {torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu, torch.Tensor.tolist, torch.Tensor.numpy}


class _FunctionMode(TorchFunctionMode):
    def __init__(self, emulator):
        super().__init__()
        self.emulator = emulator

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _CONVERSIONS:
            return _convert(func, args[0], args[1:], kwargs)
        if func is torch.Tensor.__array__:
            return _convert(torch.Tensor.numpy, args[0], (), {})
        if func is torch.Tensor.pin_memory:  # no pinned memory without CUDA; the copies are synchronous anyway
            self.emulator.pinned += 1
            if isinstance(args[0], EmulatedCudaTensor):
                raise RuntimeError("cannot pin 'torch.cuda.FloatTensor' only dense CPU tensors can be pinned")
            return args[0]
        if func is torch.Tensor.is_pinned:
            return not isinstance(args[0], EmulatedCudaTensor) and self.emulator.pinned > 0
        if kwargs.get("pin_memory"):
            kwargs = {**kwargs, "pin_memory": False}
        if _is_cuda(kwargs.get("device")):  # a factory (torch.zeros(..., device="cuda"), x.new_zeros(..., device=))
            if torch.device(kwargs["device"]).index not in (None, 0):
                raise RuntimeError(
                    f"CUDA error: invalid device ordinal (the emulator has one GPU; got {kwargs['device']})"
                )
            requires_grad = kwargs.get("requires_grad", False)
            kwargs = (
                {**kwargs, "device": CPU, "requires_grad": False}
                if "requires_grad" in kwargs
                else {**kwargs, "device": CPU}
            )
            out = _wrap(func(*args, **kwargs))
            return out.requires_grad_() if requires_grad else out
        on_gpu = any(isinstance(t, EmulatedCudaTensor) for t in _leaves(args, kwargs))
        emulator = self.emulator
        if on_gpu:
            emulator._emulated_calls += 1
        else:
            emulator._host_calls += 1
        try:
            out = func(*args, **kwargs)
        finally:
            if on_gpu:
                emulator._emulated_calls -= 1
            else:
                emulator._host_calls -= 1
        if func is torch.Tensor.new_tensor and isinstance(args[0], EmulatedCudaTensor) and "device" not in kwargs:
            out = _wrap(out)  # built from Python data with the options of a CUDA tensor: on the GPU
        return out


def _index(device):
    if device is None:
        return 0
    if isinstance(device, int):
        return device
    return torch.device(device).index or 0


@contextlib.contextmanager
def _module_on_host(module):
    """Swap the emulated parameters and buffers of `module` for their CPU tensors, and back afterwards."""
    swapped = []
    for m in module.modules() if isinstance(module, torch.nn.Module) else ():
        for table in (m._parameters, m._buffers):
            for name, t in table.items():
                if isinstance(t, EmulatedCudaTensor):
                    host = torch.nn.Parameter(t.elem, t.requires_grad) if table is m._parameters else t.elem
                    swapped.append((table, name, t))
                    table[name] = host
    try:
        yield
    finally:
        for table, name, t in swapped:
            table[name] = t
