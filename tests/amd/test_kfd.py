"""The AMD KFD driver: ioctl structs vs the system header, packet encoders vs the headers' field macros, and the
driver end to end on the emulated KFD + gfx1100 (EMU=1): memory, SDMA copies, signals, events, a hand-assembled
kernel through PM4, bound queues, hangs and faults reported with queue, packet and address."""
import os, shutil, subprocess, sys, threading, time, types
import numpy as np
import pytest

from baregrad.drivers import settings
from baregrad.drivers.amd import kfd, pm4, sdma

HEADER = "/usr/include/linux/kfd_ioctl.h"
needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None or not os.path.exists(HEADER), reason="needs gcc and kfd_ioctl.h")


def _run_c(tmp_path, body: str, includes: str = "") -> str:
  src = tmp_path / "probe.c"
  src.write_text(f"#include <stdio.h>\n#include <stddef.h>\n{includes}\nint main(void) {{\n{body}\nreturn 0;\n}}\n")
  exe = tmp_path / "probe"
  # kfd_ioctl.h includes <drm/drm.h> only for the __u32/__u64 types; without libdrm's headers a stub gives them
  (tmp_path / "inc" / "drm").mkdir(parents=True, exist_ok=True)
  (tmp_path / "inc" / "drm" / "drm.h").write_text("#include <linux/types.h>\n")
  extra = [] if os.path.exists("/usr/include/drm/drm.h") else ["-I", str(tmp_path / "inc")]
  subprocess.run(["gcc", "-O0", *extra, "-o", str(exe), str(src)], check=True, capture_output=True, text=True)
  return subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout


def _structs():
  """Every struct in our cdef with its primitive fields (nested unions/structs flattened by name)."""
  seen = {}
  for name, (_, _, struct) in kfd.IOCTLS.items(): seen[struct] = name
  seen["kfd_event_data"] = None
  seen["kfd_hsa_memory_exception_data"] = None
  return seen


# ---- layouts and request numbers vs /usr/include/linux/kfd_ioctl.h ----

@needs_gcc
def test_struct_layouts_and_ioctl_numbers_match_header(tmp_path):
  lines = []
  for struct, ioctl_name in _structs().items():
    t = kfd.ffi.typeof(f"struct {struct}")
    guard = "#ifdef AMDKFD_IOC_RUNTIME_ENABLE\n" if struct == "kfd_ioctl_runtime_enable_args" else ""
    lines.append(guard + f'printf("size {struct} %zu\\n", sizeof(struct {struct}));')
    for fname, field in t.fields:
      if not fname: continue
      lines.append(f'printf("offset {struct}.{fname} %zu\\n", offsetof(struct {struct}, {fname}));')
    if ioctl_name: lines.append(f'printf("request {ioctl_name} %lu\\n", (unsigned long)AMDKFD_IOC_{ioctl_name});')
    if guard: lines.append("#endif")
  out = _run_c(tmp_path, "\n".join(lines), "#include <linux/kfd_ioctl.h>")
  checked = 0
  for line in out.splitlines():
    kind, what, value = line.split()
    value = int(value)
    if kind == "size": assert kfd.ffi.sizeof(f"struct {what}") == value, what
    elif kind == "offset":
      struct, fname = what.split(".")
      assert kfd.ffi.offsetof(f"struct {struct}", fname) == value, what
    else: assert kfd.REQUEST[what] == value, f"AMDKFD_IOC_{what}: ours {kfd.REQUEST[what]:#x}, header {value:#x}"
    checked += 1
  assert checked > 60
  # flags and constants
  consts = {"KFD_IOC_ALLOC_MEM_FLAGS_VRAM": kfd.ALLOC_VRAM, "KFD_IOC_ALLOC_MEM_FLAGS_GTT": kfd.ALLOC_GTT,
            "KFD_IOC_ALLOC_MEM_FLAGS_USERPTR": kfd.ALLOC_USERPTR, "KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE": kfd.ALLOC_WRITABLE,
            "KFD_IOC_ALLOC_MEM_FLAGS_EXECUTABLE": kfd.ALLOC_EXECUTABLE, "KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC": kfd.ALLOC_PUBLIC,
            "KFD_IOC_ALLOC_MEM_FLAGS_NO_SUBSTITUTE": kfd.ALLOC_NO_SUBSTITUTE, "KFD_IOC_ALLOC_MEM_FLAGS_COHERENT": kfd.ALLOC_COHERENT,
            "KFD_IOC_ALLOC_MEM_FLAGS_UNCACHED": kfd.ALLOC_UNCACHED, "KFD_IOC_QUEUE_TYPE_COMPUTE": kfd.QUEUE_TYPE_COMPUTE,
            "KFD_IOC_QUEUE_TYPE_SDMA": kfd.QUEUE_TYPE_SDMA, "KFD_IOC_EVENT_SIGNAL": kfd.EVENT_SIGNAL,
            "KFD_IOC_EVENT_MEMORY": kfd.EVENT_MEMORY, "KFD_IOC_EVENT_HW_EXCEPTION": kfd.EVENT_HW_EXCEPTION,
            "KFD_IOC_WAIT_RESULT_TIMEOUT": kfd.WAIT_TIMEOUT, "KFD_SIGNAL_EVENT_LIMIT": kfd.SIGNAL_EVENT_LIMIT,
            "KFD_MAX_QUEUE_PRIORITY": kfd.MAX_QUEUE_PRIORITY}
  out = _run_c(tmp_path, "\n".join(f'printf("%s %lu\\n", "{k}", (unsigned long)(unsigned)({k}));' for k in consts),
               "#include <linux/kfd_ioctl.h>")
  for line in out.splitlines():
    k, v = line.split()
    assert consts[k] == int(v), k


