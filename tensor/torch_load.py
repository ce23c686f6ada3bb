"""Read PyTorch checkpoints (`torch.save` files: .pt, .pth, .bin) without torch.

`load_torch(path, device=None)` returns what the file holds — most often a dict of name -> Tensor, or a training
checkpoint with the tensors under "state_dict" or "model" (returned as it is: nothing is guessed) — with every tensor
rebuilt as a baregrad Tensor on `device`. Dicts, OrderedDicts, lists, tuples, sets and scalars come back as such.

The file is untrusted input. Its object tree is a pickle, and a pickle can name any Python callable: this reader
never imports or calls what the file names. A restricted unpickler answers only the names a state dict needs (torch's
tensor-rebuild functions, storage classes, dtypes, OrderedDict, a few builtins) with stand-ins written here; any other
name (`os.system`, `builtins.eval`, ...) stops the load with a TorchLoadError that names it. Before unpickling, every
opcode is checked without running it (`_check_pickle`): CPython's C unpickler trusts some counts in the stream, and
a few hundred kilobytes of hostile opcodes crash or exhaust the process there (see `_check_pickle`).

Layouts. Facts from PyTorch 2.13.0: torch/serialization.py (`_save`, `_legacy_save`, `_load`, `_legacy_load`),
torch/_utils.py (`_rebuild_tensor*`, `_rebuild_parameter*`, `_element_size`), torch/storage.py
(`_dtype_to_storage_type_map`, `_new_dtypes`), torch/_tensor.py (`_reduce_ex_internal`), torch/csrc/serialization.cpp
(`THPStorage_writeFileRaw`) and caffe2/serialize/versions.h (file format versions).

Zip, written by torch >= 1.6 by default. A zip archive whose members sit in one top folder (torch names it after the
file's stem, or "archive" when it saves to a buffer); torch's reader takes that folder from the first member's name.
  <top>/data.pkl                 the pickled object, protocol 2; each storage appears as the persistent id
                                 ('storage', storage class, key, location, numel)
  <top>/data/<key>               the storage's bytes, numel * element size, uncompressed (torch pads the local
                                 header's extra field so the data starts 64-byte aligned), in the byte order below
  <top>/byteorder                "little" or "big"; added in torch 2.1 (docs/source/notes/serialization.rst), and
                                 read as little when absent (torch's default since then)
  <top>/version or .data/version the format version, a decimal integer; torch reads 1..10 (kMin/kMaxSupported-
                                 FileFormatVersion); it writes "3"
  <top>/.format_version, .storage_alignment, .data/serialization_id   bookkeeping this reader does not need
Legacy, written with `_use_new_zipfile_serialization=False` (and by default before torch 1.6): pickles back to
back, then the storages' records.
  pickle   the magic number 0x1950a86a20f9469cfc6c
  pickle   the protocol version 1001
  pickle   sys info {"protocol_version", "little_endian", "type_sizes"}; torch reads it and ignores it
  pickle   the object; storages as ('storage', storage class, key, location, numel, view metadata); torch 2.13
           always writes None for the view metadata, and load_torch refuses anything else
  pickle   the list of storage keys, in the order of the records that follow
  records  per key: numel as an int64, then numel * element size bytes — both little-endian whatever machine wrote
           them (writeFileRaw converts)
The tar layout of the earliest torch versions is refused with a message saying so.

A tensor is pickled as a call `_rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad,
backward_hooks[, metadata])`; dtypes with a legacy storage class (FloatStorage, HalfStorage, ...) come in that class,
the dtypes torch added later (uint16/32/64, float8, ...) as `_rebuild_tensor_v3(untyped storage, ..., dtype)` with a
`torch.storage.UntypedStorage` (numel counts bytes) and a dtype global such as `torch.uint16`. Parameters wrap the
tensor in `_rebuild_parameter(tensor, requires_grad, hooks)` (`_rebuild_parameter_with_state` when the Parameter has
Python attributes, which are dropped here). Offsets, sizes and strides count elements.

Reading. Storages are read when a tensor is rebuilt, and only the bytes its view spans: the zip's stored members at
their offset in the file, the legacy records where the scan of their length prefixes found them. A compressed zip
member holding a storage is refused rather than inflated: torch never writes one, and inflating a member whose
declared size is chosen by the file is the classic zip bomb. Every tensor is checked before its bytes are read:
offset, size and stride are non-negative ints (at most MAX_NDIM dims, at most MAX_NUMEL elements and strides), and
the last element it reaches lies inside its storage — else a TorchLoadError names the tensor's key. Each tensor comes
back as its own contiguous Tensor: two tensors that shared a storage in torch are two Tensors here, with the same
values torch's views had. Big-endian zip files (byteorder "big") are converted. The `_metadata` (module versions)
that torch attaches to a state dict OrderedDict is dropped.
"""
from __future__ import annotations
import io, os, pickle, pickletools, reprlib, struct, zipfile
from collections import OrderedDict
from typing import Any
import numpy as np
from baregrad.compiler.dtype import DType, dtypes
from .tensor import Tensor, _device_arg
from .device_dtypes import require_float64
from .safetensors import MAX_NDIM, MAX_NUMEL, _is_int


class TorchLoadError(ValueError):
  pass


class _BadCall(Exception):
  """Raised by the stand-ins the unpickler calls; `_unpickle` turns it into a TorchLoadError naming the file."""


