"""NVIDIA rules from an audit against open-gpu-kernel-modules 580.142 (OGKM) and open-gpu-doc (DOC): the emulated RM/UVM
and GPU enforce each rule with the real status code or a fault naming it, and the driver keeps it. Each test fails
with the driver as it was before the rule (what it did is said beside the test).

  1. channel group engine: RM ties a TSG and its channels to one engine's runlist; a channel whose engineType is not
     its TSG's is refused with NV_ERR_INVALID_ARGUMENT (OGKM src/nvidia/src/kernel/gpu/fifo/kernel_channel.c,
     kchannelConstruct, GA100+). Before: a COPY0 channel in the GRAPHICS TSG.
  2. UVM_REGISTER_CHANNEL: a GR channel of an externally owned VA space is schedulable only once UVM bound it
     (kchannelIsSchedulable, kernel_channel.c; bIsContextBound set by nvGpuOpsBindChannelResources, rmapi/nv_gpu_ops.c),
     else NVA06C_CTRL_CMD_GPFIFO_SCHEDULE returns NV_ERR_INVALID_STATE (kernel_channel_group_api.c). Before: never called.
  4. shared-memory carveout: MIN/TARGET/MAX_SM_CONFIG_SHARED_MEM_SIZE = KiB / 4 + 1 of a carveout the SM has (Mesa NVK
     gv100_sm_config_smem_size; carveouts: CUDA C++ Programming Guide, compute capabilities 8.x / 9.0). Before: 0.
  5. local memory: ptxas code loads its stack pointer from bank 0 (`LDC R1, c[0x0][0x28]`) and keeps its stack below the
     top of the 16 MiB local window, so a frame needs SHADER_LOCAL_MEMORY_HIGH_SIZE, SET_SHADER_LOCAL_MEMORY_A/B and
     _NON_THROTTLED_A/B/C (DOC classes/compute/clcbc0.h). Before: bank 0's driver area zero, LOW_SIZE only, no methods.
  7. instruction cache: program memory rewritten since the last INVALIDATE_SHADER_CACHES(INSTRUCTION) (DOC clcbc0.h)
     may run stale code; the emulator faults on it. Before: never invalidated.
  8. constant banks: every .nv.constantN of the cubin bound (ptxas puts sm_80 .. sm_89 64-bit immediates in bank 2);
     relocations refused. Before: bank 0 only.
  9. doorbell: a channel fetches GPFIFO entries once its work-submit token is written to the usermode page's
     NOTIFY_CHANNEL_PENDING (DOC clc361.h; GPPut alone is not seen). The driver rang it before; the emulator did not
     need it.
  +  class lists: each chip lists what OGKM src/nvidia/generated/g_gpu_class_list.c says (GH100: HOPPER_COMPUTE_A only).
"""
import errno, re, shutil, struct, subprocess, time
from pathlib import Path
import numpy as np
from baregrad.drivers.decode import decode
import pytest

from baregrad.drivers.emu.nv_kernel import EmulatedNVKernel, GPU_UUID, CLASS_IDS
from baregrad.drivers.nv import driver as nv_driver, pushbuf as pb, qmd, rm
from baregrad.drivers.nv.cubin import DRIVER_AREA, STACK_TOP, load_cubin, find_ptxas
from baregrad.drivers.nv.driver import NVDriver, NVError, RMError
from baregrad.drivers.emu.nv_kernel import ctx_buffer_layout

CHANNEL_VA_BYTES = 96 << 20       # a region large enough for every emulated GPU's GR context buffers
from baregrad.drivers.nv.rm import ffi
from baregrad.hcq.program import Program

_opened: list[NVDriver] = []


@pytest.fixture(autouse=True)
def _close_drivers():
  yield
  while _opened: _opened.pop().close()       # the emulated GPU's channel threads stop with their RM client


def _driver(gpu: str = "GH100") -> NVDriver:
  d = NVDriver(kernel=EmulatedNVKernel(gpu=gpu))
  _opened.append(d)
  return d


def _program(d: NVDriver, ptx: str, name: str) -> Program:
  binary = d.compile(ptx)
  prog = Program("NV", name, binary, ptx)
  prog.entry, prog.handle = d.load_program(binary, name)
  return prog


def _run(d: NVDriver, prog: Program, args: list[int], grid=(1, 1, 1), block=(32, 1, 1), timeout=60.0) -> str | None:
  """Launch prog on the compute channel and wait: None when it finished, else the fault the GPU reported."""
  kernargs = d.alloc(8 * len(args))
  np.frombuffer(d.view(kernargs.addr, 8 * len(args)), np.uint64)[:] = args
  d.submit("compute", d.encode("compute", [("exec", prog, kernargs.addr, grid, block)]))
  ch, end = d.channels["compute"], time.monotonic() + timeout
  while d._u64(ch.fence.addr) < ch.fence_value:
    if d.k.fault() is not None: return d.k.fault()
    assert time.monotonic() < end, "launch did not finish"
    time.sleep(0.002)
  return d.k.fault()


def _cuobjdump() -> str:
  if (found := shutil.which("cuobjdump")): return found
  try:
    import nvidia
    for root in nvidia.__path__:
      for cand in Path(root).glob("*/bin/cuobjdump"): return str(cand)
  except ImportError:
    pass
  pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump)")


def _sass(binary: bytes, tmp_path) -> str:
  path = tmp_path / "k.cubin"
  path.write_bytes(binary)
  return subprocess.run([_cuobjdump(), "-sass", str(path)], check=True, capture_output=True, text=True).stdout


def _ptx(arch: str, body: str) -> str:
  return f".version 8.0\n.target {arch}\n.address_size 64\n{body}"


COPY_PTX = """.visible .entry copy(.param .u64 out, .param .u64 inp)
{
  .reg .b64 %rd<6>;
  .reg .b32 %r<4>;
  ld.param.u64 %rd1, [out];
  ld.param.u64 %rd2, [inp];
  mov.u32 %r1, %tid.x;
  mul.wide.u32 %rd3, %r1, 4;
  add.u64 %rd4, %rd2, %rd3;
  ld.global.u32 %r2, [%rd4];
  add.u32 %r2, %r2, VALUE;
  add.u64 %rd5, %rd1, %rd3;
  st.global.u32 [%rd5], %r2;
  ret;
}
"""


def _copy_kernel(arch: str, value: int) -> str:
  return _ptx(arch, COPY_PTX.replace("VALUE", str(value)))


def _add_one_works(d: NVDriver, value: int = 1):
  n = 32
  prog = _program(d, _copy_kernel(d.target, value), "copy")      # first: it takes the memory a freed program left
  inp, out = d.alloc(4 * n), d.alloc(4 * n)
  np.frombuffer(d.view(inp.addr, 4 * n), np.uint32)[:] = np.arange(n)
  assert _run(d, prog, [out.addr, inp.addr]) is None
  np.testing.assert_array_equal(np.frombuffer(d.view(out.addr, 4 * n), np.uint32), np.arange(n) + value)
  return prog


# ==== 1. a channel's engine is its channel group's ===============================================================
def _rm_group(d: NVDriver, engine: int):
  gp = ffi.new("NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS *"); gp.engineType = engine
  group = d.rm.alloc(d.device, rm.KEPLER_CHANNEL_GROUP_A, gp)
  cp = ffi.new("NV_CTXSHARE_ALLOCATION_PARAMETERS *")
  cp.hVASpace, cp.flags = d.vaspace, rm.NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT_ASYNC
  return group, d.rm.alloc(group, rm.FERMI_CONTEXT_SHARE_A, cp)