# ---- packet encoders vs the header macros (transcribed as C: shifts and masks, compiled by gcc) ----

PM4_C = r"""
#define PACKET3(op, n) ((3u << 30) | (((op) & 0xFF) << 8) | ((n) & 0x3FFF) << 16)
#define PACKET3_COMPUTE(op, n) (PACKET3(op, n) | 1 << 1)
#define WAIT_REG_MEM_FUNCTION(x) ((x) << 0)
#define WAIT_REG_MEM_MEM_SPACE(x) ((x) << 4)
#define WAIT_REG_MEM_OPERATION(x) ((x) << 6)
#define WAIT_REG_MEM_ENGINE(x) ((x) << 8)
#define INDIRECT_BUFFER_VALID (1u << 23)
#define EVENT_TYPE(x) ((x) << 0)
#define EVENT_INDEX(x) ((x) << 8)
#define RM_EVENT_TYPE(x) ((x) << 0)
#define RM_EVENT_INDEX(x) ((x) << 8)
#define RM_GCR_GLM_WB (1u << 12)
#define RM_GCR_GLM_INV (1u << 13)
#define RM_GCR_GL2_WB (1u << 21)
#define RM_GCR_SEQ (1u << 22)
#define RM_CACHE_POLICY(x) ((x) << 25)
#define RM_DATA_SEL(x) ((unsigned)(x) << 29)
#define RM_INT_SEL(x) ((x) << 24)
#define DMA_CP_SYNC (1u << 31)
#define DMA_CMD_RAW_WAIT (1u << 30)
"""