MAGIC_NUMBER = 0x1950A86A20F9469CFC6C   # torch/serialization.py MAGIC_NUMBER (torch 2.13)
LEGACY_PROTOCOL_VERSION = 1001           # torch/serialization.py PROTOCOL_VERSION
ZIP_VERSIONS = range(1, 11)              # caffe2/serialize/versions.h: kMinSupportedFileFormatVersion 0x1 .. kMax 0xA
MAX_PICKLE = 64 << 20    # bytes of one pickle; a real state dict's data.pkl is ~100 bytes a tensor
MAX_DEPTH = 64           # nesting of containers in the object, and of tuples inside the pickle (see _check_pickle)
MAX_RECORD = 64          # bytes of the small zip records (version, byteorder)
MAX_OPCODES = 10_000_000  # opcodes of one pickle: a state dict needs ~30 a tensor; each may make a ~60-byte object

# torch dtype (its name in `torch.<name>`) -> (baregrad dtype, numpy dtype of its little-endian bytes). bool is read
# as bytes and compared with 0 (a hostile byte 2 must not become a numpy bool holding 2); bfloat16 as its bits.
DTYPES: dict[str, tuple[DType, str]] = {
  "float32": (dtypes.float32, "<f4"), "float64": (dtypes.float64, "<f8"), "float16": (dtypes.float16, "<f2"),
  "bfloat16": (dtypes.bfloat16, "<u2"), "int64": (dtypes.int64, "<i8"), "int32": (dtypes.int32, "<i4"),
  "int16": (dtypes.int16, "<i2"), "int8": (dtypes.int8, "|i1"), "uint8": (dtypes.uint8, "|u1"),
  "bool": (dtypes.bool, "|u1"), "uint16": (dtypes.uint16, "<u2"), "uint32": (dtypes.uint32, "<u4"),
  "uint64": (dtypes.uint64, "<u8"),
}
# torch dtypes baregrad has no dtype for, with their element size in bytes (torch/_utils.py `_element_size`): a
# tensor of one is refused by name, and a legacy file's records of that type can still be stepped over.
OTHER_DTYPES: dict[str, int] = {
  "complex32": 4, "complex64": 8, "complex128": 16, "qint8": 1, "quint8": 1, "qint32": 4, "quint4x2": 1,
  "quint2x4": 1, "float8_e5m2": 1, "float8_e4m3fn": 1, "float8_e5m2fnuz": 1, "float8_e4m3fnuz": 1,
  "float8_e8m0fnu": 1, "float4_e2m1fn_x2": 1, "bits8": 1, "bits16": 2, "bits1x8": 1, "bits2x4": 1, "bits4x2": 1,
}
# legacy storage class -> the dtype of its elements (torch/storage.py `_dtype_to_storage_type_map`, torch 2.13)
STORAGE_CLASSES: dict[str, str] = {
  "DoubleStorage": "float64", "FloatStorage": "float32", "HalfStorage": "float16", "LongStorage": "int64",
  "IntStorage": "int32", "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8",
  "BoolStorage": "bool", "BFloat16Storage": "bfloat16", "ComplexDoubleStorage": "complex128",
  "ComplexFloatStorage": "complex64", "QInt8Storage": "qint8", "QInt32Storage": "qint32", "QUInt8Storage": "quint8",
  "QUInt4x2Storage": "quint4x2", "QUInt2x4Storage": "quint2x4",
}


class _ShortRepr(reprlib.Repr):
  """Values from the file, quoted in messages, cut to a readable length (limits as in safetensors.py). Python 3.11
  refuses to print an int of more than 4300 digits, and a pickle can hold one: such ints are shown by their size."""
  def __init__(self):
    super().__init__()
    self.maxstring = self.maxother = 80
    self.maxlist, self.maxtuple, self.maxdict, self.maxlevel = 8, 8, 4, 3
  def repr_int(self, x, level):
    return f"<an int of {x.bit_length()} bits>" if x.bit_length() > 256 else super().repr_int(x, level)
  def repr_bytes(self, x, level):   # repr of the first bytes only: the whole of a 64 MiB bytes would be 256 MiB
    return repr(x[:self.maxother]) + ("..." if len(x) > self.maxother else "")
  repr_bytearray = repr_bytes


_short = _ShortRepr().repr


def _itemsize(dtype_name: str) -> int:
  return DTYPES[dtype_name][0].itemsize if dtype_name in DTYPES else OTHER_DTYPES[dtype_name]


# ---------------- checking a pickle before it runs ----------------