def _rm_channel(d: NVDriver, group: int, ctxshare: int, engine: int) -> int:
  ring, userd = d.alloc(8 * 64), d.alloc(4096)
  p = ffi.new("NV_CHANNEL_ALLOC_PARAMS *")
  p.gpFifoOffset, p.gpFifoEntries, p.hContextShare, p.hUserdMemory[0], p.engineType = ring.addr, 64, ctxshare, userd.handle, engine
  return d.rm.alloc(group, d.channel_class, p)


def test_rm_refuses_a_channel_whose_engine_is_not_its_groups():
  """kernel_channel.c: 'Engine type of channel ... not compatible with engine type of TSG' -> NV_ERR_INVALID_ARGUMENT;
  engineType 0 inherits the TSG's engine; kernel_channel_group_api.c: a TSG needs a valid engine type."""
  d = _driver()
  group, ctxshare = _rm_group(d, rm.NV2080_ENGINE_TYPE_GRAPHICS)
  with pytest.raises(RMError, match="NV_ERR_INVALID_ARGUMENT") as e:
    _rm_channel(d, group, ctxshare, rm.NV2080_ENGINE_TYPE_COPY0)
  assert e.value.status == 0x1F
  inherits = _rm_channel(d, group, ctxshare, rm.NV2080_ENGINE_TYPE_NULL)
  assert d.k.clients[d.rm.root][inherits].info["engine"] == rm.NV2080_ENGINE_TYPE_GRAPHICS
  with pytest.raises(RMError, match="NV_ERR_INVALID_CLASS"):          # compute needs a GR channel (channel_descendant.c)
    copy_group, copy_ctx = _rm_group(d, rm.NV2080_ENGINE_TYPE_COPY0)
    d.rm.alloc(_rm_channel(d, copy_group, copy_ctx, rm.NV2080_ENGINE_TYPE_COPY0), d.compute_class)
  with pytest.raises(RMError, match="NV_ERR_INVALID_ARGUMENT"):
    _rm_group(d, rm.NV2080_ENGINE_TYPE_NULL)
  with pytest.raises(RMError, match="NV_ERR_INVALID_OBJECT_PARENT"):  # the context share must be the TSG's
    _rm_channel(d, copy_group, ctxshare, rm.NV2080_ENGINE_TYPE_COPY0)


def test_driver_puts_the_copy_channel_in_the_gr_channel_group():
  """Both channels in one GRAPHICS TSG, the copy channel taking its engine (the layout tinygrad runs on hardware): its
  DMA-copy object runs on the GR engine's copy engine. Before: a CE-only TSG on COPY0 (a GRCE on GH100), a layout
  neither UVM nor RM's CeUtils use that way; and earlier a COPY0 channel in the GR TSG (NV_ERR_INVALID_ARGUMENT)."""
  d = _driver()
  objects = d.k.clients[d.rm.root]
  compute, copy = (objects[d.channels[k].handle] for k in ("compute", "copy"))
  assert compute.parent == copy.parent and list(d.groups) == [rm.NV2080_ENGINE_TYPE_GRAPHICS]
  group = objects[compute.parent]
  assert group.cls == rm.KEPLER_CHANNEL_GROUP_A and group.info["engine"] == rm.NV2080_ENGINE_TYPE_GRAPHICS
  assert compute.info["engine"] == copy.info["engine"] == rm.NV2080_ENGINE_TYPE_GRAPHICS
  assert d.channels["compute"].window == d.channels["copy"].window       # one region: the TSG's context buffers
  src, dst = d.alloc(4096), d.alloc(4096)
  d.view(src.addr, 4096)[:] = bytes(range(256)) * 16
  d.submit("copy", d.encode("copy", [("copy", dst.addr, src.addr, 4096)]))
  ch = d.channels["copy"]
  end = time.monotonic() + 30
  while d._u64(ch.fence.addr) < ch.fence_value and time.monotonic() < end: time.sleep(0.002)
  assert d.k.fault() is None and bytes(d.view(dst.addr, 4096)) == bytes(range(256)) * 16


# ==== 2. every channel is registered with UVM ====================================================================
def test_scheduling_an_unbound_gr_channel_is_refused_until_uvm_registers_it():
  d = _driver()
  group, ctxshare = _rm_group(d, rm.NV2080_ENGINE_TYPE_GRAPHICS)
  channel = _rm_channel(d, group, ctxshare, rm.NV2080_ENGINE_TYPE_GRAPHICS)
  sp = ffi.new("NVA06C_CTRL_GPFIFO_SCHEDULE_PARAMS *"); sp.bEnable = 1
  with pytest.raises(RMError, match="NV_ERR_INVALID_STATE"):
    d.rm.control(group, rm.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE, sp)
  register = lambda base, length, handle=channel: d._uvm(rm.UVM_REGISTER_CHANNEL, gpuUuid=GPU_UUID, rmCtrlFd=d.fd_ctl,
                                                         hClient=d.rm.root, hChannel=handle, base=base, length=length)
  with pytest.raises(RMError, match="NV_ERR_INVALID_ADDRESS"): register(0x1234, 1 << 26)      # uvm_api_range_invalid
  taken = d.alloc(1 << 20)                                                                     # an external range
  with pytest.raises(RMError, match="NV_ERR_INVALID_ADDRESS"): register(taken.addr, 1 << 26)  # no free VA there
  with pytest.raises(RMError, match="NV_ERR_INVALID_OBJECT_HANDLE"): register(1 << 36, 1 << 26, d.device)
  window = d._take_va(CHANNEL_VA_BYTES)
  register(window, CHANNEL_VA_BYTES)
  with pytest.raises(RMError, match="NV_ERR_INVALID_CHANNEL"): register(window, CHANNEL_VA_BYTES)   # already registered
  d.rm.control(group, rm.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE, sp)
  with pytest.raises(RMError, match="NV_ERR_UVM_ADDRESS_IN_USE"):      # the channel's resources now occupy the window
    d._uvm(rm.UVM_CREATE_EXTERNAL_RANGE, base=window, length=4096)


