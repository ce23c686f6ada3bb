"""ggml's tensor types: their block sizes, the byte layout of each quantized block, and two dequantizations.

A ggml tensor of a quantized type is a sequence of blocks, each holding `block_size` consecutive elements of a row
(ggml's ne[0], the innermost dimension, is a multiple of it) in `type_size` bytes: one or two float16 scales and
packed integer quants. Rows follow each other, so the blocks in file order dequantize to the elements in C order
of the numpy shape (ggml's ne reversed).

Two dequantizations of the same layouts:
- `dequantize_numpy(raw, type, shape)`: on the host, for checks and as a fallback.
- `dequantize(raw_tensor, type, shape)`: a lazy Tensor composition over a uint8 Tensor holding the blocks, built
  only from movement ops, bit ops, casts and arithmetic. Nothing runs when it is built: the scheduler fuses the
  elementwise graph into the kernel that consumes it, so a matmul reads the quantized bytes and no dequantized
  copy of the weight is ever stored.

Both compute in float32 with the same operations in the same order as ggml's reference `dequantize_row_*`
(ggml-quants.c): a product of a float32 scale and a small integer, or `(d * sc) * q - (dmin * m)` for the K-quants.
Each operation is one float32 rounding, so both agree with ggml (and gguf-py's `gguf.quants.dequantize`) exactly.
"""
from __future__ import annotations
import math
from dataclasses import dataclass
import numpy as np
from baregrad.compiler.dtype import dtypes
from .tensor import Tensor


class GGMLTypeError(ValueError):
  pass


@dataclass(frozen=True)
class GGMLType:
  name: str
  id: int
  block_size: int   # elements per block
  type_size: int    # bytes per block


# id -> (name, elements per block, bytes per block). Source: gguf-py `gguf/constants.py` GGMLQuantizationType and
# GGML_QUANT_SIZES (gguf 0.19), the same numbers as ggml's `type_traits` (ggml.c) and the block structs of
# `ggml-common.h`. QK_K (the K-quants' super-block) is 256. Ids 4, 5 and 31..33, 36..38 were removed from ggml; ids
# past MXFP4 (gguf-py 0.19 adds NVFP4 = 40 and Q1_0 = 41) are not listed, so a file holding them is refused as unknown.
_SIZES = {
  0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
  7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
  12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
  16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
  20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
  24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
  29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
}
TYPES: dict[int, GGMLType] = {i: GGMLType(name, i, bs, ts) for i, (name, bs, ts) in _SIZES.items()}
BY_NAME: dict[str, GGMLType] = {t.name: t for t in TYPES.values()}

# Types stored as plain little-endian arrays: name -> (baregrad dtype, numpy dtype of the bytes). BF16 has no numpy
# dtype: its bytes are read as uint16 and bitcast.
PLAIN = {
  "F32": (dtypes.float32, "<f4"), "F16": (dtypes.float16, "<f2"), "BF16": (dtypes.bfloat16, "<u2"),
  "F64": (dtypes.float64, "<f8"), "I8": (dtypes.int8, "|i1"), "I16": (dtypes.int16, "<i2"),
  "I32": (dtypes.int32, "<i4"), "I64": (dtypes.int64, "<i8"),
}