@needs_gcc
def test_pm4_encoder_matches_header_macros(tmp_path):
  addr = 0x7F12_3456_7000
  cases = {
    "wait": (pm4.packet("WAIT_REG_MEM", function=5, mem_space=1, addr_lo=addr & 0xFFFFFFFF, addr_hi=addr >> 32,
                        reference=7, mask=0xFFFFFFFF, poll_interval=4),
             f"PACKET3_COMPUTE(0x3C, 5), WAIT_REG_MEM_FUNCTION(5) | WAIT_REG_MEM_MEM_SPACE(1) | WAIT_REG_MEM_OPERATION(0) | "
             f"WAIT_REG_MEM_ENGINE(0), {addr & 0xFFFFFFFF:#x}u, {addr >> 32:#x}u, 7, 0xFFFFFFFFu, 4"),
    "ib": (pm4.packet("INDIRECT_BUFFER", ib_base_lo=addr & 0xFFFFFFFC, ib_base_hi=(addr >> 32) & 0xFFFF, ib_size=300, valid=1),
           f"PACKET3_COMPUTE(0x3F, 2), {addr & 0xFFFFFFFC:#x}u, {(addr >> 32) & 0xFFFF:#x}u, INDIRECT_BUFFER_VALID | 300"),
    "event": (pm4.packet("EVENT_WRITE", event_type=pm4.CS_PARTIAL_FLUSH, event_index=4),
              "PACKET3_COMPUTE(0x46, 0), EVENT_TYPE(7) | EVENT_INDEX(4)"),
    "release": (pm4.packet("RELEASE_MEM", event_type=0x14, event_index=5, gcr_glm_wb=1, gcr_glm_inv=1, gcr_gl2_wb=1, gcr_seq=1,
                           cache_policy=3, data_sel=2, int_sel=2, addr_lo=addr & 0xFFFFFFFF, addr_hi=addr >> 32,
                           data_lo=0x1234, data_hi=1, int_ctxid=9),
                "PACKET3_COMPUTE(0x49, 6), RM_GCR_SEQ | RM_GCR_GL2_WB | RM_GCR_GLM_INV | RM_GCR_GLM_WB | RM_CACHE_POLICY(3) | "
                "RM_EVENT_TYPE(0x14) | RM_EVENT_INDEX(5), RM_DATA_SEL(2) | RM_INT_SEL(2), "
                f"{addr & 0xFFFFFFFF:#x}u, {addr >> 32:#x}u, 0x1234, 1, 9"),
    "dma": (pm4.packet("DMA_DATA", src_addr_lo=1, src_addr_hi=2, dst_addr_lo=3, dst_addr_hi=4, byte_count=4096, cp_sync=1,
                       raw_wait=1),
            "PACKET3_COMPUTE(0x50, 5), DMA_CP_SYNC, 1, 2, 3, 4, DMA_CMD_RAW_WAIT | 4096"),
    "sh": (pm4.set_sh_reg("COMPUTE_PGM_LO", 0x11, 0x22), "PACKET3_COMPUTE(0x76, 2), 0x20c, 0x11, 0x22"),
    "nop1": (pm4.nop(1), "PACKET3_COMPUTE(0x10, 0x3FFF)"),
  }
  body = "\n".join(f'{{ unsigned w[] = {{ {c} }}; printf("{k}"); for (unsigned i = 0; i < sizeof(w)/4; i++) '
                   f'printf(" %u", w[i]); printf("\\n"); }}' for k, (_, c) in cases.items())
  for line in _run_c(tmp_path, body, PM4_C).splitlines():
    k, *words = line.split()
    assert cases[k][0] == [int(w) for w in words], k
  # and decoding gives the fields back
  name, f, size = pm4.decode(cases["wait"][0], 0)
  assert (name, f["function"], f["reference"], size) == ("WAIT_REG_MEM", 5, 7, 7)
  # SET_SH_REG offsets: gc_11_0_0_offset.h register - 0x19a0 (COMPUTE_PGM_LO 0x1bac -> 0x20c, USER_DATA_0 0x1be0 -> 0x240)
  assert pm4.sh_offset("COMPUTE_USER_DATA_0") == 0x240 and pm4.sh_offset("COMPUTE_DISPATCH_INITIATOR") == 0x200


SDMA_C = r"""
#define F(word_shift, mask, x) (((x) & (mask)) << (word_shift))
#define COPY_HDR(op, sub) (F(0, 0xFF, op) | F(8, 0xFF, sub))
#define COPY_COUNT(x) F(0, 0x3FFFFFFF, x)
#define FENCE_HDR F(0, 0xFF, 5)
#define POLL_HDR(func, mem) (F(0, 0xFF, 8) | F(28, 0x7, func) | F(31, 0x1, mem))
#define POLL_DW5(interval, retry) (F(0, 0xFFFF, interval) | F(16, 0xFFF, retry))
#define TS_HDR (F(0, 0xFF, 13) | F(8, 0xFF, 2))
#define TRAP_INT(x) F(0, 0x0FFFFFFF, x)
#define NOP_HDR(count) F(16, 0x3FFF, count)
"""


@needs_gcc
def test_sdma_encoder_matches_header_macros(tmp_path):
  cases = {
    "copy": (sdma.copy_linear(0x2000_0000_1000, 0x3000_0000_2000, 100),
             "COPY_HDR(1, 0), COPY_COUNT(99), 0, 0x2000u, 0x3000u, 0x1000u, 0x2000u"),
    "fence": (sdma.packet("FENCE", addr_lo=0x1000, addr_hi=0x7f, data=42), "FENCE_HDR, 0x1000, 0x7f, 42"),
    "poll": (sdma.packet("POLL_REGMEM", mem_poll=1, func=5, addr_lo=8, addr_hi=1, value=3, mask=0xFFFFFFFF, interval=10,
                         retry_count=0xFFF), "POLL_HDR(5, 1), 8, 1, 3, 0xFFFFFFFFu, POLL_DW5(10, 0xFFF)"),
    "ts": (sdma.packet("TIMESTAMP", addr_lo=0x40, addr_hi=2), "TS_HDR, 0x40, 2"),
    "trap": (sdma.packet("TRAP", int_context=77), "F(0, 0xFF, 6), TRAP_INT(77)"),
    "nop": (sdma.nop(3), "NOP_HDR(2), 0, 0"),
  }
  body = "\n".join(f'{{ unsigned w[] = {{ {c} }}; printf("{k}"); for (unsigned i = 0; i < sizeof(w)/4; i++) '
                   f'printf(" %u", w[i]); printf("\\n"); }}' for k, (_, c) in cases.items())
  for line in _run_c(tmp_path, body, SDMA_C).splitlines():
    k, *words = line.split()
    assert cases[k][0] == [int(w) for w in words], k
  # copies are split into chunks of at most COPY_MAX_BYTES (count = bytes - 1)
  words = sdma.copy_linear(0x10000, 0x20000, 2 * sdma.COPY_MAX_BYTES + 5)
  assert len(words) == 21 and [words[1], words[8], words[15]] == [sdma.COPY_MAX_BYTES - 1] * 2 + [4]
  assert words[14 + 3] == 0x20000 + 2 * sdma.COPY_MAX_BYTES and words[14 + 5] == 0x10000 + 2 * sdma.COPY_MAX_BYTES