_KEY_OPS = {"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8",
            "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "NONE", "NEWTRUE", "NEWFALSE"}
_INT_OPS = {"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4"}
_SMALL_INT = 1 << 60   # an int below this in magnitude hashes to itself (CPython hashes ints mod 2**61 - 1)


def _check_pickle(stream, what: str) -> int:
  """Walk the opcodes of the pickle at the stream's position without running them (pickletools.genops); return its
  length in bytes. Refuses what CPython 3.11's C unpickler would turn into a crash, a huge allocation or a hang:
  - tuples nested deeper than MAX_DEPTH: hashing one (as a dict key) recurses once per level with no depth check,
    and ~200k levels (a 200 KB pickle) overflow the C stack;
  - a memo index beyond the next free one: the unpickler grows its memo array to twice the index, so one
    LONG_BINPUT 2**30 costs 16 GiB (picklers number memo entries 0, 1, 2, ...);
  - dict keys and set items other than strings, bytes, None, bools and ints below 2**60: floats, big ints and tuples
    can be chosen to share one hash, which makes inserting n of them take n**2 steps (state dicts key by str or int);
  - EXT1/2/4, which fetch a global from the copyreg registry, a path that may skip find_class;
  - a length field that runs past the data (genops reads every argument, so the unpickler never trusts one).
  The stack is simulated with, per item, (may it be a dict key, its tuple nesting depth); an opcode not handled by
  name pops and pushes what pickletools documents, and what it pushes gets the deepest depth it popped."""
  start = stream.tell()
  stack: list[tuple[bool, int]] = []
  marks: list[int] = []
  memo: dict[int, tuple[bool, int]] = {}

  def fail(msg: str): raise TorchLoadError(f"{what}: {msg}")

  def pop(n: int) -> list:
    if len(stack) - n < (marks[-1] if marks else 0): fail("the pickle pops more than its stack holds (malformed)")
    out = stack[len(stack) - n:]
    del stack[len(stack) - n:]
    return out

  def pop_mark() -> list:
    if not marks: fail("the pickle uses a mark it never set (malformed)")
    at = marks.pop()
    out = stack[at:]
    del stack[at:]
    return out

  def check_keys(items, op: str):
    for may_be_key, _ in items:
      if not may_be_key:
        fail(f"{op} uses a key or set item that is not a string, bytes, None, a bool or an int below 2**60; "
             f"checkpoint dicts key by name or index, and other keys can be chosen to collide (the file may be "
             f"malicious and is not loaded)")

  def push_tuple(items):
    depth = 1 + max((d for _, d in items), default=0)
    if depth > MAX_DEPTH: fail(f"tuples are nested more than {MAX_DEPTH} deep (a real checkpoint nests a few)")
    stack.append((False, depth))

  try:
    for count, (op, arg, _) in enumerate(pickletools.genops(stream)):
      name = op.name
      if count >= MAX_OPCODES: fail(f"the pickle has more than {MAX_OPCODES} opcodes")
      if name in ("EXT1", "EXT2", "EXT4"):
        fail(f"opcode {name} loads a global from the copyreg extension registry, which a checkpoint never uses")
      elif name in ("PROTO", "FRAME"): pass
      elif name == "STOP":
        pop(1)
        break
      elif name == "MARK": marks.append(len(stack))
      elif name in _KEY_OPS: stack.append((True, 0))
      elif name in _INT_OPS: stack.append((isinstance(arg, int) and abs(arg) < _SMALL_INT, 0))
      elif name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
        index = len(memo) if name == "MEMOIZE" else arg
        if not _is_int(index) or not 0 <= index <= len(memo):
          fail(f"memo index {_short(index)} skips past the next free entry {len(memo)} (the file may be malicious)")
        if len(stack) <= (marks[-1] if marks else 0): fail("the pickle memoizes an empty stack (malformed)")
        memo[index] = stack[-1]
      elif name in ("GET", "BINGET", "LONG_BINGET"):
        if arg not in memo: fail(f"the pickle reads memo entry {_short(arg)}, which it never stored (malformed)")
        stack.append(memo[arg])
      elif name == "DUP": stack.append(pop(1)[0]); stack.append(stack[-1])
      elif name == "POP":
        if marks and len(stack) == marks[-1]: marks.pop()    # the unpickler's POP drops a mark when it is on top
        else: pop(1)
      elif name == "POP_MARK": pop_mark()
      elif name == "EMPTY_TUPLE": push_tuple([])
      elif name in ("TUPLE1", "TUPLE2", "TUPLE3"): push_tuple(pop(int(name[-1])))
      elif name == "TUPLE": push_tuple(pop_mark())
      elif name == "SETITEM":
        key, value = pop(2)
        check_keys([key], name)
        target = pop(1)[0]
        stack.append((False, max(target[1], value[1])))
      elif name in ("SETITEMS", "DICT", "ADDITEMS", "FROZENSET"):
        items = pop_mark()
        check_keys(items if name in ("ADDITEMS", "FROZENSET") else items[0::2], name)
        below = pop(1) if name in ("SETITEMS", "ADDITEMS") else []
        stack.append((False, max((d for _, d in items + below), default=0)))
      else:   # the opcode's documented stack effect
        before = op.stack_before
        if pickletools.markobject in before:
          popped = pop_mark() + pop(before.index(pickletools.markobject))
        else: popped = pop(len(before))
        depth = max((d for _, d in popped), default=0)
        stack.extend((False, depth) for _ in op.stack_after)
    else: fail("the pickle ends without a STOP opcode")
  except TorchLoadError: raise
  except (ValueError, EOFError, struct.error, OverflowError, IndexError, KeyError, TypeError) as e:
    fail(f"not a valid pickle ({_short(str(e))})")
  return stream.tell() - start


# ---------------- the restricted unpickler ----------------

class _Frozen:
  """Base of the stand-ins below: the pickle may not set their attributes (BUILD)."""
  __slots__ = ()
  def __setstate__(self, state):
    raise _BadCall(f"the pickle sets attributes on a {type(self).__name__.strip('_')} (the file may be malicious)")


class _DType(_Frozen):
  """A dtype global, `torch.float32`: the name of a torch dtype."""
  __slots__ = ("name",)
  def __init__(self, name: str): self.name = name


class _StorageClass(_Frozen):
  """A storage class global (`torch.FloatStorage`, `torch.storage.UntypedStorage`) and the dtype it holds."""
  __slots__ = ("name", "dtype")
  def __init__(self, name: str, dtype: str): self.name, self.dtype = name, dtype


class _Storage(_Frozen):
  """One storage of the file, from its persistent id: `numel` elements of `dtype` under `key`."""
  __slots__ = ("key", "dtype", "numel")
  def __init__(self, key: str, dtype: str, numel: int): self.key, self.dtype, self.numel = key, dtype, numel
  @property
  def nbytes(self) -> int: return self.numel * _itemsize(self.dtype)


class _TensorRef(_Frozen):
  """A `_rebuild_tensor*` call, kept unchecked until the key it sits under is known (`_Builder.tensor`)."""
  __slots__ = ("storage", "offset", "size", "stride", "dtype", "metadata")
  def __init__(self, storage, offset, size, stride, dtype=None, metadata=None):
    self.storage, self.offset, self.size, self.stride, self.dtype, self.metadata = \
      storage, offset, size, stride, dtype, metadata


class _StateDict(dict):
  """collections.OrderedDict as pickles build it: `OrderedDict()` and then items, or (Python 2) `OrderedDict(pairs)`.
  The state BUILD gives it (torch's `_metadata` of module versions) is dropped."""
  def __init__(self, *args):
    super().__init__()
    if not args: return
    pairs = args[0]
    if len(args) > 1 or not isinstance(pairs, list) or \
       not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in pairs):
      raise _BadCall(f"OrderedDict is called with {_short(args)}; a pickle passes nothing or a list of pairs")
    _check_hashable([k for k, _ in pairs], "an OrderedDict's keys")
    for k, v in pairs: self[k] = v
  def __setstate__(self, state): pass


