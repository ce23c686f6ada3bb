"""Shared helpers for the RDNA3 emulator tests: assemble a kernel, wrap it in a code object,
place numpy arrays in an emulated address space, run it."""
import numpy as np

from baregrad.compiler.amd.asm import assemble
from baregrad.drivers.amd.codeobj import KernelDescriptor, write_code_object
from baregrad.drivers.emu.memory import Memory
from baregrad.drivers.emu.rdna3 import dispatch


def code_object(src: str, *, vgprs=16, kernarg_size=64, lds=0, workgroup_ids=3, workitem_dims=3, private=0,
                name="k") -> bytes:
  kd = KernelDescriptor.for_kernel(vgprs=vgprs, kernarg_size=kernarg_size, lds_size=lds, workgroup_ids=workgroup_ids,
                                   workitem_dims=workitem_dims, private_size=private)
  return write_code_object(name, assemble(src), kd, kernarg_size, [])


class Buffers:
  """numpy arrays mapped at fake GPU addresses plus a kernarg block holding their addresses."""

  def __init__(self, *arrays, scalars=()):
    self.mem = Memory()
    self.arrays = [np.ascontiguousarray(a) for a in arrays]
    self.addrs = []
    for a in self.arrays:
      addr = self.mem.alloc(max(a.nbytes, 4), align=0x10000)   # reserve an address range ...
      self.mem.unmap(addr)
      self.mem.map_array(addr, a)                                 # ... and put the array there
      self.addrs.append(addr)
    args = np.array(self.addrs, np.uint64).tobytes() + np.array(scalars, np.uint32).tobytes()
    self.kernarg = self.mem.alloc(max(len(args), 8))
    self.mem.write(self.kernarg, args)


def run(src: str, grid, block, *arrays, scalars=(), **kw):
  """Assemble, run, and return the (mutated in place) arrays."""
  run_kw = {k: kw.pop(k) for k in ("lds_size", "max_steps", "max_batch_waves") if k in kw}
  co = code_object(src, **kw)
  bufs = Buffers(*arrays, scalars=scalars)
  dispatch(co, grid, block, bufs.kernarg, bufs.mem, **run_kw)
  return bufs.arrays


def matmul_loop_source(n: int) -> str:
  """A naive n x n x n float32 matmul: one thread per output, a 16x16 workgroup per 16x16 tile,
  one scalar loop of n iterations with two global loads and one FMA each."""
  return f"""
    s_load_b128 s[4:7], s[0:1], 0x0
    s_load_b64 s[8:9], s[0:1], 0x10
    v_and_b32 v1, 0x3ff, v0
    v_bfe_u32 v2, v0, 10, 10
    v_lshl_add_u32 v1, s2, 4, v1          // column
    v_lshl_add_u32 v2, s3, 4, v2          // row
    v_mul_lo_u32 v3, v2, {n * 4}
    v_lshlrev_b32 v4, 2, v1
    v_mov_b32 v5, 0
    s_mov_b32 s10, {n}
    s_waitcnt lgkmcnt(0)
  loop:
    global_load_b32 v6, v3, s[4:5]
    global_load_b32 v7, v4, s[6:7]
    v_add_nc_u32 v3, 4, v3
    v_add_nc_u32 v4, {n * 4}, v4
    s_waitcnt vmcnt(0)
    v_fmac_f32 v5, v6, v7
    s_sub_u32 s10, s10, 1
    s_cmp_lg_u32 s10, 0
    s_cbranch_scc1 loop
    v_mad_u32_u24 v8, v2, {n}, v1
    v_lshlrev_b32 v8, 2, v8
    global_store_b32 v8, v5, s[8:9]
    s_endpgm
  """