# ---- the driver on the emulated KFD ----

@pytest.fixture
def drv(monkeypatch):
  monkeypatch.setattr(settings, "EMU", True)   # what EMU=1 selects
  from baregrad.drivers.amd.driver import AMDDriver
  d = AMDDriver(timeout=10)
  d.markers = False          # these tests follow each command's packets (tests/amd/test_kfd_rules.py has the markers)
  yield d
  d.close()


def _engine(d, ring):
  return d.kernel.queues[ring.queue_id]


def _poll(done, timeout: float = 10.0) -> bool:
  """Poll done() until it holds or a generous deadline passes (the assertion on its result fails then)."""
  deadline = time.monotonic() + timeout
  while not done() and time.monotonic() < deadline: time.sleep(0.001)
  return done()


def test_open_topology_and_versions(drv):
  assert drv.version == (1, 14) and drv.target == "gfx1100"
  assert drv.node.cu_count == 96 and drv.node.lds_bytes == 65536 and drv.node.props["wave_front_size"] == 32
  # context-save area as kfd_queue.c sizes it for 96 CUs of gfx11: ctl stack 40960, 96 * 0x75000 of wave state
  assert drv.node.ctl_stack_size == 40960 and drv.node.cwsr_size == 40960 + 96 * 0x75000
  assert drv.node.render_node == "/dev/dri/renderD128"


def test_alloc_map_and_gpu_view(drv):
  m = drv.alloc(10000)
  assert m.addr % 4096 == 0 and m.size == 12288
  np.frombuffer(drv.view(m.addr, 16), np.uint32)[:] = [1, 2, 3, 4]
  assert drv.kernel.memory.read(m.addr + 4, 8) == bytes([2, 0, 0, 0, 3, 0, 0, 0])    # the GPU sees the CPU's writes
  drv.free(m)
  with pytest.raises(Exception): drv.kernel.memory.read(m.addr, 4)                   # unmapped from the GPU


def _signal(addr): return types.SimpleNamespace(addr=addr, timestamp_addr=addr + 8, name="s")


def test_sdma_copy_round_trip(drv):
  n = 3 * 1000 * 1000 + 7
  host = np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8)
  a, b, sig = drv.alloc(n), drv.alloc(n), drv.alloc(4096)
  np.frombuffer(drv.view(a.addr, n), np.uint8)[:] = host
  before = _engine(drv, drv.copy).packets_done
  drv.submit("copy", drv.encode("copy", [("copy", b.addr, a.addr, n), ("signal", _signal(sig.addr), 1)]))
  assert drv.wait_value(sig.addr, 1, 10)
  assert (np.frombuffer(drv.view(b.addr, n), np.uint8) == host).all()
  sdma_engine = _engine(drv, drv.copy)
  # the submission's HDP flush, the copy, the value's two FENCEs, the event slot's FENCE, the interrupt
  assert sdma_engine.history[-6:] == ["POLL_REGMEM", "COPY_LINEAR", "FENCE", "FENCE", "FENCE", "TRAP"]
  assert sdma_engine.packets_done == before + 6
  assert "COPY_LINEAR" not in _engine(drv, drv.compute).history
  # the packets are in the SDMA ring the driver wrote: a COPY_LINEAR header with count = n - 1
  ring = drv.copy.ring
  pos = int(np.nonzero(ring == sdma.packet("COPY_LINEAR", count=0)[0])[0][0])
  assert ring[pos + 1] == n - 1 and drv.copy.rptr == drv.copy.wptr