def test_uvm_register_channel_past_the_channel_va_limit_is_out_of_range():
  """uvm_user_channel.c: a region ending at or past parent_gpu->max_channel_va (2**40 on Ampere, uvm_ampere.c)."""
  d = _driver("GA100")
  group, ctxshare = _rm_group(d, rm.NV2080_ENGINE_TYPE_GRAPHICS)
  channel = _rm_channel(d, group, ctxshare, rm.NV2080_ENGINE_TYPE_GRAPHICS)
  with pytest.raises(RMError, match="NV_ERR_OUT_OF_RANGE"):
    d._uvm(rm.UVM_REGISTER_CHANNEL, gpuUuid=GPU_UUID, rmCtrlFd=d.fd_ctl, hClient=d.rm.root, hChannel=channel,
           base=(1 << 40) - CHANNEL_VA_BYTES // 2, length=CHANNEL_VA_BYTES)


def test_driver_registers_every_channel_and_again_after_a_reset():
  """Before: UVM_REGISTER_CHANNEL was never called, so opening the device failed with NV_ERR_INVALID_STATE."""
  d = _driver()
  registered = lambda: {h for _, h in d.k.uvm_channels}
  assert registered() == {ch.handle for ch in d.channels.values()}
  old = {ch.handle for ch in d.channels.values()}
  d.submit("compute", d.encode("compute", [("barrier",)]))
  d.submit("compute", _bad_method())
  end = time.monotonic() + 10
  while d.k.fault() is None and time.monotonic() < end: time.sleep(0.005)
  with pytest.raises(nv_driver.ChannelReset): d.check_faults("NV")
  assert registered() == {ch.handle for ch in d.channels.values()} and not registered() & old   # old ones unregistered
  _add_one_works(d)


def _bad_method():
  from baregrad.drivers.encoded import Encoded
  return Encoded([pb.method_header(pb.SUBC_COMPUTE, 0x3FFC, 1), 0])


# ==== 4. the shared-memory carveout ==============================================================================
SHARED_PTX = """.visible .entry shared(.param .u64 out)
{
  .shared .align 4 .b8 buf[40960];
  .reg .b64 %rd<6>;
  .reg .b32 %r<8>;
  ld.param.u64 %rd1, [out];
  mov.u32 %r1, %tid.x;
  mov.u32 %r2, %ntid.x;
  mul.lo.u32 %r3, %r1, 3;
  mov.u32 %r4, buf;
  mad.lo.u32 %r5, %r1, 4, %r4;
  st.shared.u32 [%r5+40832], %r3;
  bar.sync 0;
  add.u32 %r6, %r1, 1;
  rem.u32 %r6, %r6, %r2;
  mad.lo.u32 %r5, %r6, 4, %r4;
  ld.shared.u32 %r7, [%r5+40832];
  mul.wide.u32 %rd2, %r1, 4;
  add.u64 %rd3, %rd1, %rd2;
  st.global.u32 [%rd3], %r7;
  ret;
}
"""
CARVEOUT_MAX_KIB = {"GA100": 164, "AD102": 100, "GH100": 228}


@pytest.mark.parametrize("gpu", ["GH100", "GA100", "AD102"])
def test_qmd_carveout_holds_the_ctas_shared_memory(gpu):
  """40 KiB of shared memory (+ 1 KiB reserved on sm_8x) needs the 64 KiB carveout: MIN = TARGET = 64 / 4 + 1 = 17,
  MAX the SM's largest. Before: all three fields 0, which the emulated GPU refuses."""
  d = _driver(gpu)
  out = d.alloc(4 * 32)
  prog = _program(d, _ptx(d.target, SHARED_PTX), "shared")
  assert _run(d, prog, [out.addr]) is None, d.k.fault()
  np.testing.assert_array_equal(np.frombuffer(d.view(out.addr, 128), np.uint32), (np.arange(32) + 1) % 32 * 3)
  fields = qmd.read_launch(d.qmd_version, bytes(d.view(_last_qmd(d), qmd.QMD_BYTES)))
  assert fields["sm_config"] == (17, 17, CARVEOUT_MAX_KIB[gpu] // 4 + 1)
  assert fields["shared"] >= prog.handle.shared_size >= 40960


def _last_qmd(d: NVDriver) -> int:
  """The address of the QMD of the last launch the compute channel ran (from its last SEND_PCAS_A)."""
  proc = next(c for c in d.k.gpu.channels if c.chname == "compute")
  return proc.state[pb.SUBC_COMPUTE][pb.SEND_PCAS_A] << 8


def test_launch_with_no_carveout_or_too_small_a_carveout_faults(monkeypatch):
  d = _driver()
  prog = _program(d, _ptx(d.target, SHARED_PTX), "shared")
  monkeypatch.setattr(d, "_carveout", lambda name, kern: (32 << 10, 32 << 10, 228 << 10))
  msg = _run(d, prog, [d.alloc(128).addr])
  assert re.search(r"a CTA needs 41[0-9]+ bytes of shared memory .* MIN_SM_CONFIG_SHARED_MEM_SIZE configures a carveout "
                   r"of 32768", msg), msg
  d = _driver()
  prog = _program(d, _ptx(d.target, SHARED_PTX), "shared")
  real = qmd.launch_fields
  monkeypatch.setattr(qmd, "launch_fields", lambda *a, **k: {**real(*a, **k), "MIN_SM_CONFIG_SHARED_MEM_SIZE": 0,
                                                             "TARGET_SM_CONFIG_SHARED_MEM_SIZE": 0, "MAX_SM_CONFIG_SHARED_MEM_SIZE": 0})
  msg = _run(d, prog, [d.alloc(128).addr])
  assert "MIN_SM_CONFIG_SHARED_MEM_SIZE 0 is not a shared-memory carveout of a sm_90 SM" in msg, msg
  with pytest.raises(NVError, match=r"GPU channel error 13 \(ROBUST_CHANNEL_GR_EXCEPTION"): d.check_faults("NV")


def test_a_kernel_no_carveout_holds_is_refused_at_encode():
  d = _driver("AD102")         # sm_89: at most 100 KiB per SM
  prog = _program(d, _ptx(d.target, SHARED_PTX), "shared")
  prog.handle.shared_size = 100 << 10           # (static shared memory stops at 48 KiB; the driver has no dynamic)
  with pytest.raises(NVError, match=r"kernel shared needs 103424 bytes of shared memory per CTA; a sm_89 SM holds at most 102400"):
    d.encode("compute", [("exec", prog, 0, (1, 1, 1), (32, 1, 1))])


# ==== 5. local memory for kernels with a stack ===================================================================
def _spill_ptx(arch: str, n: int = 48) -> str:
  lines = [".visible .entry spill(.param .u64 out, .param .u64 inp) .maxnreg 16", "{", f"  .reg .f32 %f<{n + 2}>;",
           "  .reg .b64 %rd<8>;", "  .reg .b32 %r<4>;", "  ld.param.u64 %rd1, [out];", "  ld.param.u64 %rd2, [inp];",
           "  mov.u32 %r1, %tid.x;", "  mul.wide.u32 %rd3, %r1, 4;", "  add.u64 %rd4, %rd2, %rd3;"]
  lines += [f"  ld.global.volatile.f32 %f{i}, [%rd4+{256 * i}];" for i in range(n)]
  lines += [f"  mov.f32 %f{n}, 0f00000000;"]
  lines += [f"  fma.rn.f32 %f{n}, %f{i}, %f{(i * 7) % n}, %f{n};" for i in range(n)]
  lines += ["  add.u64 %rd5, %rd1, %rd3;", f"  st.global.f32 [%rd5], %f{n};", "  ret;", "}"]
  return _ptx(arch, "\n".join(lines) + "\n")


def _spill_inputs(d: NVDriver, n: int = 48):
  data = (np.arange(n * 64, dtype=np.float32) % 7).reshape(n, 64)       # small integers: every fma is exact
  inp, out = d.alloc(data.nbytes), d.alloc(4 * 32)
  d.view(inp.addr, data.nbytes)[:] = data.tobytes()
  want = sum(data[i, :32] * data[(i * 7) % n, :32] for i in range(n))
  return inp, out, want


def test_the_spilling_kernel_spills(tmp_path):
  """ptxas -v says so (the oracle); load_cubin's stack size agrees."""
  for arch in ("sm_80", "sm_90"):
    src = _spill_ptx(arch)
    (tmp_path / "spill.ptx").write_text(src)
    proc = subprocess.run([find_ptxas(), f"-arch={arch}", "-v", str(tmp_path / "spill.ptx"), "-o", str(tmp_path / "spill.cubin")],
                          capture_output=True, text=True, check=True)
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores", proc.stderr)
    assert m and int(m.group(2)) > 0, proc.stderr
    from baregrad.drivers.nv.cubin import compile_ptx
    assert load_cubin(compile_ptx(src, arch))["spill"].stack_size == int(m.group(1))


@pytest.mark.parametrize("gpu", ["GH100", "GA100", "AD102"])
def test_a_spilling_kernel_runs(gpu):
  """The stack pointer (bank 0 at DRIVER_AREA STACK_POINTER = 0xFFFDC0), HIGH_SIZE >= frame + 0x240 and the local memory
  methods. Before: bank 0's driver area zero, SHADER_LOCAL_MEMORY_LOW_SIZE = frame, no local memory: the emulated GPU
  faults (a real one would write the spills below address 0 of the local window)."""
  d = _driver(gpu)
  inp, out, want = _spill_inputs(d)
  prog = _program(d, _spill_ptx(d.target), "spill")
  assert prog.handle.stack_size > 0
  assert _run(d, prog, [out.addr, inp.addr]) is None, d.k.fault()
  np.testing.assert_array_equal(np.frombuffer(d.view(out.addr, 128), np.float32), want)
  fields = qmd.read_launch(d.qmd_version, bytes(d.view(_last_qmd(d), qmd.QMD_BYTES)))
  assert fields["local"] == (0, (prog.handle.stack_size + 0x240 + 15) // 16 * 16)
  bank0 = bytes(d.view(fields["cbufs"][0][0], 0x30))
  assert struct.unpack_from("<I", bank0, 0x28)[0] == 0xFFFDC0 == STACK_TOP
  regs = next(c for c in d.k.gpu.channels if c.chname == "compute").state[pb.SUBC_COMPUTE]
  base = regs[pb.SET_SHADER_LOCAL_MEMORY_A] << 32 | regs[pb.SET_SHADER_LOCAL_MEMORY_B]
  assert base == d._local[0].addr and regs[pb.SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_B] == d._local[2]


def test_local_memory_grows_and_the_old_one_is_freed_after_the_work_that_used_it():
  d = _driver()
  inp, out, want = _spill_inputs(d)
  small = _program(d, _spill_ptx(d.target), "spill")
  assert _run(d, small, [out.addr, inp.addr]) is None
  first = d._local[0]
  big = _program(d, _ptx(d.target, ".visible .entry big(.param .u64 out)\n{\n  .local .align 8 .b8 frame[2048];\n"
                         "  .reg .b64 %rd<4>;\n  .reg .b32 %r<3>;\n  ld.param.u64 %rd1, [out];\n  mov.u32 %r1, %tid.x;\n"
                         "  mov.u64 %rd2, frame;\n  mul.wide.u32 %rd3, %r1, 4;\n  add.u64 %rd2, %rd2, %rd3;\n"
                         "  st.local.u32 [%rd2], %r1;\n  ld.local.u32 %r2, [%rd2];\n"
                         "  add.u64 %rd1, %rd1, %rd3;\n  st.global.u32 [%rd1], %r2;\n  ret;\n}\n"), "big")
  assert big.handle.stack_size >= 2048 > small.handle.stack_size
  assert _run(d, big, [out.addr]) is None, d.k.fault()
  np.testing.assert_array_equal(np.frombuffer(d.view(out.addr, 128), np.uint32), np.arange(32))
  assert d._local[0] is not first and d._local[1] >= big.handle.local_high
  assert _run(d, small, [out.addr, inp.addr]) is None        # a smaller frame runs in the larger local memory
  np.testing.assert_array_equal(np.frombuffer(d.view(out.addr, 128), np.float32), want)
  assert first.addr not in d._live and not d._local_retired  # freed once the submission that switched had completed


def test_a_stack_outside_local_memory_or_no_local_memory_faults(monkeypatch):
  d = _driver()
  inp, out, _ = _spill_inputs(d)
  prog = _program(d, _spill_ptx(d.target), "spill")
  monkeypatch.setattr(nv_driver, "STACK_TOP", 0)                     # bank 0's stack pointer left 0, as before
  msg = _run(d, prog, [out.addr, inp.addr])
  assert re.search(r"stack frame lies at local addresses -0x[0-9a-f]+\.\.0x0 .* outside the thread's local memory", msg), msg
  monkeypatch.undo()
  d = _driver()
  inp, out, _ = _spill_inputs(d)
  prog = _program(d, _spill_ptx(d.target), "spill")
  monkeypatch.setattr(d, "_ensure_local_memory", lambda per_thread: None)    # no SET_SHADER_LOCAL_MEMORY_*
  msg = _run(d, prog, [out.addr, inp.addr])
  assert "shader local memory is not set (SET_SHADER_LOCAL_MEMORY_A/B)" in msg, msg


def test_bank0_driver_area_is_what_ptxas_code_reads(tmp_path):
  """cuobjdump -sass of kernels using each value (the oracle) against cubin.DRIVER_AREA, and the driver's bank 0."""
  uses = """.visible .entry uses(.param .u64 out, .param .u32 i)
{
  .local .align 4 .b8 arr[64];
  .shared .align 4 .b8 sh[64];
  .reg .b64 %rd<10>;
  .reg .b32 %r<8>;
  ld.param.u64 %rd1, [out];
  ld.param.u32 %r1, [i];
  mov.u64 %rd2, arr;
  cvta.local.u64 %rd3, %rd2;
  mov.u64 %rd4, sh;
  cvta.shared.u64 %rd5, %rd4;
  mul.wide.u32 %rd6, %r1, 4;
  add.u64 %rd3, %rd3, %rd6;
  add.u64 %rd5, %rd5, %rd6;
  st.u32 [%rd3], %r1;
  st.u32 [%rd5], %r1;
  bar.sync 0;
  ld.u32 %r2, [%rd3+4];
  ld.u32 %r3, [%rd5+4];
  mov.u32 %r4, %ntid.y;
  mov.u32 %r5, %nctaid.z;
  add.u32 %r2, %r2, %r3;
  add.u32 %r2, %r2, %r4;
  add.u32 %r2, %r2, %r5;
  st.global.u32 [%rd1], %r2;
  ret;
}
"""
  from baregrad.drivers.nv.cubin import compile_ptx
  for arch in ("sm_80", "sm_89", "sm_90"):
    sass = _sass(compile_ptx(_ptx(arch, uses), arch), tmp_path)
    first = re.search(r"/\*0000\*/\s+(.*?);", sass).group(1)
    assert re.fullmatch(rf"(LDC|MOV|IMAD\.MOV\.U32) R1, (RZ, RZ, )?c\[0x0\]\[{DRIVER_AREA['STACK_POINTER']:#x}\]\s*", first), first
    reads = set(re.findall(r"c\[0x0\]\[(0x[0-9a-f]+)\]", sass))
    assert {hex(DRIVER_AREA["NTID"] + 4), hex(DRIVER_AREA["NCTAID"] + 8), hex(DRIVER_AREA["LOCAL_WINDOW"])} <= reads, (arch, reads)
    if arch != "sm_90": assert hex(DRIVER_AREA["SHARED_WINDOW"]) in reads, (arch, reads)


# ==== 7. instruction-cache invalidation after program memory is rewritten ========================================
def test_reused_program_memory_runs_the_new_code():
  """A freed program's memory goes to the next program of the same size; the next compute submission invalidates the
  instruction cache first. Before: no invalidation, and the emulated GPU reports the stale instruction cache."""
  d = _driver()
  first = _add_one_works(d, 1)
  address = first.entry
  d.unload_program(first.handle)
  second = _add_one_works(d, 5)              # same size: the same address, new instructions
  assert second.entry == address


def test_stale_instruction_cache_faults(monkeypatch):
  d = _driver()
  first = _add_one_works(d, 1)
  d.unload_program(first.handle)
  monkeypatch.setattr(d, "_code_invalidation", lambda ch: [])   # no INVALIDATE_SHADER_CACHES_NO_WFI(INSTRUCTION)
  second = _program(d, _copy_kernel(d.target, 5), "copy")
  assert second.entry == first.entry
  msg = _run(d, second, [d.alloc(128).addr, d.alloc(128).addr])
  assert f"stale instruction cache: code at {first.entry:#x}" in msg and "rewritten since it was fetched" in msg, msg


def test_the_qmds_invalidate_instruction_cache_bit_also_invalidates(monkeypatch):
  """NVCBC0_QMDV04_00_INVALIDATE_INSTRUCTION_CACHE (DOC clcbc0qmd.h) invalidates before the grid's code is fetched."""
  d = _driver()
  first = _add_one_works(d, 1)
  d.unload_program(first.handle)
  monkeypatch.setattr(d, "_code_invalidation", lambda ch: [])
  real = qmd.launch_fields
  monkeypatch.setattr(qmd, "launch_fields", lambda *a, **k: {**real(*a, **k), "INVALIDATE_INSTRUCTION_CACHE": 1})
  assert _add_one_works(d, 5).entry == first.entry


def test_the_invalidation_precedes_the_launches_of_the_next_submission():
  d = _driver()
  _add_one_works(d)
  ch = d.channels["compute"]
  assert d._state_words(ch) == []                                 # nothing written since
  entry, kern = d.load_program(d.compile(_copy_kernel(d.target, 3)), "copy")
  words = d._state_words(ch)
  # the program's code goes into its memory inline (I2M) first, then the instruction caches are invalidated
  assert words[-2:] == [pb.method_header(pb.SUBC_COMPUTE, pb.INVALIDATE_SHADER_CACHES_NO_WFI, 1),
                        pb.INVALIDATE_SHADER_CACHES_NO_WFI_INSTRUCTION]
  upload = decode("pushbuf", words[:-2], 0, None, "")
  assert any(f"I2M_LOAD_INLINE_DATA x {(len(kern.text) + 3) // 4}: {len(kern.text)} bytes to {entry:#x}" in line
             for line in upload), upload
  assert d._state_words(ch) == []                                 # written once


# ==== 8. constant banks ==========================================================================================
def _f64_ptx(arch: str) -> str:
  return _ptx(arch, """.visible .entry poly(.param .u64 out)
{
  .reg .b64 %rd<4>;
  .reg .b32 %r<2>;
  .reg .f64 %fd<6>;
  ld.param.u64 %rd1, [out];
  mov.u32 %r1, %tid.x;
  cvt.rn.f64.u32 %fd1, %r1;
  mul.rn.f64 %fd2, %fd1, 0d3FB999999999999A;
  add.rn.f64 %fd3, %fd2, 0d400921FB54442D18;
  fma.rn.f64 %fd4, %fd3, 0d3FE6A09E667F3BCD, 0d3FF6A09E667F3BCD;
  mul.wide.u32 %rd2, %r1, 8;
  add.u64 %rd3, %rd1, %rd2;
  st.global.f64 [%rd3], %fd4;
  ret;
}
""")


@pytest.mark.parametrize("gpu", ["GA100", "AD102"])
def test_constant_bank_2_is_bound(gpu, tmp_path):
  """On sm_80 .. sm_89 ptxas puts 64-bit immediates into bank 2 (the SASS reads c[0x2][...]: the oracle). Before: only
  bank 0 was bound (a real GPU reads garbage there); the emulated GPU refuses the launch."""
  d = _driver(gpu)
  src = _f64_ptx(d.target)
  prog = _program(d, src, "poly")
  assert re.search(r"c\[0x2\]\[0x[0-9a-f]+\]", _sass(prog.binary, tmp_path))
  assert 2 in prog.handle.const_banks and prog.handle.relocations == []
  out = d.alloc(8 * 32)
  assert _run(d, prog, [out.addr]) is None, d.k.fault()
  np.testing.assert_array_equal(np.frombuffer(d.view(out.addr, 256), np.float64), _poly_reference(np.arange(32.0)))
  bound = qmd.read_launch(d.qmd_version, bytes(d.view(_last_qmd(d), qmd.QMD_BYTES)))["cbufs"]
  addr, size = bound[2]
  assert bytes(d.view(addr, len(prog.handle.const_banks[2]))) == prog.handle.const_banks[2] and size >= len(prog.handle.const_banks[2])


def _poly_reference(x):
  c = [struct.unpack(">d", bytes.fromhex(h))[0] for h in ("3FB999999999999A", "400921FB54442D18", "3FE6A09E667F3BCD",
                                                         "3FF6A09E667F3BCD")]
  a = x * c[0] + c[1]        # mul.rn then add.rn: numpy rounds each
  return [_fma(v, c[2], c[3]) for v in a]


def _fma(a: float, b: float, c: float) -> float:
  """a * b + c rounded once (exact rational arithmetic)."""
  from fractions import Fraction
  return float(Fraction(a) * Fraction(b) + Fraction(c))


def test_unbound_constant_bank_faults(monkeypatch):
  d = _driver("GA100")
  prog = _program(d, _f64_ptx(d.target), "poly")
  prog.handle.bank_addrs = {}                                    # bank 0 only, as before
  msg = _run(d, prog, [d.alloc(256).addr])
  assert re.search(r"the kernel reads constant bank 2 \(\.nv\.constant2, \d+ bytes\) but the QMD binds no constant buffer 2",
                   msg), msg


def test_renderer_kernels_on_ampere_use_bank_2_and_compute(monkeypatch):
  """baregrad's own kernels for sm_80 read ptxas's bank 2 (float64 sin's polynomial), so binding it is required."""
  from baregrad.compiler import codegen, schedule
  from baregrad.hcq.device import Device
  from baregrad.tensor import Tensor
  dev = Device("NV", _driver("GA100"))
  monkeypatch.setitem(Device._open, "NV", dev)
  monkeypatch.setattr(codegen, "_programs", {})
  monkeypatch.setattr(schedule, "_plans", {})
  x = np.linspace(-3, 3, 64)
  t = Tensor(x, device="NV").sin()
  (item,) = [i for i in t.schedule() if i.program is not None]
  assert 2 in load_cubin(item.program.binary)[item.program.name].const_banks
  np.testing.assert_allclose(t.numpy(), np.sin(x), rtol=1e-12, atol=1e-14)


def test_cubin_with_relocations_is_refused():
  """A .global variable's address comes from a relocation (.rela.nv.constant4); the driver does not apply relocations,
  and baregrad's renderer never produces them (no .global / .const variables, no function pointers)."""
  d = _driver()
  src = _ptx("sm_90", """.global .align 4 .u32 counter[4];
.visible .entry rel(.param .u64 out)
{
  .reg .b64 %rd<3>;
  .reg .b32 %r<2>;
  ld.param.u64 %rd1, [out];
  mov.u64 %rd2, counter;
  ld.global.u32 %r1, [%rd2];
  st.global.u32 [%rd1], %r1;
  ret;
}
""")
  with pytest.raises(NVError, match=r"kernel rel: the cubin has relocations \(\.rela\.nv\.constant4: 1\) and this driver "
                                    r"does not apply relocations"):
    d.load_program(d.compile(src), "rel")


# ==== the class list of each GPU =================================================================================
# OGKM 580.142 src/nvidia/generated/g_gpu_class_list.c: the compute / 3D / copy / GPFIFO / usermode classes each chip lists
# (3D: AMPERE_A 0xC697, ADA_A 0xC997, HOPPER_A 0xCB97; channels: VOLTA 0xC36F, TURING 0xC46F, AMPERE 0xC56F, HOPPER 0xC86F;
# usermode: VOLTA 0xC361, TURING 0xC461, AMPERE 0xC561, HOPPER 0xC661), and how many class ids each lists
ENGINE_CLASSES = {
  "GA100": {0xC697, 0xC6C0, 0xC6B5, 0xC36F, 0xC46F, 0xC56F, 0xC361, 0xC461, 0xC561},
  "AD102": {0xC997, 0xC9C0, 0xC7B5, 0xC36F, 0xC46F, 0xC56F, 0xC361, 0xC461, 0xC561},
  "GH100": {0xCB97, 0xCBC0, 0xC8B5, 0xC36F, 0xC46F, 0xC56F, 0xC86F, 0xC361, 0xC461, 0xC561, 0xC661},
}
ENGINE_IDS = {0xC697, 0xC997, 0xCB97, 0xC6C0, 0xC7C0, 0xC9C0, 0xCBC0, 0xC6B5, 0xC7B5, 0xC8B5, 0xC36F, 0xC46F, 0xC56F,
              0xC86F, 0xC361, 0xC461, 0xC561, 0xC661}
PICKS = {"GA100": (0xC6C0, 0xC6B5, 0xC56F, 0xC561, "sm_80", (3, 0)), "AD102": (0xC9C0, 0xC7B5, 0xC56F, 0xC561, "sm_89", (3, 0)),
         "GH100": (0xCBC0, 0xC8B5, 0xC86F, 0xC661, "sm_90", (4, 0))}
COUNTS = {"GA100": 99, "AD102": 113, "GH100": 107}


@pytest.mark.parametrize("gpu", ["GA100", "AD102", "GH100"])
def test_each_gpu_lists_its_chips_classes_and_the_driver_picks_from_them(gpu):
  d = _driver(gpu)
  p = d.rm.control(d.device, rm.NV0080_CTRL_CMD_GPU_GET_CLASSLIST_V2)
  listed = list(p.classList[0:p.numClasses])
  assert len(listed) == len(set(listed)) == COUNTS[gpu]
  assert set(listed) & ENGINE_IDS == ENGINE_CLASSES[gpu]
  assert (d.compute_class, d.copy_class, d.channel_class, d.usermode_class, d.target, d.qmd_version) == PICKS[gpu]
  with pytest.raises(RMError, match="NV_ERR_INVALID_CLASS"):       # a class of another chip
    d.rm.alloc(d.channels["compute"].handle, 0xC7C0)
  if gpu == "GH100": assert {c for c in listed if (c & 0xFF) == 0xC0 and c >> 12 == 0xC} == {rm.HOPPER_COMPUTE_A}
  _add_one_works(d)


def test_class_ids_of_the_table_match_the_driver():
  """The emulator's class-id table (from the class headers) agrees with rm.py's (pinned in test_nv_hw_tables)."""
  shared = {name: cls for cls, name in rm.CLASS_NAMES.items() if name in CLASS_IDS}     # AMPERE_COMPUTE_B: GA102 only
  assert set(rm.CLASS_NAMES.values()) - set(shared) == {"AMPERE_COMPUTE_B"}
  assert {name: CLASS_IDS[name] for name in shared} == shared


def test_gpfifo_space_and_progress_come_from_the_fence_not_userd_gp_get(monkeypatch):
  """USERD GP_GET is written back when the PBDMA idles or on a timer (dev_pbdma.ref.txt), not per entry: a driver that
  waits on it for GPFIFO space stalls after one lap while it is stale. Here the emulated GPU never writes it back:
  more submissions than the ring has entries go through, and a blocked channel's report names the submission that
  holds it from the fence."""
  from baregrad.drivers.emu import nv_gpu
  monkeypatch.setattr(nv_gpu.ChannelProcessor, "writeback_gp_get", False)
  d = _driver()
  d.timeout = 10
  ch = d.channels["compute"]
  for _ in range(nv_driver.GPFIFO_ENTRIES + 100): d._submit_words(ch, [])     # one entry each: its fence release
  assert d.wait_value(ch.fence.addr, ch.fence_value, 30)
  assert np.frombuffer(d.view(ch.userd.addr, pb.USERD_BYTES), np.uint32)[pb.USERD_GP_GET // 4] == 0   # never written
  gate = d.alloc_polled(8)
  np.frombuffer(d.view(gate.addr, 8), np.uint64)[0] = 0
  wait = pb.Pushbuffer()
  d._semaphore(wait, gate.addr, 1, pb.SEM_OPERATION_ACQ_STRICT_GEQ)
  d._submit_words(ch, list(wait.words))
  blocked = ch.fence_value
  assert not d.wait_value(ch.fence.addr, blocked, 0.3)
  report = d._channel_report()
  assert f"compute channel is in submission {blocked} of {blocked}" in report, report
  assert f"semaphore acquire [{gate.addr:#x}] >= 1, memory holds 0" in report, report
  np.frombuffer(d.view(gate.addr, 8), np.uint64)[0] = 1
  assert d.wait_value(ch.fence.addr, blocked, 10)


def test_work_starts_at_the_doorbell_not_at_gp_put(monkeypatch):
  """A GPFIFO entry is fetched once the channel's work-submit token is written to the usermode page's
  NOTIFY_CHANNEL_PENDING (clc361.h; GPPut in USERD alone is not seen): without the doorbell nothing runs, a token that
  names no channel starts nothing, a doorbell rung before GPPut moved starts only what GPPut held then, and the next
  doorbell starts the rest. The driver rings after each GPPut (NVDriver._publish)."""
  d = _driver()
  gpu = d.k.gpu
  ch = d.channels["compute"]
  userd = np.frombuffer(d.view(ch.userd.addr, pb.USERD_BYTES), np.uint32)
  bell = np.frombuffer(d.view(d.doorbell + pb.USERMODE_NOTIFY_CHANNEL_PENDING, 4), np.uint32)
  def seen():     # the GPU has consumed the last doorbell (the register reads back 0)
    deadline = time.monotonic() + 10
    while bell[0] and time.monotonic() < deadline: time.sleep(1e-3)
    assert not bell[0]
  monkeypatch.setattr(NVDriver, "_publish", lambda self, c, u: u.__setitem__(pb.USERD_GP_PUT // 4, c.put))   # no doorbell
  seen()                                                              # (the driver's own last one, when it opened)
  d._submit_words(ch, [])
  assert not d.wait_value(ch.fence.addr, ch.fence_value, 0.3)        # GPPut moved, no doorbell: the entry waits
  bell[0] = 0x7777
  seen()
  assert not d.wait_value(ch.fence.addr, ch.fence_value, 0.3) and gpu.unknown_tokens == 1     # no such channel
  bell[0] = ch.token
  assert d.wait_value(ch.fence.addr, ch.fence_value, 10)             # rung: it runs
  put = int(userd[pb.USERD_GP_PUT // 4])
  bell[0] = ch.token                                                  # rung before the next GPPut moves
  seen()
  d._submit_words(ch, [])
  assert int(userd[pb.USERD_GP_PUT // 4]) != put
  assert not d.wait_value(ch.fence.addr, ch.fence_value, 0.3)
  monkeypatch.undo()
  d._submit_words(ch, [])                                             # rings: both submissions run
  assert d.wait_value(ch.fence.addr, ch.fence_value, 10)


@pytest.mark.parametrize("offset,timestamp,ok", [(0, True, True), (8, True, False), (8, False, True), (4, False, False)])
def test_semaphore_alignment(offset, timestamp, ok):
  """dev_pbdma.ref.txt: a 64-bit semaphore payload at an 8-byte aligned address, a timestamped release at a 16-byte
  aligned one (PBDMA_INTR_0_SEMAPHORE otherwise); the driver's signals are 16-byte slots."""
  d = _driver()
  mem = d.alloc_polled(64)
  ch = d.channels["compute"]
  p = pb.Pushbuffer()
  d._semaphore(p, mem.addr + offset, 7, pb.SEM_OPERATION_RELEASE | (pb.SEM_RELEASE_TIMESTAMP if timestamp else 0))
  d._submit_words(ch, list(p.words))
  if ok:
    assert d.wait_value(ch.fence.addr, ch.fence_value, 10) and d._u64(mem.addr + offset) == 7
  else:
    assert not d.wait_value(ch.fence.addr, ch.fence_value, 10)
    assert "aligned address (PBDMA_INTR_0_SEMAPHORE)" in d.k.fault(), d.k.fault()


def test_launches_the_register_file_cannot_hold_are_refused(monkeypatch):
  """64K registers per SM and per block, given to warps in units of 256 (CUDA C++ Programming Guide's technical
  specifications, the occupancy calculator): the driver refuses such a launch before it, naming the fix; a QMD that
  asks for it anyway faults on the emulated GPU (a GR exception), as does a REGISTER_COUNT below what the code uses."""
  d = _driver()
  prog = _program(d, _copy_kernel(d.target, 1), "copy")
  inp, out = d.alloc(4096), d.alloc(4096)
  monkeypatch.setattr(prog.handle, "registers", 72)           # 72 x 32 = 2304 per warp: 28 warps (896 threads) fit
  assert _run(d, prog, [out.addr, inp.addr], block=(896, 1, 1)) is None, d.k.fault()
  with pytest.raises(NVError, match=r"1024 threads of 72 registers each need 73728 registers, more than an SM's "
                                    r"register file of 65536 .*launch at most 896 threads per block"):
    _run(d, prog, [out.addr, inp.addr], block=(1024, 1, 1))
  monkeypatch.setattr(qmd, "REGISTER_FILE", 1 << 20)          # the driver's check off: the GPU's own
  fault = _run(d, prog, [out.addr, inp.addr], block=(1024, 1, 1))
  assert fault and "1024 threads x REGISTER_COUNT 72 need 73728 registers" in fault, fault
  d2 = _driver()
  prog2 = _program(d2, _copy_kernel(d2.target, 1), "copy")
  real = prog2.handle.registers
  monkeypatch.setattr(prog2.handle, "registers", 0)
  fault = _run(d2, prog2, [d2.alloc(4096).addr, d2.alloc(4096).addr])
  assert real > 0 and fault and f"REGISTER_COUNT 0 is less than the {real} registers" in fault, fault


def test_escape_level_errors_are_einval_with_the_status_untouched():
  """An RM escape on the wrong kind of file (an /dev/nvidiactl escape on /dev/nvidia0, or the other way): nvidia_ioctl
  returns -EINVAL and writes no status (escape.c NV_CTL_DEVICE_ONLY / NV_ACTUAL_DEVICE_ONLY, nv.c); the driver
  names the escape and what it means."""
  d = _driver()
  p = ffi.new("NVOS21_PARAMETERS *")
  p.hRoot, p.hObjectParent, p.hObjectNew, p.hClass, p.status = d.rm.root, d.rm.root, 0xBEEF0001, rm.NV01_DEVICE_0, 0x1234
  with pytest.raises(nv_driver.EscapeError, match=r"NV_ESC_RM_ALLOC: the NVIDIA kernel module refused the call itself "
                                                  r".*EINVAL.*the parameter size \(\d+ bytes\) or the file") as e:
    d.rm.escape(d.fd_dev, rm.NV_ESC_RM_ALLOC, p)
  assert e.value.errno == errno.EINVAL and p.status == 0x1234       # the status was not written
  q = ffi.new("nv_ioctl_nvos02_parameters_with_fd *")
  q.params.status = 0x4321
  with pytest.raises(nv_driver.EscapeError):
    d.rm.escape(d.fd_ctl, rm.NV_ESC_RM_ALLOC_MEMORY, q)                # a device-file escape on /dev/nvidiactl
  assert q.params.status == 0x4321


def test_a_channel_error_is_seen_through_the_notifier_at_once_and_the_groups_are_made_anew(monkeypatch):
  """The wait loop reads RM's error notifier (the real kernel interface has no `fault()`), so a channel error ends a
  wait at once, not after the timeout; recovery frees and recreates the channel groups and context shares (RM's
  recovery works on the whole TSG; the emulated RM takes no new channel into a TSG that had an error)."""
  d = _driver()
  monkeypatch.setattr(d.k, "fault", lambda: None)           # as the real kernel interface: only the notifier tells
  ch = d.channels["compute"]
  old_groups, old_shares = dict(d.groups), dict(d.ctxshares)
  d._submit_words(ch, [0xE0000000 | 5])                       # an undefined pushbuffer opcode: a PBDMA error
  start = time.monotonic()
  assert not d.wait_value(ch.fence.addr, ch.fence_value, 30)
  assert time.monotonic() - start < 1.0
  with pytest.raises(nv_driver.ChannelReset, match=r"GPU channel error 32 \(ROBUST_CHANNEL_PBDMA_ERROR"):
    d.check_faults("NV")
  assert set(d.groups.values()).isdisjoint(old_groups.values()) and set(d.ctxshares.values()).isdisjoint(old_shares.values())
  _add_one_works(d)                                           # the new channels run


GENERIC_SHARED_PTX = """.visible .entry gshared(.param .u64 out)
{
  .shared .align 4 .b8 buf[128];
  .reg .b64 %rd<8>;
  .reg .b32 %r<4>;
  ld.param.u64 %rd1, [out];
  mov.u32 %r1, %tid.x;
  mov.u64 %rd2, buf;
  cvta.shared.u64 %rd3, %rd2;
  mul.wide.u32 %rd4, %r1, 4;
  add.u64 %rd5, %rd3, %rd4;
  st.u32 [%rd5], %r1;
  bar.sync 0;
  ld.u32 %r2, [%rd5];
  add.u32 %r2, %r2, 5;
  add.u64 %rd6, %rd1, %rd4;
  st.global.u32 [%rd6], %r2;
  ret;
}
"""


@pytest.mark.parametrize("gpu", ["GH100", "GA100"])
def test_generic_shared_addresses_need_a_window_the_gpu_can_form(gpu, monkeypatch):
  """Hopper forms a generic shared address from the window's high 32 bits (SR_SWINHI): the window is 4 GiB aligned
  (Mesa NVK: "shared memory window needs 4GB alignment on hopper+"); the driver's 0xFE000000 made such addresses
  global ones. A kernel storing through a generic pointer to shared memory runs; with the old window it faults."""
  d = _driver(gpu)
  out = d.alloc(4 * 32)
  prog = _program(d, _ptx(d.target, GENERIC_SHARED_PTX), "gshared")
  assert _run(d, prog, [out.addr]) is None, d.k.fault()
  np.testing.assert_array_equal(np.frombuffer(d.view(out.addr, 4 * 32), np.uint32), np.arange(32) + 5)
  if gpu == "GH100":
    assert d.shared_window == 1 << 32
    monkeypatch.setattr(nv_driver, "SHARED_WINDOW_HOPPER", 0xFE00_0000)
    old = _driver(gpu)
    fault = _run(old, _program(old, _ptx(old.target, GENERIC_SHARED_PTX), "gshared"), [old.alloc(128).addr])
    assert fault and "is not 4 GiB aligned" in fault, fault


@pytest.mark.parametrize("gpu", ["GH100", "GA100"])
def test_uvm_channel_region_comes_from_rm_and_is_2mib_aligned(gpu):
  """uvm.h (UvmRegisterChannel): the region's size and alignment come from NV2080_CTRL_CMD_GR_GET_CTX_BUFFER_SIZE; UVM
  places each context buffer at its alignment inside it and refuses what does not fit (NV_ERR_INVALID_ADDRESS,
  uvm_user_channel.c). The driver's fixed, page-aligned 64 MiB did not hold the emulated H200's buffers."""
  d = _driver(gpu)
  size = lambda h: d.rm.control(d.subdevice, rm.NV2080_CTRL_CMD_GR_GET_CTX_BUFFER_SIZE,
                                _params("NV2080_CTRL_GR_GET_CTX_BUFFER_SIZE_PARAMS", hChannel=h)).totalBufferSize
  compute, copy = d.channels["compute"], d.channels["copy"]
  total = size(compute.handle)
  assert total == ctx_buffer_layout(d.k.model.chip, 0) and size(copy.handle) == total      # both GR channels
  base, length = compute.window
  assert base % (2 << 20) == 0 and length == -(-total // (2 << 20)) * (2 << 20) and copy.window == compute.window
  with pytest.raises(RMError, match="NV_ERR_INVALID_OBJECT_HANDLE"): size(d.device)
  group, ctxshare = _rm_group(d, rm.NV2080_ENGINE_TYPE_GRAPHICS)
  channel = _rm_channel(d, group, ctxshare, rm.NV2080_ENGINE_TYPE_GRAPHICS)
  old = d._take_va(64 << 20) + 0x34000                         # what the driver did: page aligned, 64 MiB
  register = lambda b, n: d._uvm(rm.UVM_REGISTER_CHANNEL, gpuUuid=GPU_UUID, rmCtrlFd=d.fd_ctl, hClient=d.rm.root,
                                 hChannel=channel, base=b, length=n)
  if gpu == "GH100":
    with pytest.raises(RMError, match="NV_ERR_INVALID_ADDRESS"): register(old, 64 << 20)
  fresh = d._take_va(length, align=2 << 20)
  register(fresh, length)


def _params(struct_name: str, **values):
  p = ffi.new(struct_name + " *")
  for k, v in values.items(): setattr(p, k, v)
  return p


def test_hang_and_fault_reports_name_the_last_command_done_and_the_first_not():
  """Trace markers (settings.QUEUE_MARKERS): each command releases its sequence number when done (a semaphore release
  after WFI); a wait that never passes is reported with the command before it (done) and itself (not done), and a
  channel error names where each channel stands."""
  import types
  d = _driver()
  d.timeout = 0.3
  gate, done = d.alloc_polled(16), d.alloc_polled(16)
  sig = lambda mem, name: types.SimpleNamespace(addr=mem.addr, timestamp_addr=mem.addr + 8, name=name)
  d.submit("compute", d.encode("compute", [("signal", sig(done, "done"), 1), ("barrier",), ("wait", sig(gate, "gate"), 7),
                                           ("signal", sig(done, "done"), 2)]))
  assert d.wait_value(done.addr, 1, 5) and not d.wait_value(done.addr, 2, 0.3)
  with pytest.raises(nv_driver.ChannelTimeout) as e: d.check_faults("NV")
  assert re.search(r"last command done #\d+ \(barrier\), first not done #\d+ \(wait for gate 7\)", str(e.value)), str(e.value)
  np.frombuffer(d.view(gate.addr, 8), np.uint64)[0] = 7
  assert d.wait_value(done.addr, 2, 5) and "every command done (last #4 (signal done 2))" in d.marker_report("compute")
  d._submit_words(d.channels["compute"], [0xE0000000 | 5])      # an undefined opcode: a PBDMA error
  assert not d.wait_value(d.channels["compute"].fence.addr, d.channels["compute"].fence_value, 5)
  with pytest.raises(nv_driver.ChannelReset, match=r"compute channel: every command done \(last #4 \(signal done 2\)\)"):
    d.check_faults("NV")


def test_a_program_larger_than_one_inline_write_is_uploaded_whole():
  """Program code reaches its memory in inline writes of at most I2M_MAX_WORDS words each: a kernel of ~48 KiB of SASS
  (3000 dependent multiply-adds) takes several, and runs as numpy computes it (the emulated GPU faults a launch whose
  code in memory is not the cubin's .text)."""
  steps = 3000
  body = "\n".join("  mad.lo.u32 %r2, %r2, %r3, %r4;" for _ in range(steps))
  ptx = _ptx("sm_90", f""".visible .entry big(.param .u64 out)
{{
  .reg .b64 %rd<4>;
  .reg .b32 %r<6>;
  ld.param.u64 %rd1, [out];
  mov.u32 %r1, %tid.x;
  add.u32 %r2, %r1, 7;
  or.b32 %r3, %r1, 3;
  xor.b32 %r4, %r1, 0x9e3779b9;
{body}
  mul.wide.u32 %rd2, %r1, 4;
  add.u64 %rd3, %rd1, %rd2;
  st.global.u32 [%rd3], %r2;
  ret;
}}
""")
  d = _driver()
  prog = _program(d, ptx, "big")
  code = prog.handle.text
  assert len(code) > 4 * pb.I2M_MAX_WORDS, len(code)            # more than one inline write
  out = d.alloc(4 * 32)
  assert _run(d, prog, [out.addr]) is None
  t = np.arange(32, dtype=np.uint64)
  r2, r3, r4 = t + 7, t | 3, t ^ 0x9E3779B9
  for _ in range(steps): r2 = (r2 * r3 + r4) & 0xFFFFFFFF
  np.testing.assert_array_equal(np.frombuffer(d.view(out.addr, 4 * 32), np.uint32), r2.astype(np.uint32))


def test_a_program_whose_upload_was_dropped_by_a_channel_error_is_sent_again():
  """Program code travels in the compute channel's next submission: a program loaded while the channel is stopped at
  a bad method has its upload queued behind the fault, dropped with the channel. After the reset the driver sends
  every live program again, so the program runs (the emulated GPU faults a launch whose code is not in memory)."""
  import types
  d = _driver()
  _add_one_works(d)
  gate = d.alloc_polled(16)                                        # the channel waits here until the test lets go
  d.submit("compute", d.encode("compute", [("wait", types.SimpleNamespace(addr=gate.addr), 1)]))
  d.submit("compute", _bad_method())
  prog = _program(d, _copy_kernel(d.target, 9), "copy")
  inp, out = d.alloc(4 * 32), d.alloc(4 * 32)
  np.frombuffer(d.view(inp.addr, 4 * 32), np.uint32)[:] = np.arange(32)
  kernargs = d.alloc(16)
  np.frombuffer(d.view(kernargs.addr, 16), np.uint64)[:] = [out.addr, inp.addr]
  d.submit("compute", d.encode("compute", [("exec", prog, kernargs.addr, (1, 1, 1), (32, 1, 1))]))   # behind the fault
  assert not d._uploads                                            # its code went into that submission
  np.frombuffer(d.view(gate.addr, 8), np.uint64)[0] = 1
  end = time.monotonic() + 10
  while d.k.fault() is None and time.monotonic() < end: time.sleep(0.005)
  with pytest.raises(nv_driver.ChannelReset): d.check_faults("NV")
  assert _run(d, prog, [out.addr, inp.addr]) is None
  np.testing.assert_array_equal(np.frombuffer(d.view(out.addr, 4 * 32), np.uint32), np.arange(32) + 9)