# Block layouts: field -> (byte offset, byte size) inside one block. Source: the block_* structs of ggml's
# `ggml-common.h` (d, m, dmin: ggml_fp16_t; `scales` of Q4_K/Q5_K: 8 six-bit scales and 8 six-bit mins packed in 12
# bytes; of Q6_K: 16 int8). Element i of a block, per ggml-quants.c dequantize_row_* (y is float32, q an integer):
#   Q8_0  y = d * qs[i]                      qs int8
#   Q4_0  y = d * (q - 8)                    q = nibble i of qs: the low 4 bits of qs[i] for i < 16, else the high 4
#   Q4_1  y = d * q + m                      of qs[i - 16]
#   Q5_0  y = d * (q - 16)                   q = nibble i | (bit i of qh, a little-endian uint32) << 4
#   Q5_1  y = d * q + m                      q as in Q5_0
#   Q4_K  y = (d * sc[s]) * q - (dmin * m[s]),  s = i // 32 (8 sub-blocks), l = i % 32;
#         q = qs[32 * (s // 2) + l], its low 4 bits for even s, the high 4 for odd s
#   Q5_K  as Q4_K, with q |= (bit s of qh[l]) << 4
#   Q6_K  y = (d * scales[8 h + 2 c + l // 16]) * (q - 32),  h = i // 128, c = (i % 128) // 32, l = i % 32;
#         q = (ql[64 h + 32 (c % 2) + l], its low 4 bits for c < 2, else the high 4) | ((qh[32 h + l] >> 2 c) & 3) << 4
# K-quant scales (ggml-quants.c get_scale_min_k4): the 12 `scales` bytes of Q4_K/Q5_K are A = bytes 0..3, B = 4..7,
# C = 8..11. Sub-block s < 4: sc = A[s] & 63, m = B[s] & 63. Sub-block s = 4 + k: sc = (C[k] & 15) | (A[k] >> 6) << 4,
# m = (C[k] >> 4) | (B[k] >> 6) << 4: the top two bits of A and B are the high bits of sub-blocks 4..7.
LAYOUTS: dict[str, dict[str, tuple[int, int]]] = {
  "Q8_0": {"d": (0, 2), "qs": (2, 32)},
  "Q4_0": {"d": (0, 2), "qs": (2, 16)},
  "Q4_1": {"d": (0, 2), "m": (2, 2), "qs": (4, 16)},
  "Q5_0": {"d": (0, 2), "qh": (2, 4), "qs": (6, 16)},
  "Q5_1": {"d": (0, 2), "m": (2, 2), "qh": (4, 4), "qs": (8, 16)},
  "Q4_K": {"d": (0, 2), "dmin": (2, 2), "scales": (4, 12), "qs": (16, 128)},
  "Q5_K": {"d": (0, 2), "dmin": (2, 2), "scales": (4, 12), "qh": (16, 32), "qs": (48, 128)},
  "Q6_K": {"ql": (0, 128), "qh": (128, 64), "scales": (192, 16), "d": (208, 2)},
}
DEQUANTIZABLE = tuple(["F32", "F16", "BF16", *LAYOUTS])


def ggml_type(t) -> GGMLType:
  """The GGMLType for an id, a name or a GGMLType (gguf's GGMLQuantizationType enum works: it is an int)."""
  if isinstance(t, GGMLType): return t
  if isinstance(t, str) and t.upper() in BY_NAME: return BY_NAME[t.upper()]
  if isinstance(t, (int, np.integer)) and not isinstance(t, bool) and int(t) in TYPES: return TYPES[int(t)]
  raise GGMLTypeError(f"unknown ggml type {t!r} (known: {', '.join(BY_NAME)})")


def nbytes(t, shape) -> int:
  """Bytes that a tensor of ggml type `t` and numpy `shape` takes: whole blocks along the innermost dim."""
  t = ggml_type(t)
  row = shape[-1] if len(shape) else 1
  if row % t.block_size:
    raise GGMLTypeError(f"{t.name}: the innermost dimension {row} of shape {tuple(shape)} is not a multiple of the "
                        f"block size {t.block_size}")
  return math.prod(shape) // t.block_size * t.type_size


def _check(raw_size: int, t, shape) -> GGMLType:
  t = ggml_type(t)
  if t.name not in DEQUANTIZABLE:
    raise GGMLTypeError(f"dequantizing ggml type {t.name} is not supported (supported: {', '.join(DEQUANTIZABLE)})")
  if raw_size != (want := nbytes(t, shape)):
    raise GGMLTypeError(f"{t.name} of shape {tuple(shape)} takes {want} bytes, got {raw_size}")
  return t


# ---------------- host (numpy) ----------------

def _np_f16(blocks: np.ndarray, field) -> np.ndarray:
  at, _ = field
  return np.ascontiguousarray(blocks[:, at:at + 2]).view("<f2").astype(np.float32)   # (nb, 1)