def test_signal_round_trip_and_events(drv):
  sig, gate = drv.alloc(4096), drv.alloc(4096)
  # compute queue: wait for the host to open the gate, then signal 2**40 + 5 (64-bit RELEASE_MEM)
  drv.submit("compute", drv.encode("compute", [("wait", _signal(gate.addr), 1), ("signal", _signal(sig.addr), 2**40 + 5)]))
  assert _poll(lambda: _engine(drv, drv.compute).history[-1:] == ["WAIT_REG_MEM64"])   # the engine reached the wait
  assert np.frombuffer(drv.view(sig.addr, 8), np.uint64)[0] == 0     # blocked in WAIT_REG_MEM
  threading.Timer(0.1, lambda: np.frombuffer(drv.view(gate.addr, 8), np.uint64).__setitem__(0, 1)).start()
  start = time.monotonic()
  assert drv.wait_value(sig.addr, 2**40 + 5, 10)                   # sleeps in WAIT_EVENTS, woken by the interrupt
  assert time.monotonic() - start > 0.05                             # it waited for the gate
  assert _engine(drv, drv.compute).history[-3:] == ["WAIT_REG_MEM64", "RELEASE_MEM", "RELEASE_MEM"]   # value, event slot
  # timestamps: the 100 MHz GPU clock, from both engines, taken while the host waited for them
  submitted = time.perf_counter()
  drv.submit("compute", drv.encode("compute", [("timestamp", _signal(sig.addr))]))
  drv.submit("copy", drv.encode("copy", [("timestamp", _signal(sig.addr + 16)), ("signal", _signal(sig.addr + 32), 1)]))
  assert drv.wait_value(sig.addr + 32, 1, 10)
  assert _poll(lambda: np.frombuffer(drv.view(sig.addr + 8, 8), np.uint64)[0] != 0)
  waited = time.perf_counter() - submitted
  ts = np.frombuffer(drv.view(sig.addr, 32), np.uint64)
  assert ts[1] > 0 and ts[3] > 0 and abs(int(ts[3]) - int(ts[1])) <= (waited + 0.001) * drv.timestamp_hz


HAND_KERNEL = """
s_load_b64 s[4:5], s[0:1], 0x0
s_waitcnt lgkmcnt(0)
s_lshl_b32 s6, s2, 6
v_add_nc_u32 v3, s6, v0
v_mad_u32_u24 v2, v3, 3, 7
v_lshlrev_b32 v1, 2, v3
global_store_b32 v1, v2, s[4:5]
s_endpgm
"""


def _hand_program(drv):
  from baregrad.compiler.amd.asm import assemble
  from baregrad.drivers.amd.codeobj import KernelDescriptor, write_code_object
  kd = KernelDescriptor.for_kernel(8, kernarg_size=8, workgroup_ids=1, workitem_dims=1)
  co = write_code_object("hand", assemble(HAND_KERNEL), kd, 8)
  _, prog = drv.load_program(co, "hand")
  return types.SimpleNamespace(handle=prog, meta={}, name="hand")


def test_hand_assembled_kernel_through_pm4(drv):
  p = _hand_program(drv)
  out, args, sig = drv.alloc(4 * 256), drv.alloc(64), drv.alloc(4096)
  np.frombuffer(drv.view(args.addr, 8), np.uint64)[0] = out.addr
  drv.submit("compute", drv.encode("compute", [("exec", p, args.addr, (4, 1, 1), (64, 1, 1)), ("signal", _signal(sig.addr), 1)]))
  assert drv.wait_value(sig.addr, 1, 30)
  drv.check_faults("AMD")
  assert (np.frombuffer(drv.view(out.addr, 1024), np.uint32) == np.arange(256) * 3 + 7).all()
  hist = _engine(drv, drv.compute).history
  assert "DISPATCH_DIRECT" in hist and hist.count("SET_SH_REG") >= 7
  regs = _engine(drv, drv.compute).regs
  assert regs[pm4.REGISTERS["COMPUTE_NUM_THREAD_X"]] == 64 and regs[pm4.REGISTERS["COMPUTE_USER_DATA_0"]] == args.addr & 0xFFFFFFFF
  assert (regs[pm4.REGISTERS["COMPUTE_PGM_HI"]] << 40 | regs[pm4.REGISTERS["COMPUTE_PGM_LO"]] << 8) == p.handle.pgm_addr