def _check_hashable(items, what: str):
  for x in items:
    if not (x is None or isinstance(x, (str, bytes, bool)) or (isinstance(x, int) and abs(x) < _SMALL_INT)):
      raise _BadCall(f"{what} include a {type(x).__name__}; only strings, bytes, None, bools and small ints "
                     f"are accepted (see _check_pickle)")


class _Callable(_Frozen):
  """A function the pickle may call. Handing out the function itself would let BUILD set its attributes
  (`__defaults__` included) for the rest of the process."""
  __slots__ = ("function",)
  def __init__(self, function): self.function = function
  def __call__(self, *args): return self.function(*args)


def _rebuild_call(name: str, counts: tuple[int, ...]):
  def call(*args):
    if len(args) not in counts:
      raise _BadCall(f"torch._utils.{name} is called with {len(args)} arguments, not {' or '.join(map(str, counts))}")
    return args
  return call


def _rebuild_tensor(*args):      # (storage, storage_offset, size, stride): what older torch versions wrote
  return _TensorRef(*_rebuild_call("_rebuild_tensor", (4,))(*args))


def _rebuild_tensor_v2(*args):   # (storage, offset, size, stride, requires_grad, backward_hooks[, metadata])
  storage, offset, size, stride, _, _, *metadata = _rebuild_call("_rebuild_tensor_v2", (6, 7))(*args)
  return _TensorRef(storage, offset, size, stride, None, metadata[0] if metadata else None)


def _rebuild_tensor_v3(*args):   # (untyped storage, offset, size, stride, requires_grad, hooks, dtype[, metadata])
  storage, offset, size, stride, _, _, dtype, *metadata = _rebuild_call("_rebuild_tensor_v3", (7, 8))(*args)
  if not isinstance(dtype, _DType): raise _BadCall(f"_rebuild_tensor_v3's dtype is {_short(dtype)}, not a torch dtype")
  return _TensorRef(storage, offset, size, stride, dtype.name, metadata[0] if metadata else None)


def _rebuild_parameter(*args):   # (tensor, requires_grad, backward_hooks[, state]): the Parameter is its tensor here
  data = _rebuild_call("_rebuild_parameter", (3, 4))(*args)[0]
  if not isinstance(data, _TensorRef): raise _BadCall(f"a Parameter wraps {type(data).__name__}, not a tensor")
  return data


def _set(items=()):
  if not isinstance(items, (list, tuple)): raise _BadCall(f"set() is called with a {type(items).__name__}")
  _check_hashable(items, "a set's items")
  return set(items)


def _frozenset(items=()): return frozenset(_set(items))


def _bytes(*args):               # Python pickles b"" at protocol 2 as bytes(); bytes(n) would allocate n bytes
  if args: raise _BadCall("bytes() is called with arguments; a pickle calls it only for b''")
  return b""


def _bytearray(data=b""):
  if not isinstance(data, bytes): raise _BadCall(f"bytearray() is called with a {type(data).__name__}, not bytes")
  return bytearray(data)


def _encode(text, encoding):     # _codecs.encode(str, "latin1"): how protocol 2 spells bytes
  if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
    raise _BadCall(f"_codecs.encode is called with ({_short(text)}, {_short(encoding)}), not (str, 'latin1')")
  return text.encode("latin1")


def _size(dims=()):              # torch.Size(tuple): a shape
  if not isinstance(dims, (list, tuple)) or not all(_is_int(d) for d in dims):
    raise _BadCall(f"torch.Size is called with {_short(dims)}, not a tuple of ints")
  return tuple(dims)


_UNTYPED = _StorageClass("UntypedStorage", "uint8")   # its numel counts bytes
# complex is the type itself (protocol 2 may build it with NEWOBJ, which needs a type; BUILD cannot change a builtin
# type), OrderedDict a class whose __setstate__ takes BUILD; every other callable is wrapped in _Callable.
_BUILTINS = {"set": _Callable(_set), "frozenset": _Callable(_frozenset), "bytes": _Callable(_bytes),
             "bytearray": _Callable(_bytearray), "complex": complex}
