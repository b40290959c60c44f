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
in `.state`, which utils/checkpoints/ultralytics.py walks like Module.state_dict() does. This module only reads;
utils/checkpoints/ours.py calls it on the file it opened, then hands the result to utils/checkpoints/ultralytics.py.

A hostile file is bounded by its own size: only uncompressed (STORED) entries are read, as torch.save() writes
them, and never more bytes than the file holds; a storage must have the bytes its reference claims; a tensor
must be a view inside its storage with no more elements than it (no stride 0, no overlapping rows), and all
tensors together at most twice the file. Anything else that goes wrong becomes a ValueError with one line.
"""

import collections
import math
import os
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


class _Refused(ValueError):
    """The file is malformed or hostile; the message says how, and becomes read_pickled_checkpoint's reason."""


def _one_line(text, limit=120):
    # torch's errors span several lines; the caller's refusal must stay one sentence
    return " ".join(str(text).split())[:limit]


def _is_count(value):
    return type(value) is int and value >= 0  # not bool, not a stub standing in for a number


def _rebuild_parameter(data, requires_grad=False, hooks=None, state=None):
    return data


_SAFE = {
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch", "Size"): torch.Size,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "slice"): slice,
}


class _Entries:
    """The archive's entries, each read at most once, and only as torch.save() writes them: uncompressed, so
    that an entry cannot inflate (a small deflated entry can hold gigabytes), and in total no more bytes than the
    file has, so that entries sharing their bytes (overlapping records of a crafted zip) cannot multiply them."""

    def __init__(self, archive, file_size):
        self.archive, self.file_size, self.unread = archive, file_size, file_size

    def info(self, name):
        info = self.archive.getinfo(name)
        if info.compress_type != zipfile.ZIP_STORED:
            raise _Refused(f"its entry {name} is compressed (method {info.compress_type}); torch.save() never is")
        if info.file_size != info.compress_size or info.file_size > self.unread:
            raise _Refused(f"its entries claim more bytes than the file's {self.file_size}")
        self.unread -= info.file_size
        return info

    def read(self, name):
        return self.archive.read(self.info(name))


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, file, entries, prefix):
        super().__init__(file)
        self.entries, self.prefix = entries, prefix
        self.stub_types, self.calls, self.storages = {}, set(), {}
        self.storage_ids = set()  # ids of the storage tensors above (kept alive by self.storages)
        # Every tensor is a copy of part of a storage; views of one storage, each cheap in the pickle, would
        # otherwise copy it again and again. Twice the file leaves room for a tensor saved with a view of it.
        self.tensor_bytes_left = 2 * entries.file_size

    def find_class(self, module, name):
        module = {"__builtin__": "builtins", "copy_reg": "copyreg"}.get(module, module)  # protocol 2's names
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return self.rebuild_tensor  # checks its storage against this file's
        if (module, name) in _SAFE:
            return _SAFE[(module, name)]
        if module == "torch" and name in _STORAGE_DTYPES:
            return _STORAGE_DTYPES[name]  # persistent_load reads the dtype from here
        # vars(), not getattr(): torch's module __getattr__ imports torch._dynamo and friends for a name
        # (seconds) and calls functions for deprecated ones, all on the word of the pickle
        if module == "torch" and isinstance(vars(torch).get(name), torch.dtype):
            return vars(torch)[name]
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
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise _Refused(f"its pickle refers to {_one_line(repr(pid), 60)}, which is not a storage")
        _, dtype, key, _location, numel = pid
        if not (isinstance(dtype, torch.dtype) and isinstance(key, str) and _is_count(numel)):
            raise _Refused(f"its pickle has a malformed storage reference {_one_line(repr(pid), 60)}")
        if key not in self.storages:
            raw = self.entries.read(f"{self.prefix}/data/{key}")
            # torch.save() writes exactly the referenced elements; other bytes are a lie about the size
            if len(raw) != numel * dtype.itemsize:
                raise _Refused(f"storage {key} should hold {numel} {dtype} elements but its entry has {len(raw)} bytes")
            raw = bytearray(raw)  # writable, so torch.frombuffer shares it without a warning
            storage = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
            self.storages[key] = storage
            self.storage_ids.add(id(storage))
        storage = self.storages[key]
        if storage.dtype != dtype or storage.numel() != numel:
            raise _Refused(f"storage {key} is referenced both as {storage.numel()} {storage.dtype} and {numel} {dtype}")
        return storage

    def rebuild_tensor(self, storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None):
        """torch._utils._rebuild_tensor_v2, as a copy of a view that must lie inside the storage: the copy
        is as big as the view claims, and a file of a few hundred bytes can claim gigabytes (stride 0)."""
        if not (isinstance(storage, torch.Tensor) and id(storage) in self.storage_ids):
            what = stub_name(storage) or type(storage).__name__
            raise _Refused(f"a tensor is built from an object of type {what} instead of one of the file's storages")
        if not (isinstance(size, (tuple, list)) and isinstance(stride, (tuple, list)) and len(size) == len(stride)):
            raise _Refused("a tensor has a malformed size or stride")
        if not (_is_count(offset) and all(map(_is_count, size)) and all(map(_is_count, stride))):
            raise _Refused("a tensor has a malformed offset, size or stride")
        view = f"offset {offset}, size {list(size)}, stride {list(stride)}"
        numel = math.prod(size)
        if numel == 0:
            return torch.empty(size, dtype=storage.dtype)  # holds nothing, whatever its strides say
        if any(st == 0 and n > 1 for n, st in zip(size, stride)):
            raise _Refused(f"a tensor repeats elements of its storage ({view})")
        if offset + sum((n - 1) * st for n, st in zip(size, stride)) >= storage.numel():
            raise _Refused(f"a tensor reaches past the end of its storage of {storage.numel()} elements ({view})")
        if numel > storage.numel():  # rows that overlap, e.g. stride (1, 1)
            raise _Refused(f"a tensor has more elements than its storage's {storage.numel()} ({view})")
        self.tensor_bytes_left -= numel * storage.element_size()
        if self.tensor_bytes_left < 0:
            raise _Refused(f"its tensors add up to more than twice the file's {self.entries.file_size} bytes")
        return storage.as_strided(size, stride, offset).clone()