def test_bound_queue_replays_through_indirect_buffer(drv):
  from baregrad.hcq.queue import Slot
  p = _hand_program(drv)
  outs, args, sig = [drv.alloc(1024), drv.alloc(1024)], drv.alloc(64), drv.alloc(4096)
  # a symbolic signal value: its two dwords are listed as patches, and hold 0 in the bound words until patched
  enc = drv.encode("compute", [("exec", p, args.addr, (4, 1, 1), (64, 1, 1)), ("signal", _signal(sig.addr), Slot("v"))])
  release, interrupt = enc.packets[-2:]          # the value's RELEASE_MEM, then the event slot's with the interrupt
  assert [enc.words[i] for i, _ in enc.patches] == [0, 0]
  name, fields, _ = pm4.decode(enc.resolved({"v": 2**40 + 5}).words, release)   # the patches land in data_lo/data_hi
  assert name == "RELEASE_MEM" and fields["data_hi"] << 32 | fields["data_lo"] == 2**40 + 5
  assert fields["addr_lo"] == sig.addr & 0xFFFFFFFF
  assert pm4.decode(enc.words, interrupt)[1]["int_ctxid"] == drv.queue_event
  bound = drv.bind("compute", enc)
  for k, out in enumerate(outs, 1):
    np.frombuffer(drv.view(args.addr, 8), np.uint64)[0] = out.addr
    drv.submit_bound("compute", bound, [(i, part.resolve({"v": k})) for i, part in enc.patches])
    assert drv.wait_value(sig.addr, k, 30)
    assert (np.frombuffer(drv.view(out.addr, 1024), np.uint32) == np.arange(256) * 3 + 7).all()
  assert _engine(drv, drv.compute).history.count("INDIRECT_BUFFER") == 2
  # a bound copy queue replays through SDMA INDIRECT; symbolic addresses land in COPY_LINEAR's address dwords
  src, dst = drv.alloc(4096), drv.alloc(4096)
  np.frombuffer(drv.view(src.addr, 4096), np.uint8)[:] = 9
  enc = drv.encode("copy", [("copy", Slot("dst"), Slot("src"), 4096), ("signal", _signal(sig.addr), Slot("v"))])
  vals = {"dst": dst.addr, "src": src.addr, "v": 10}
  name, fields, _ = sdma.decode(enc.resolved(vals).words, 0)
  assert name == "COPY_LINEAR" and fields["src_addr_hi"] << 32 | fields["src_addr_lo"] == src.addr
  assert fields["dst_addr_hi"] << 32 | fields["dst_addr_lo"] == dst.addr and fields["count"] == 4095
  bound = drv.bind("copy", enc)
  drv.submit_bound("copy", bound, [(i, part.resolve(vals)) for i, part in enc.patches])
  assert drv.wait_value(sig.addr, 10, 10) and (np.frombuffer(drv.view(dst.addr, 4096), np.uint8) == 9).all()
  assert "INDIRECT" in _engine(drv, drv.copy).history


def test_encode_has_no_side_effects(drv):
  """Encoding writes nothing: the rings, the memory and the programs stay as they were."""
  p = _hand_program(drv)
  args, sig = drv.alloc(64), drv.alloc(4096)
  rings = [bytes(r.ring) for r in (drv.compute, drv.copy)]
  memory, wptrs = dict(drv.memory), (drv.compute.wptr, drv.copy.wptr)
  cmds = [("exec", p, args.addr, (4, 1, 1), (64, 1, 1)), ("barrier",), ("timestamp", _signal(sig.addr)),
          ("wait", _signal(sig.addr), 3), ("signal", _signal(sig.addr), 1)]
  first = drv.encode("compute", cmds)
  assert drv.encode("compute", cmds).words == first.words and not first.patches
  drv.encode("copy", [("copy", args.addr, sig.addr, 64), ("wait", _signal(sig.addr), 3)])
  assert [bytes(r.ring) for r in (drv.compute, drv.copy)] == rings and drv.memory == memory
  assert (drv.compute.wptr, drv.copy.wptr) == wptrs


def test_wait_reg_mem_that_never_completes_times_out_with_values(monkeypatch):
  monkeypatch.setattr(settings, "EMU", True)   # what EMU=1 selects
  from baregrad.drivers.amd.driver import AMDDriver, QueueTimeout
  from baregrad.hcq.device import Device
  from baregrad.hcq.signal import Signal
  dev = Device("AMD", AMDDriver(timeout=10))
  try:
    gate, done = Signal(dev, "gate"), Signal(dev, "done")
    dev.compute_queue().wait(gate, 5).signal(done, 1).submit(dev)
    with pytest.raises(TimeoutError) as e: done.wait(1, timeout=0.3)
    msg = str(e.value)
    assert isinstance(e.value, QueueTimeout)
    assert f"AMD: waited 0.3 s for [{done.addr:#x}] >= 1, it is 0" in msg and "compute queue" in msg and "WAIT_REG_MEM" in msg
    assert f"[{gate.addr:#x}]" in msg and ">= 0x5" in msg and "memory holds 0x0" in msg
    gate.value = 5                                      # opening the gate lets the queue go on
    done.wait(1, timeout=10)
  finally:
    dev.driver.close()