_GLOBALS: dict[tuple[str, str], Any] = {
  ("collections", "OrderedDict"): _StateDict, ("_codecs", "encode"): _Callable(_encode),
  ("torch", "Size"): _Callable(_size),
  ("torch._utils", "_rebuild_tensor"): _Callable(_rebuild_tensor),
  ("torch._utils", "_rebuild_tensor_v2"): _Callable(_rebuild_tensor_v2),
  ("torch._utils", "_rebuild_tensor_v3"): _Callable(_rebuild_tensor_v3),
  ("torch._utils", "_rebuild_parameter"): _Callable(_rebuild_parameter),
  ("torch._utils", "_rebuild_parameter_with_state"): _Callable(_rebuild_parameter),
  ("torch", "UntypedStorage"): _UNTYPED, ("torch.storage", "UntypedStorage"): _UNTYPED,
  **{(module, name): f for module in ("builtins", "__builtin__") for name, f in _BUILTINS.items()},  # protocol 2
  **{(module, name): _StorageClass(name, dt)
     for module in ("torch", "torch.cuda") for name, dt in STORAGE_CLASSES.items()},
  **{("torch", name): _DType(name) for name in (*DTYPES, *OTHER_DTYPES)},
}
# torch objects that are not plain dense tensors: named in the refusal, so a user knows what the file holds
# (torch._utils; _rebuild_from_type_v2 is in torch._tensor, once torch.tensor — serialization.py load_module_mapping)
_UNSUPPORTED_TORCH = {
  "_rebuild_qtensor": "a quantized tensor", "_rebuild_sparse_tensor": "a sparse tensor",
  "_rebuild_nested_tensor": "a nested tensor", "_rebuild_from_type_v2": "a tensor subclass or a tensor with attributes",
  "_rebuild_wrapper_subclass": "a tensor subclass", "_rebuild_meta_tensor_no_storage": "a meta tensor",
  "_rebuild_device_tensor_from_cpu_tensor": "a tensor of a storage-less device",
}


class _Unpickler(pickle.Unpickler):
  """Rebuilds only what a state dict holds; `legacy` selects the 6-field persistent ids of the legacy layout."""

  def __init__(self, data: bytes, what: str, legacy: bool, storages: dict[str, _Storage]):
    super().__init__(io.BytesIO(data), encoding="utf-8")   # Python 2 str as UTF-8, as torch.load does
    self.what, self.legacy, self.storages = what, legacy, storages

  def find_class(self, module, name):
    if (module, name) in _GLOBALS: return _GLOBALS[module, name]
    kind = _UNSUPPORTED_TORCH.get(name) if module in ("torch._utils", "torch._tensor", "torch.tensor") else None
    if kind is not None:
      raise TorchLoadError(f"{self.what}: the pickle calls {module}.{name} ({kind}); load_torch reads dense tensors "
                           f"only, so the file is not loaded")
    raise TorchLoadError(f"{self.what}: the pickle asks for the global {_short(f'{module}.{name}')}, which a state "
                         f"dict never needs: the file may be malicious and is not loaded (load_torch rebuilds only "
                         f"tensors, storages, dtypes and plain containers, and runs nothing from the file)")

  def persistent_load(self, pid):
    fields = 6 if self.legacy else 5
    if not isinstance(pid, tuple) or not pid:
      raise TorchLoadError(f"{self.what}: persistent id {_short(pid)} is not a tuple")
    kind = pid[0].decode("ascii", "replace") if isinstance(pid[0], bytes) else pid[0]   # Python 2 files: bytes
    if kind == "module" and self.legacy:
      raise TorchLoadError(f"{self.what}: the file pickles a whole nn.Module (torch.save(model)); load_torch reads "
                           f"tensors: save model.state_dict() instead")
    if kind != "storage" or len(pid) != fields:
      raise TorchLoadError(f"{self.what}: persistent id {_short(pid)} is not ('storage', ...) with {fields} fields")
    storage_class, key, location, numel = pid[1:5]
    where = f"storage {_short(key)}"
    if not isinstance(storage_class, _StorageClass):
      raise TorchLoadError(f"{self.what}: {where}: storage type {_short(storage_class)} is not a storage class")
    if not isinstance(key, str) or not 0 < len(key) <= 256:
      raise TorchLoadError(f"{self.what}: storage key {_short(key)} is not a string of 1 to 256 characters")
    if not isinstance(location, (str, bytes)):
      raise TorchLoadError(f"{self.what}: {where}: location {_short(location)} is not a string")
    if not _is_int(numel) or not 0 <= numel <= MAX_NUMEL:
      raise TorchLoadError(f"{self.what}: {where}: numel {_short(numel)} is not an int in [0, {MAX_NUMEL}]")
    if self.legacy and pid[5] is not None:
      raise TorchLoadError(f"{self.what}: {where} is a view of another storage ({_short(pid[5])}), which only early "
                           f"torch versions wrote; load and re-save the file with torch")
    storage = self.storages.setdefault(key, _Storage(key, storage_class.dtype, numel))
    if (storage.dtype, storage.numel) != (storage_class.dtype, numel):
      raise TorchLoadError(f"{self.what}: {where} is named as {storage.numel} {storage.dtype} and as {numel} "
                           f"{storage_class.dtype} elements (torch.save refuses to save one storage as two types)")
    return storage


def _unpickle(data: bytes, what: str, legacy: bool, storages: dict, checked: bool = False) -> Any:
  """The object of the pickle `data`, which _check_pickle passes first (unless the caller `checked` it)."""
  if not checked and (length := _check_pickle(io.BytesIO(data), what)) != len(data):
    raise TorchLoadError(f"{what}: {len(data) - length} bytes follow the pickle's STOP opcode")
  try: return _Unpickler(data, what, legacy, storages).load()
  except TorchLoadError: raise
  except _BadCall as e: raise TorchLoadError(f"{what}: {e}") from None
  except Exception as e:   # anything else the unpickler raises on this input means it is not a valid checkpoint pickle
    raise TorchLoadError(f"{what}: cannot unpickle ({type(e).__name__}: {_short(str(e))})") from None


# ---------------- where storages are ----------------