def read_pickled_checkpoint(file):
    """(object, names called) from a torch.save() zip file, with every non-data class stubbed. file: a path, or a
    binary file object open for reading (utils/checkpoints/ours.py passes the one it opened: one open per file).
    Raises ValueError with a short reason, one line, for anything else, hostile files included."""
    try:
        if isinstance(file, (str, os.PathLike)):
            file_size = os.path.getsize(file)
        else:
            file_size = file.seek(0, os.SEEK_END)
            file.seek(0)
        archive = zipfile.ZipFile(file)
    except zipfile.BadZipFile:
        raise ValueError("not a zip archive (torch.save() writes one since PyTorch 1.6)") from None
    except Exception as e:  # a crafted central directory trips zipfile in other ways (struct, seek, ...)
        raise ValueError(f"its zip directory is broken ({type(e).__name__}: {_one_line(e)})") from None
    try:
        with archive:
            return _read_archive(archive, _Entries(archive, file_size))
    except _Refused as e:
        raise ValueError(_one_line(e, 200)) from None
    except Exception as e:  # whatever a hostile pickle provokes (AttributeError, MemoryError, RecursionError, ...)
        raise ValueError(f"its pickle is broken ({type(e).__name__}: {_one_line(e)})") from None


def _read_archive(archive, entries):
    pickles = [n for n in archive.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(pickles) != 1:
        raise _Refused("a zip archive without the data.pkl of a torch.save() file")
    prefix = pickles[0].split("/")[0]
    byteorder = f"{prefix}/byteorder"
    if byteorder in archive.namelist() and entries.read(byteorder).strip() not in (b"little", b""):
        raise _Refused("saved on a big-endian machine, which this reader does not convert")
    with archive.open(entries.info(pickles[0])) as f:
        unpickler = _RestrictedUnpickler(f, entries, prefix)
        obj = unpickler.load()
    return obj, sorted(unpickler.calls)