def test_memory_fault_names_the_address(drv):
  from baregrad.drivers.amd.driver import GPUFault
  p = _hand_program(drv)
  args, sig = drv.alloc(64), drv.alloc(4096)
  np.frombuffer(drv.view(args.addr, 8), np.uint64)[0] = 0xDEAD0000          # the kernel stores to unmapped memory
  drv.submit("compute", drv.encode("compute", [("exec", p, args.addr, (1, 1, 1), (32, 1, 1)), ("signal", _signal(sig.addr), 1)]))
  assert not drv.wait_value(sig.addr, 1, 2)
  with pytest.raises(GPUFault, match=r"AMD: GPU memory fault at address 0xdead0000 .*compute queue \d+ stopped at "
                                     r"ring dword 0x[0-9a-f]+: DISPATCH_DIRECT"):
    drv.check_faults("AMD")
  assert any("0xdead0000" in line and "DISPATCH_DIRECT" in line for line in drv.kernel.kmsg)   # the emulator's dmesg


def test_unknown_packet_stops_the_queue_with_its_name(drv):
  from baregrad.drivers.amd.driver import GPUFault
  drv.compute.write([[pm4.header(0x99, 2), 0, 0]])
  assert _poll(lambda: drv.kernel.fault() is not None)              # the engine stopped on the packet
  with pytest.raises(GPUFault, match=r"queue error \(compute queue: EC_QUEUE_PACKET_UNSUPPORTED\).*compute queue \d+ "
                                     r"stopped at ring dword 0x0: OPCODE_0x99"):
    drv.check_faults("AMD")
  assert any("unknown PM4 packet OPCODE_0x99" in line for line in drv.kernel.kmsg)


def test_ioctl_arguments_are_checked_like_amdkfd(drv):
  import errno
  k, fd = drv.kernel, drv.kfd_fd
  def call(name, size=None, **fields):
    args = kfd.new_args(name, **fields)
    req = kfd.REQUEST[name] if size is None else kfd.ioc(kfd.IOCTLS[name][0], kfd.IOCTLS[name][1], size)
    try: k.ioctl(fd, req, args, name=name); return 0, args
    except OSError as e: return e.errno, args
  assert call("ALLOC_MEMORY_OF_GPU", va_addr=1 << 40, size=4096, gpu_id=1234, flags=kfd.ALLOC_VRAM)[0] == errno.EINVAL
  assert call("ALLOC_MEMORY_OF_GPU", va_addr=1 << 40, size=0, gpu_id=drv.gpu_id, flags=kfd.ALLOC_VRAM)[0] == errno.EINVAL
  assert call("ALLOC_MEMORY_OF_GPU", va_addr=1 << 40, size=4096, gpu_id=drv.gpu_id, flags=kfd.ALLOC_WRITABLE)[0] == errno.EINVAL
  assert call("FREE_MEMORY_OF_GPU", handle=0x1234)[0] == errno.EINVAL
  m = drv.alloc(4096)
  assert call("FREE_MEMORY_OF_GPU", handle=m.handle)[0] == errno.EBUSY          # still mapped to the GPU
  assert call("MAP_MEMORY_TO_GPU", handle=m.handle, n_devices=0)[0] == errno.EINVAL
  ring = drv.alloc(4096, "gtt")
  q = dict(ring_base_address=ring.addr, gpu_id=drv.gpu_id, queue_type=kfd.QUEUE_TYPE_SDMA, queue_percentage=100,
           read_pointer_address=m.addr, write_pointer_address=m.addr + 8)
  assert call("CREATE_QUEUE", ring_size=3000, **q)[0] == errno.EINVAL               # not a power of two
  assert call("CREATE_QUEUE", ring_size=8192, **q)[0] == errno.EINVAL               # larger than the ring's BO
  assert call("CREATE_QUEUE", ring_size=4096, queue_priority=16, **q)[0] == errno.EINVAL
  assert call("CREATE_QUEUE", ring_size=4096, **{**q, "queue_type": 9})[0] == errno.EINVAL
  err, args = call("CREATE_QUEUE", ring_size=4096, **q)
  assert err == 0 and call("DESTROY_QUEUE", queue_id=args.queue_id)[0] == 0
  assert call("DESTROY_QUEUE", queue_id=args.queue_id)[0] == errno.EINVAL
  assert call("RUNTIME_ENABLE", mode_mask=1)[0] == errno.EBUSY                     # the driver enabled it already
  events = kfd.ffi.new("struct kfd_event_data[1]")
  events[0].event_id = 999
  assert call("WAIT_EVENTS", events_ptr=int(kfd.ffi.cast("uintptr_t", events)), num_events=1)[0] == errno.EINVAL
  # an unknown command number, and a shorter struct than the kernel's (zero-extended in, truncated out)
  try: k.ioctl(fd, kfd.ioc(3, 0x7F, 8), kfd.ffi.new("char[8]")); assert False
  except OSError as e: assert e.errno == errno.EINVAL
  err, args = call("GET_VERSION", size=4)
  assert err == 0 and args.major_version == 1 and args.minor_version == 0