def _zip_layout(f, file_size: int, source: str):
  """Check the zip archive `f`; return (data.pkl bytes, little_endian, {storage key: zipfile.ZipInfo})."""
  def fail(msg: str): raise TorchLoadError(f"{source}: {msg}")
  try:
    archive = zipfile.ZipFile(f)
    infos = archive.infolist()
  except Exception as e:   # zipfile raises BadZipFile, but also struct.error, ValueError, ... on a damaged directory
    fail(f"not a readable zip archive ({type(e).__name__}: {_short(str(e))}); the file is truncated or corrupt")
  names = [i.filename for i in infos]
  if not names: fail("the zip archive is empty")
  seen: set[str] = set()
  for n in names:
    if n in seen: fail(f"the zip archive holds {_short(n)} twice (ambiguous)")
    seen.add(n)
  top = names[0].split("/")[0]
  if "/" not in names[0]: fail(f"the first member {_short(names[0])} is not in a folder, as torch.save's members are")
  members = {n[len(top) + 1:]: i for n, i in zip(names, infos) if n.startswith(top + "/")}

  def record(name: str, limit: int) -> bytes:
    info = members[name]
    if info.file_size > limit:
      fail(f"{_short(top + '/' + name)} is {info.file_size} bytes, more than the {limit} allowed")
    try:
      with archive.open(info) as member: return member.read(limit + 1)
    except Exception as e:
      fail(f"cannot read {_short(top + '/' + name)} ({type(e).__name__}: {_short(str(e))}); the archive is corrupt")

  if "data.pkl" not in members:
    if "constants.pkl" in members or any(n.startswith("code/") for n in members):
      fail("this is a TorchScript archive (torch.jit.save); load_torch reads torch.save files")
    fail(f"the archive has no {_short(top + '/data.pkl')}: not a torch.save checkpoint")
  version_name = next((n for n in ("version", ".data/version") if n in members), None)
  if version_name is None: fail(f"the archive has no {_short(top + '/version')} record, which torch.save always writes")
  version = record(version_name, MAX_RECORD).strip()
  if not version.isdigit() or int(version) not in ZIP_VERSIONS:
    fail(f"format version {_short(version)} is not one torch reads ({ZIP_VERSIONS.start}..{ZIP_VERSIONS.stop - 1})")
  byteorder = record("byteorder", MAX_RECORD) if "byteorder" in members else b"little"
  if byteorder not in (b"little", b"big"): fail(f"byteorder record {_short(byteorder)} is neither 'little' nor 'big'")
  storages = {n[len("data/"):]: i for n, i in members.items() if n.startswith("data/")}
  return record("data.pkl", MAX_PICKLE), byteorder == b"little", storages


def _zip_data_start(f, info: zipfile.ZipInfo, storage: _Storage, file_size: int) -> int:
  """Offset in the file of a stored member's bytes, after checking the member against its storage."""
  name = _short(info.filename)
  if info.flag_bits & 0x1: raise TorchLoadError(f"member {name} is encrypted")
  if info.compress_type != zipfile.ZIP_STORED:
    raise TorchLoadError(f"member {name} is compressed (zip method {info.compress_type}): torch stores storages "
                         f"uncompressed, and load_torch reads them in place; re-save the file with torch.save")
  if info.file_size != storage.nbytes or info.compress_size != info.file_size:
    raise TorchLoadError(f"member {name} holds {info.file_size} bytes, but the pickle declares {storage.numel} "
                         f"{storage.dtype} elements ({storage.nbytes} bytes)")
  # local file header (PKWARE APPNOTE 4.3.7): signature, ..., name length at 26, extra length at 28, 30 bytes
  f.seek(info.header_offset)
  header = f.read(30)
  if len(header) != 30 or header[:4] != b"PK\x03\x04":
    raise TorchLoadError(f"member {name}: no local file header at offset {info.header_offset}")
  name_len, extra_len = struct.unpack("<HH", header[26:30])
  local_name = f.read(name_len)
  if local_name.decode("utf-8" if info.flag_bits & 0x800 else "cp437", "replace") != info.orig_filename:
    raise TorchLoadError(f"member {name}: its local header names {_short(local_name)} (the archive is corrupt)")
  start = info.header_offset + 30 + name_len + extra_len
  if start + info.file_size > file_size:
    raise TorchLoadError(f"member {name}: its {info.file_size} bytes at offset {start} run past the end of the "
                         f"{file_size}-byte file (truncated)")
  return start


class _Window:
  """A read-only view of f[start:stop) for pickletools.genops; reads stop at the window's end."""
  def __init__(self, f, start: int, stop: int): self.f, self.pos, self.stop = f, start, stop
  def tell(self) -> int: return self.pos
  def read(self, n: int = -1) -> bytes:
    n = self.stop - self.pos if n is None or n < 0 else min(n, self.stop - self.pos)
    self.f.seek(self.pos)
    data = self.f.read(n)
    self.pos += len(data)
    return data
  def readline(self) -> bytes:
    self.f.seek(self.pos)
    data = self.f.readline(self.stop - self.pos)
    self.pos += len(data)
    return data


