"""Read a torch.save() file that pickles whole Python objects, without running any code from it.

Ultralytics' .pt files pickle their model objects (ultralytics.nn.tasks.DetectionModel and every layer in
it). torch.load(weights_only=True) refuses them, and torch.load(weights_only=False) would import the classes
and run whatever the pickle asks for: a file from the internet could run a command. This reader is the
middle way: a restricted unpickler that

- rebuilds tensors (from the storages in the zip archive) and plain containers (dict, list, tuple, set,
  OrderedDict), torch dtypes and sizes;
- turns every other class or function the pickle names into an inert `Stub` that only records its name,
  the arguments it was called with and the state it was given; nothing is imported, nothing is called;
- records which names were *called* (a pickle's __reduce__ that wants to run os.system shows up there).

What comes back is data to read: a stubbed nn.Module keeps its `_parameters`, `_buffers` and `_modules`
in `.state`, which `module_tensors` walks like Module.state_dict() does.
"""

import collections
import pickle
import zipfile

import torch

# Storage classes as torch.save() names them -> element dtype.
_STORAGE_DTYPES = {
    "DoubleStorage": torch.float64,
    "FloatStorage": torch.float32,
    "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16,
    "LongStorage": torch.int64,
    "IntStorage": torch.int32,
    "ShortStorage": torch.int16,
    "CharStorage": torch.int8,
    "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool,
}


class Stub:
    """An object of a class this reader does not import. `.args`: what it was constructed or called with;
    `.state`: what the pickle set on it (an nn.Module's __dict__); `.items`: dict or list entries."""

    _module, _name = "", ""

    def __new__(cls, *args, **kwargs):
        obj = super().__new__(cls)
        obj.args, obj.state, obj.items = args, {}, {}
        return obj

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], dict):  # (__dict__, slots)
            state = {**state[0], **(state[1] or {})}
        self.state = state if isinstance(state, dict) else {"state": state}

    def __setitem__(self, key, value):  # a pickled dict subclass
        self.items[key] = value

    def append(self, value):  # a pickled list subclass
        self.items[len(self.items)] = value

    def extend(self, values):
        for value in values:
            self.append(value)

    def __repr__(self):
        return f"<stub {self._module}.{self._name}>"


def stub_name(obj):
    """'module.Class' of a stub instance or stub class, '' for anything else."""
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{cls._module}.{cls._name}" if isinstance(cls, type) and issubclass(cls, Stub) else ""


def _rebuild_tensor(storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None):
    return storage.as_strided(size, stride, offset).clone()


def _rebuild_parameter(data, requires_grad=False, hooks=None, state=None):
    return data


_SAFE = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch", "Size"): torch.Size,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "slice"): slice,
}


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, file, archive, prefix):
        super().__init__(file)
        self.archive, self.prefix = archive, prefix
        self.stub_types, self.calls, self.storages = {}, set(), {}

    def find_class(self, module, name):
        module = {"__builtin__": "builtins", "copy_reg": "copyreg"}.get(module, module)  # protocol 2's names
        if (module, name) in _SAFE:
            return _SAFE[(module, name)]
        if module == "torch" and name in _STORAGE_DTYPES:
            return _STORAGE_DTYPES[name]  # persistent_load reads the dtype from here
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if (module, name) not in self.stub_types:
            calls = self.calls

            class Named(Stub):
                # Called by the pickle (REDUCE): recorded, so a file that asks to run something can be named.
                def __init__(self, *args, **kwargs):
                    calls.add(f"{module}.{name}")

            Named._module, Named._name, Named.__qualname__ = module, name, f"Stub[{module}.{name}]"
            self.stub_types[(module, name)] = Named
        return self.stub_types[(module, name)]

    def persistent_load(self, pid):
        kind, dtype, key, _location, _numel = pid
        if kind != "storage" or not isinstance(dtype, torch.dtype):
            raise pickle.UnpicklingError(f"unsupported persistent id {kind!r}")
        if key not in self.storages:
            raw = bytearray(self.archive.read(f"{self.prefix}/data/{key}"))
            self.storages[key] = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        return self.storages[key]


def read_pickled_checkpoint(path):
    """(object, names called) from a torch.save() zip file, with every non-data class stubbed.
    Raises ValueError with a short reason when the file is not a torch zip archive."""
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        raise ValueError("not a zip archive (torch.save() writes one since PyTorch 1.6)") from None
    with archive:
        pickles = [n for n in archive.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pickles) != 1:
            raise ValueError("a zip archive without the data.pkl of a torch.save() file")
        prefix = pickles[0].split("/")[0]
        byteorder = f"{prefix}/byteorder"
        if byteorder in archive.namelist() and archive.read(byteorder).strip() not in (b"little", b""):
            raise ValueError("saved on a big-endian machine, which this reader does not convert")
        with archive.open(pickles[0]) as f:
            unpickler = _RestrictedUnpickler(f, archive, prefix)
            try:
                obj = unpickler.load()
            except (pickle.UnpicklingError, EOFError, KeyError, RuntimeError, TypeError, ValueError) as e:
                raise ValueError(f"its pickle is broken ({type(e).__name__}: {str(e)[:120]})") from None
    return obj, sorted(unpickler.calls)


def named_modules(module, prefix=""):
    """(name prefix, stub) of a stubbed nn.Module and of every module under it, like Module.named_modules."""
    if isinstance(module, Stub):
        yield prefix, module
        for name, child in (module.state.get("_modules") or {}).items():
            yield from named_modules(child, f"{prefix}{name}.")


def module_tensors(module):
    """The state_dict of a stubbed nn.Module: its parameters, persistent buffers and children's, by name."""
    tensors = {}
    for prefix, stub in named_modules(module):
        skip = stub.state.get("_non_persistent_buffers_set") or set()
        parameters, buffers = stub.state.get("_parameters") or {}, stub.state.get("_buffers") or {}
        for name, value in [*parameters.items(), *((n, v) for n, v in buffers.items() if n not in skip)]:
            if isinstance(value, torch.Tensor):
                tensors[prefix + name] = value
    return tensors
