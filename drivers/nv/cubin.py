"""PTX -> cubin with `ptxas`, and what a launch needs from a cubin (the driver layer's own small reader).

The driver may not import the compiler layer, so this is the driver's copy of the two facts it needs:
- ptxas (on PATH, $PTXAS, or the `nvidia-cuda-nvcc` wheel's nvidia/cu13/bin/ptxas), run as
  `ptxas -arch=sm_XX -O3 in.ptx -o out.cubin`, cubins cached on disk by a hash of the inputs;
- `.nv.info*` attributes as ptxas 13.0 writes them: entries `u8 format, u8 attribute, u16 value-or-size`,
  format 4 followed by `size` bytes. EIATTR_KPARAM_INFO 0x17 (u32 index, u16 ordinal, u16 offset, u32 flags with
  the size in bits 18..31), EIATTR_PARAM_CBANK 0x0a (u32 symbol, u16 offset of the parameters in constant bank 0,
  u16 size), EIATTR_CBANK_PARAM_SIZE 0x19, EIATTR_NUM_BARRIERS 0x4c; module-wide EIATTR_REGCOUNT 0x2f,
  EIATTR_FRAME_SIZE 0x11 (u32 symbol, u32 value).
"""
from __future__ import annotations
import hashlib, io, os, shutil, struct, subprocess, tempfile
from dataclasses import dataclass
from pathlib import Path


class PtxasError(RuntimeError):
  pass


def find_ptxas() -> str:
  if (p := os.environ.get("PTXAS")) and (found := shutil.which(p)): return found
  if (found := shutil.which("ptxas")): return found
  try:
    import nvidia
    for root in nvidia.__path__:
      for sub in ("cu13", "cuda_nvcc", "cu12"):
        cand = Path(root) / sub / "bin" / "ptxas"
        if cand.is_file(): return str(cand)
  except ImportError:
    pass
  raise PtxasError("ptxas not found: the NV device assembles its PTX with NVIDIA's ptxas. pip install nvidia-cuda-nvcc "
                   "(baregrad[nv]) or put ptxas on PATH (or set PTXAS).")


def compile_ptx(src: str, arch: str) -> bytes:
  ptxas = find_ptxas()
  from baregrad.drivers.cpu.cc import cache_dir
  key = hashlib.sha256(f"{ptxas}|{os.path.getmtime(ptxas)}|{arch}|-O3|{src}".encode()).hexdigest()
  path = cache_dir() / "nv-ptxas" / f"{key}.cubin"
  if path.exists() and os.environ.get("CACHE", "1") != "0": return path.read_bytes()
  with tempfile.TemporaryDirectory(prefix="baregrad-nv-") as tmp:
    ptx, out = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
    ptx.write_text(src)
    proc = subprocess.run([ptxas, f"-arch={arch}", "-O3", str(ptx), "-o", str(out)], capture_output=True, text=True)
    if proc.returncode != 0 or not out.exists():
      raise PtxasError(f"ptxas -arch={arch} failed (exit {proc.returncode}):\n{(proc.stderr + proc.stdout).strip()}")
    data = out.read_bytes()
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmpf = path.with_suffix(f".{os.getpid()}.tmp")
    tmpf.write_bytes(data)
    os.replace(tmpf, path)
  except OSError:
    pass
  return data


@dataclass
class Kernel:
  name: str
  text: bytes
  params: list            # [(ordinal, offset from the parameter base, size)] by ordinal
  param_base: int         # offset of the parameters in constant bank 0
  cbuf0_size: int
  registers: int
  shared: int
  stack: int
  barriers: int


def _nv_info(data: bytes):
  i = 0
  while i + 4 <= len(data):
    fmt, attr, val = struct.unpack_from("<BBH", data, i); i += 4
    if fmt == 4: yield attr, data[i:i + val]; i += val
    else: yield attr, val


def read_cubin(data: bytes, name: str) -> Kernel:
  from elftools.elf.elffile import ELFFile
  elf = ELFFile(io.BytesIO(data))
  sections = {s.name: s for s in elf.iter_sections()}
  if f".text.{name}" not in sections:
    raise ValueError(f"cubin has no kernel {name!r} (kernels: {[n[6:] for n in sections if n.startswith('.text.')]})")
  symbols = [s.name for s in sections[".symtab"].iter_symbols()]
  per_fn: dict = {}
  for attr, val in _nv_info(sections[".nv.info"].data()) if ".nv.info" in sections else ():
    if isinstance(val, bytes) and len(val) == 8:
      sym, v = struct.unpack("<II", val)
      per_fn.setdefault(symbols[sym], {})[attr] = v
  params, base, size, barriers = [], 0, 0, 0
  for attr, val in _nv_info(sections[f".nv.info.{name}"].data()) if f".nv.info.{name}" in sections else ():
    if attr == 0x17:
      _, ordinal, offset, flags = struct.unpack("<IHHI", val)
      params.append((ordinal, offset, (flags >> 18) & 0x3FFF))
    elif attr == 0x0A: _, base, size = struct.unpack("<IHH", val)
    elif attr == 0x4C: barriers = val
  params.sort()
  text = sections[f".text.{name}"]
  fn = per_fn.get(name, {})
  const0, shared = sections.get(f".nv.constant0.{name}"), sections.get(f".nv.shared.{name}")
  return Kernel(name, text.data(), params, base, const0["sh_size"] if const0 is not None else base + size,
                fn.get(0x2F, text["sh_info"] >> 24), shared["sh_size"] if shared is not None else 0, fn.get(0x11, 0), barriers)