def _legacy_layout(f, file_size: int, source: str):
  """Read the legacy layout's pickles and find its storage records; return (object, {key: file offset of the
  storage's bytes})."""
  pos, storages = 0, {}

  def next_pickle(what: str, named: bool = True) -> Any:
    nonlocal pos
    what = f"{source}: {what}" if named else what
    length = _check_pickle(_Window(f, pos, min(file_size, pos + MAX_PICKLE)), what)
    f.seek(pos)
    data = f.read(length)
    pos += length
    return _unpickle(data, what, True, storages, checked=True)

  try: magic = next_pickle("its first pickle", named=False)
  except TorchLoadError as e:   # say first what the file is not, then why the pickle failed
    raise TorchLoadError(f"{source}: not a PyTorch checkpoint: it does not start with a zip header (PK\\x03\\x04), "
                         f"and it is not a legacy torch.save stream either ({e})") from None
  if magic != MAGIC_NUMBER:
    raise TorchLoadError(f"{source}: the first pickle is {_short(magic)}, not the magic number {MAGIC_NUMBER:#x} of a "
                         f"legacy torch.save file")
  version = next_pickle("the protocol version")
  if version != LEGACY_PROTOCOL_VERSION:
    raise TorchLoadError(f"{source}: legacy protocol version {_short(version)} is not {LEGACY_PROTOCOL_VERSION}")
  if not isinstance(next_pickle("the sys info"), dict): raise TorchLoadError(f"{source}: the sys info is not a dict")
  obj = next_pickle("the object")
  keys = next_pickle("the list of storage keys")
  if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
    raise TorchLoadError(f"{source}: the list of storage keys is {_short(keys)}, not a list of strings")
  offsets = {}
  for key in keys:
    where = f"{source}: storage {_short(key)}"
    if key in offsets: raise TorchLoadError(f"{where} is listed twice")
    if key not in storages: raise TorchLoadError(f"{where} is listed but no tensor uses it")
    storage = storages[key]
    f.seek(pos)
    head = f.read(8)
    if len(head) != 8:
      raise TorchLoadError(f"{where}: the file ends at byte {pos + len(head)}, before its element count")
    (count,) = struct.unpack("<q", head)
    if count != storage.numel:
      raise TorchLoadError(f"{where}: the record holds {count} elements, the pickle declares {storage.numel}")
    if pos + 8 + storage.nbytes > file_size:
      raise TorchLoadError(f"{where}: its {storage.nbytes} bytes at offset {pos + 8} run past the end of the "
                           f"{file_size}-byte file (truncated)")
    offsets[key] = pos + 8
    pos += 8 + storage.nbytes
  if missing := [k for k in storages if k not in offsets]:
    raise TorchLoadError(f"{source}: storage {_short(missing[0])} is used by a tensor but has no record")
  if pos != file_size: raise TorchLoadError(f"{source}: {file_size - pos} bytes follow the last storage record")
  return obj, offsets


# ---------------- rebuilding tensors and containers ----------------

def _where(path: tuple) -> str:
  """A key path as a user would index it: 'fc.weight', or ['state_dict']['fc.weight'], long paths cut in the middle."""
  if not path: return "at the top level"
  if len(path) == 1 and isinstance(path[0], str): return _short(path[0])
  parts = [f"[{_short(k)}]" for k in path]
  return "".join(parts if len(parts) <= 8 else parts[:4] + ["..."] + parts[-3:])