def test_no_vendor_runtime_in_the_process(drv):
  maps = open("/proc/self/maps").read()
  for lib in ("libhsa", "libamdhip", "libcuda", "libhsakmt", "libdrm_amdgpu"):
    assert lib not in maps


def test_tensor_ops_on_emulated_amd():
  code = ("from baregrad.tensor import Tensor; import numpy as np\n"
          "a = Tensor(np.arange(300, dtype=np.float32)); b = (a * 2 + 1).sum().numpy()\n"
          "c = Tensor(np.arange(12, dtype=np.int32).reshape(3, 4)); d = (c.T @ c).numpy()\n"
          "e = np.arange(12, dtype=np.int32).reshape(3, 4)\n"
          "assert b == 90000 and (d == e.T @ e).all(), (b, d)\nprint(Tensor([1]).device)")
  r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "EMU": "1", "DEV": "AMD"}, capture_output=True,
                     text=True, timeout=120)
  assert r.returncode == 0, r.stderr[-3000:]
  assert r.stdout.strip() == "AMD"


@pytest.mark.skipif(os.path.exists("/dev/kfd"), reason="this machine has /dev/kfd")
def test_dev_amd_without_kfd_fails_at_once_with_a_clear_message():
  env = {k: v for k, v in os.environ.items() if k != "EMU"}
  code = "from baregrad.tensor import Tensor; Tensor([1.0, 2.0]).realize() if hasattr(Tensor, 'realize') else None; (Tensor([1.0]) + 1).numpy()"
  r = subprocess.run([sys.executable, "-c", code], env={**env, "DEV": "AMD"}, capture_output=True, text=True,
                     timeout=120)           # a hang fails here (TimeoutExpired): the error comes at once, not late
  assert r.returncode != 0
  assert "/dev/kfd does not exist" in r.stderr and "EMU=1" in r.stderr


def test_host_device_copies_through_sdma(drv):
  n = 5 * 1024 * 1024 + 3                     # more than one staging chunk
  host = np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8)
  m = drv.alloc(n)
  engine = _engine(drv, drv.copy)
  before = engine.history.count("COPY_LINEAR") if len(engine.history) < 128 else 0
  drv.copyin(m.addr, host)
  assert (np.frombuffer(drv.view(m.addr, n), np.uint8) == host).all()
  back = np.zeros(n, np.uint8)
  drv.copyout(back, m.addr)
  assert (back == host).all()
  assert engine.history.count("COPY_LINEAR") - before == 4      # two chunks in, two chunks out


def test_the_unmap_finalizer_parses_no_c_type():
  """_unmap_all runs as a GC finalizer, which can fire while the thread is inside a cffi type parse; cffi's parser lock
  is not reentrant, so a string type parsed there deadlocked a test worker. Here another thread holds that lock (and
  the module's type cache is empty): the unmap must still finish."""
  import ctypes, threading
  import cffi.cparser
  from baregrad.drivers.amd import driver as amd
  libc = ctypes.CDLL(None, use_errno=True)
  libc.mmap.restype, libc.mmap.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                                            ctypes.c_int, ctypes.c_long]
  addr = libc.mmap(None, 4096, 3, 0x22, -1, 0)          # PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS
  assert addr not in (None, ctypes.c_void_p(-1).value)
  amd._ffi._parsed_types.clear()
  mappings = [(addr, 4096)]
  worker = threading.Thread(target=amd._unmap_all, args=(mappings,), daemon=True)
  with cffi.cparser.lock:
    worker.start()
    worker.join(5)
    stuck = worker.is_alive()
  worker.join(5)
  assert not stuck, "the unmap waited for cffi's parser lock"
  assert mappings == []