def _np_k_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(sc, m), each (nb, 8) uint8, from the (nb, 12) packed `scales` bytes of Q4_K/Q5_K (K-quant scales, above)."""
  a, b, c = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
  sc = np.concatenate([a & 63, (c & 15) | ((a >> 6) << 4)], axis=1)
  m = np.concatenate([b & 63, (c >> 4) | ((b >> 6) << 4)], axis=1)
  return sc, m


def dequantize_numpy(raw, t, shape) -> np.ndarray:
  """float32 array of numpy `shape` from the raw bytes (any buffer or uint8 array) of a ggml tensor of type `t`."""
  raw = np.frombuffer(raw, dtype=np.uint8) if not isinstance(raw, np.ndarray) else raw.reshape(-1).view(np.uint8)
  t = _check(raw.size, t, shape)
  shape = tuple(shape)
  if t.name in ("F32", "F16"): return raw.view("<f4" if t.name == "F32" else "<f2").astype(np.float32).reshape(shape)
  if t.name == "BF16": return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
  lay = LAYOUTS[t.name]
  blocks = raw.reshape(-1, t.type_size)
  nb = blocks.shape[0]
  def field(name): return blocks[:, lay[name][0]:sum(lay[name])]
  if t.name == "Q8_0":
    y = _np_f16(blocks, lay["d"]) * field("qs").view(np.int8).astype(np.float32)
  elif t.name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1"):
    qs = field("qs")
    q = np.concatenate([qs & 15, qs >> 4], axis=1)                          # (nb, 32): nibble i
    if "qh" in lay:
      bits = np.unpackbits(field("qh"), axis=1, bitorder="little")         # (nb, 32): bit i of the uint32
      q = q | (bits << 4)
    d = _np_f16(blocks, lay["d"])
    if "m" in lay: y = d * q.astype(np.float32) + _np_f16(blocks, lay["m"])
    else: y = d * (q.astype(np.float32) - (16 if "qh" in lay else 8))
  elif t.name in ("Q4_K", "Q5_K"):
    qs = field("qs").reshape(nb, 4, 1, 32)
    q = ((qs >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & 15).reshape(nb, 8, 32)   # sub-block s = 2j + half
    if "qh" in lay:
      q = q | (((field("qh").reshape(nb, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1) << 4)
    sc, m = _np_k_scales(field("scales"))
    d1 = _np_f16(blocks, lay["d"]) * sc.astype(np.float32)                 # (nb, 8)
    m1 = _np_f16(blocks, lay["dmin"]) * m.astype(np.float32)
    y = d1[:, :, None] * q.astype(np.float32) - m1[:, :, None]
  else:  # Q6_K
    ql = field("ql").reshape(nb, 2, 1, 2, 32)                               # [half, -, c % 2, l]
    low = (ql >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1, 1)) & 15    # [half, c // 2, c % 2, l]
    qh = field("qh").reshape(nb, 2, 1, 32)
    high = (qh >> (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1)) & 3
    q = (low.reshape(nb, 2, 4, 32) | (high << 4)).astype(np.float32) - 32
    sc = np.repeat(field("scales").view(np.int8).reshape(nb, 2, 4, 2), 16, axis=3).astype(np.float32)
    y = (_np_f16(blocks, lay["d"]).reshape(nb, 1, 1, 1) * sc) * q
  return y.reshape(shape)


# ---------------- lazy Tensor composition ----------------

def _bytes(blocks: Tensor, at: int, size: int) -> Tensor:
  return blocks.shrink(((0, blocks.shape[0]), (at, at + size)))


def _f16(blocks: Tensor, at: int) -> Tensor:
  """The float16 at byte `at` of each block, as float32 (nb, 1): two bytes put together little-endian, bitcast."""
  lo, hi = _bytes(blocks, at, 1).cast(dtypes.uint16), _bytes(blocks, at + 1, 1).cast(dtypes.uint16)
  return (lo | (hi << 8)).bitcast(dtypes.float16).cast(dtypes.float32)


def _fields(x: Tensor, n: int, width: int, axis: int) -> Tensor:
  """Split each byte of x into n fields of `width` bits, the lowest first, on a new axis of size n at `axis`: the
  fields are stacked views with constant shifts, so each element's kernel code is one shift and one mask, and the
  choice between fields is by position (a CPU kernel runs a row of one field as vector lanes)."""
  mask = (1 << width) - 1
  x = x.cast(dtypes.int32)
  return Tensor.stack(*[(x >> (i * width)) & mask if i else x & mask for i in range(n)], dim=axis)


def _bits(x: Tensor, device) -> Tensor:
  """The 8 bits of each byte of x as float32 0.0 / 1.0, the lowest first, on a new last axis: bit p is
  floor(b / 2^p) mod 2, computed in float (exact: b < 256) with 2^-p read from an 8-float table. A row of 8 bits is a
  row of vector lanes on the CPU, which a choice between 8 shifted bytes by lane (stacked views: _fields) is not:
  each lane would select an integer (Q5_0/Q5_1 products ran one lane at a time, 0.2 G weights/s)."""
  # (a table: 2^-p computed from the lane's index is integer arithmetic on the index, which is not vector lanes either)
  inv = Tensor(np.array([2.0 ** -p for p in range(8)], np.float32), device=device)
  t = (x.cast(dtypes.float32).unsqueeze(-1) * inv).floor()
  return t - 2.0 * (t * 0.5).floor()


def _k_scales(scales: Tensor) -> Tensor:
  """(nb, 2, 8) uint8: [:, 0] the six-bit scales, [:, 1] the six-bit mins of the 8 sub-blocks (K-quant scales, above).
  Axis 1 (j) picks A or B, the bytes with the low bits of sub-blocks 0..3 and the high bits of 4..7; for sub-blocks
  4..7 the low bits come from C, its low nibble for the scales, its high nibble for the mins."""
  nb = scales.shape[0]
  ab = _bytes(scales, 0, 8).reshape(nb, 2, 4)                     # [j, k]: A for the scales, B for the mins
  c = _bytes(scales, 8, 4).reshape(nb, 1, 4)
  low_c = Tensor.stack(c & 15, c >> 4, dim=1).reshape(nb, 2, 4)   # j: the low nibble of C for the scales, high for mins
  late = low_c | ((ab >> 2) & 0x30)                                # sub-blocks 4..7
  return Tensor.stack(ab & 63, late, dim=2).reshape(nb, 2, 8)     # [j, g, k]: g = 0 for sub-blocks 0..3


def dequantize(raw: Tensor, t, shape) -> Tensor:
  """A lazy float32 Tensor of numpy `shape` from `raw`, a uint8 Tensor holding the bytes of a ggml tensor of type
  `t`. Nothing is computed here: the result is a graph of elementwise ops over `raw` that fuses into its consumer."""
  if raw.dtype != dtypes.uint8: raise GGMLTypeError(f"dequantize: needs a uint8 Tensor of the raw bytes, got {raw!r}")
  raw = raw.reshape(-1)
  t = _check(raw.shape[0], t, shape)
  shape = tuple(shape)
  if t.name in ("F32", "F16", "BF16"):
    size = 2 if t.name != "F32" else 4
    b = raw.reshape(-1, size)
    word = dtypes.uint32 if size == 4 else dtypes.uint16
    bits = _bytes(b, 0, 1).cast(word)
    for i in range(1, size): bits = bits | (_bytes(b, i, 1).cast(word) << (8 * i))
    dt = {"F32": dtypes.float32, "F16": dtypes.float16, "BF16": dtypes.bfloat16}[t.name]
    return bits.bitcast(dt).cast(dtypes.float32).reshape(shape)
  lay = LAYOUTS[t.name]
  blocks = raw.reshape(-1, t.type_size)
  nb = blocks.shape[0]
  def field(name): return _bytes(blocks, *lay[name])
  if t.name == "Q8_0":
    y = _f16(blocks, lay["d"][0]) * field("qs").bitcast(dtypes.int8).cast(dtypes.float32)
  elif t.name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1"):
    q = _fields(field("qs"), 2, 4, 1).reshape(nb, 32).cast(dtypes.float32)    # nibble i
    if "qh" in lay: q = q + 16.0 * _bits(field("qh"), raw.device).reshape(nb, 32)  # bit i of the uint32
    d = _f16(blocks, lay["d"][0])
    if "m" in lay: y = d * q + _f16(blocks, lay["m"][0])
    else: y = d * (q - (16.0 if "qh" in lay else 8.0))
  elif t.name in ("Q4_K", "Q5_K"):
    q = _fields(field("qs").reshape(nb, 4, 32), 2, 4, 2).reshape(nb, 8, 32)   # sub-block s = 2 * (s // 2) + s % 2
    if "qh" in lay: q = q | (_fields(field("qh"), 8, 1, 1) << 4)
    sm = _k_scales(field("scales")).cast(dtypes.float32)                      # (nb, 2, 8)
    dd = (_f16(blocks, lay["d"][0]).reshape(nb, 1, 1), _f16(blocks, lay["dmin"][0]).reshape(nb, 1, 1))
    d1 = dd[0] * sm.shrink(((0, nb), (0, 1), (0, 8))).reshape(nb, 8, 1)
    m1 = dd[1] * sm.shrink(((0, nb), (1, 2), (0, 8))).reshape(nb, 8, 1)
    y = d1 * q.cast(dtypes.float32) - m1
  else:  # Q6_K
    low = _fields(field("ql").reshape(nb, 2, 2, 32), 2, 4, 2).reshape(nb, 2, 4, 32)   # [half, c // 2, c % 2, l]
    high = _fields(field("qh").reshape(nb, 2, 32), 4, 2, 2)                    # [half, c, l]
    q = (low | (high << 4)).cast(dtypes.float32) - 32.0
    sc = field("scales").bitcast(dtypes.int8).reshape(nb, 2, 4, 2, 1).expand(nb, 2, 4, 2, 16).reshape(nb, 2, 4, 32)
    y = (_f16(blocks, lay["d"][0]).reshape(nb, 1, 1, 1) * sc.cast(dtypes.float32)) * q
  return y.reshape(shape)


__all__ = ["GGMLType", "GGMLTypeError", "TYPES", "BY_NAME", "PLAIN", "LAYOUTS", "DEQUANTIZABLE", "ggml_type", "nbytes",
           "dequantize", "dequantize_numpy"]