class _Builder:
  """Walks the unpickled object, turning each _TensorRef into a Tensor (reading its bytes then) and stand-ins into
  plain containers. Shared objects stay shared; a container holding itself is refused."""

  def __init__(self, f, source: str, device, little_endian: bool, data_start):
    self.f, self.source, self.device, self.little = f, source, device, little_endian
    self.data_start = data_start            # _Storage -> file offset of its bytes
    self.done: dict[int, Any] = {}          # id(object) -> what it became
    self.busy: set[int] = set()
    self.tensors: list[Tensor] = []

  def fail(self, path: tuple, msg: str, label: str = "entry"):
    raise TorchLoadError(f"{self.source}: {label} {_where(path)}: {msg}")

  def build(self, obj, path: tuple = ()) -> Any:
    if obj is None or isinstance(obj, (bool, int, float, complex, str, bytes, bytearray)): return obj
    if id(obj) in self.done: return self.done[id(obj)]
    if id(obj) in self.busy: self.fail(path, "the object contains itself (a cycle), which no checkpoint does")
    if len(path) > MAX_DEPTH: self.fail(path, f"the object is nested more than {MAX_DEPTH} deep")
    self.busy.add(id(obj))
    if isinstance(obj, _TensorRef): out = self.tensor(obj, path)
    elif isinstance(obj, _DType):
      if obj.name not in DTYPES: self.fail(path, f"dtype torch.{obj.name} has no baregrad dtype")
      out = DTYPES[obj.name][0]
    elif type(obj) in (dict, _StateDict):
      out = (dict if type(obj) is dict else OrderedDict)((k, self.build(v, path + (k,))) for k, v in obj.items())
    elif type(obj) in (list, tuple):
      out = type(obj)(self.build(v, path + (i,)) for i, v in enumerate(obj))
    elif type(obj) in (set, frozenset): out = obj   # items are strings, bytes and small ints (_set)
    else:
      what = {_Storage: "a bare storage", _StorageClass: "a storage class"}.get(type(obj), f"a {type(obj).__name__}")
      self.fail(path, f"{what} stands where load_torch expects a tensor, a container or a scalar")
    self.busy.discard(id(obj))
    self.done[id(obj)] = out
    return out

  def tensor(self, ref: _TensorRef, path: tuple) -> Tensor:
    def fail(msg: str): self.fail(path, msg, "tensor")
    storage = ref.storage
    if not isinstance(storage, _Storage): fail(f"its storage is {_short(storage)}, not a storage of the file")
    dtype = ref.dtype if ref.dtype is not None else storage.dtype
    if ref.dtype is not None and storage.dtype != "uint8":
      fail(f"_rebuild_tensor_v3 takes an untyped storage, got a {storage.dtype} one")
    if dtype not in DTYPES:
      fail(f"dtype torch.{dtype} has no baregrad dtype (load_torch reads {', '.join(DTYPES)})")
    if ref.metadata:
      fail(f"it carries metadata {_short(ref.metadata)} (a conjugate or negative view), which load_torch does not "
           f"apply; save t.resolve_conj().resolve_neg() instead")
    offset, size, stride = ref.offset, ref.size, ref.stride
    if not _is_int(offset) or not 0 <= offset <= MAX_NUMEL:
      fail(f"storage offset {_short(offset)} is not an int in [0, {MAX_NUMEL}]")
    for field, dims in (("size", size), ("stride", stride)):
      if not isinstance(dims, (tuple, list)) or not all(_is_int(d) and 0 <= d <= MAX_NUMEL for d in dims):
        fail(f"{field} {_short(dims)} is not a tuple of ints in [0, {MAX_NUMEL}]")
    if len(size) != len(stride): fail(f"size {_short(size)} and stride {_short(stride)} have different lengths")
    if len(size) > MAX_NDIM: fail(f"size has {len(size)} dimensions, more than the {MAX_NDIM} allowed")
    count = 1   # the non-zero dims multiply to at most MAX_NUMEL even when a 0 empties the tensor (safetensors.py)
    for s in size:
      count *= max(s, 1)
      if count > MAX_NUMEL: fail(f"size {_short(size)}: its non-zero dims multiply to more than {MAX_NUMEL} elements")
    numel = count if all(size) else 0
    bg_dtype, np_code = DTYPES[dtype]
    itemsize = bg_dtype.itemsize
    np_dtype = np.dtype(np_code if self.little else np.dtype(np_code).newbyteorder(">"))
    if numel == 0: host = np.zeros(size, dtype=np_dtype.newbyteorder("="))
    else:
      last = offset + sum((s - 1) * st for s, st in zip(size, stride))   # the farthest element the view reaches
      if (last + 1) * itemsize > storage.nbytes:
        fail(f"storage offset {offset}, size {_short(size)} and stride {_short(stride)} reach element {last} of "
             f"storage {_short(storage.key)}, which holds {storage.nbytes // itemsize} {dtype} elements "
             f"({storage.nbytes} bytes): the file is corrupt or hostile")
      span = (last + 1 - offset) * itemsize
      self.f.seek(self.data_start(storage, path) + offset * itemsize)
      raw = self.f.read(span)
      if len(raw) != span: fail(f"the file ends inside storage {_short(storage.key)} (truncated)")
      flat = np.frombuffer(raw, dtype=np_dtype)
      strides = [st * itemsize for st in stride]
      host = np.lib.stride_tricks.as_strided(flat, shape=size, strides=strides, writeable=False)
      host = np.array(host, dtype=np_dtype.newbyteorder("="))   # a contiguous copy in native byte order
    if bg_dtype is dtypes.bool: host = host != 0
    if bg_dtype is dtypes.float64:
      require_float64(self.device, f"load_torch: tensor {_where(path)} is float64 (load the file on CPU, device='CPU', "
                                   f"and cast it to float32 there)")
    if bg_dtype is dtypes.bfloat16: t = Tensor(host, dtype=dtypes.uint16, device=self.device).bitcast(dtypes.bfloat16)
    else: t = Tensor(host, dtype=bg_dtype, device=self.device)
    self.tensors.append(t)
    return t


def load_torch(path, device=None) -> Any:
  """The object a `torch.save` file holds (zip or legacy layout), its tensors realized as baregrad Tensors on `device`
  (default: the default device). A state dict comes back as a dict (OrderedDict) of name -> Tensor; a checkpoint that
  nests it (under "state_dict", "model", ...) comes back nested as it is. Raises TorchLoadError for anything that is
  not a well-formed checkpoint of dense tensors, or that asks to run code."""
  source, dev = os.fspath(path), _device_arg(device)
  try: f = open(path, "rb")
  except OSError as e: raise TorchLoadError(f"{source}: cannot read ({e.strerror})") from None
  with f:
    file_size = os.fstat(f.fileno()).st_size
    head = f.read(512)
    f.seek(0)
    if head[:4] == b"PK\x03\x04":     # torch's own test for the zip layout (serialization.py `_is_zipfile`)
      data, little, members = _zip_layout(f, file_size, source)
      storages: dict[str, _Storage] = {}
      obj = _unpickle(data, f"{source}: data.pkl", False, storages)
      starts: dict[str, int] = {}

      def data_start(storage: _Storage, tensor_path: tuple) -> int:
        if storage.key not in starts:
          if storage.key not in members:
            raise TorchLoadError(f"{source}: tensor {_where(tensor_path)}: its storage {_short(storage.key)} has no "
                                 f"member {_short('data/' + storage.key)} in the archive")
          try: starts[storage.key] = _zip_data_start(f, members[storage.key], storage, file_size)
          except TorchLoadError as e: raise TorchLoadError(f"{source}: tensor {_where(tensor_path)}: {e}") from None
        return starts[storage.key]
    elif head[257:262] == b"ustar":   # tar header magic (POSIX ustar): torch's first layout, a tar of pickles
      raise TorchLoadError(f"{source}: a tar checkpoint (the layout of the earliest torch versions), which load_torch "
                           f"does not read; load and re-save it with torch")
    else:
      obj, offsets = _legacy_layout(f, file_size, source)
      little = True

      def data_start(storage: _Storage, tensor_path: tuple) -> int: return offsets[storage.key]
    builder = _Builder(f, source, dev, little, data_start)
    out = builder.build(obj)
  if builder.tensors: Tensor.realize(*builder.tensors)
  return out


__all__ = ["TorchLoadError", "load_torch"]
