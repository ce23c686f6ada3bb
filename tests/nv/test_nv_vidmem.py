"""NV video memory (issue 28): tensors, programs, constant banks, QMDs and local memory in the GPU's own memory
(NV01_MEMORY_LOCAL_USER, mapped by UVM and for the CPU through BAR1), pinned host memory for what the host polls and
for staging, host <-> device copies through the copy engine; the emulated RM's H200 with its 143771 MiB and the checks
vidmemConstruct makes.

Expected values are transcribed by hand from open-gpu-kernel-modules 580.142 ("OGKM", file named beside each), not
read from drivers/nv/vidmem.py. With NV_OPEN_GPU_KERNEL_MODULES set to a checkout of OGKM at 580.142, a gcc probe
compiles the headers and compares."""
import errno, os, shutil, signal, subprocess, sys, threading
import numpy as np
import pytest

from baregrad.drivers import kernel as kernel_mod
from baregrad.drivers.emu import counters
from baregrad.drivers.emu.nv_kernel import EmulatedNVKernel
from baregrad.drivers.nv import rm, vidmem
from baregrad.drivers.nv.driver import NVDriver, RMError
from baregrad.drivers.nv.rm import ffi
from baregrad.hcq.device import Device
from baregrad.hcq.signal import Signal
from baregrad.tensor import Tensor

MIB = 1 << 20

# ---- facts, transcribed from OGKM 580.142 src/common/sdk/nvidia/inc/nvos.h ----
# NVOS32_ATTR_* / NVOS32_ATTR2_* fields (hi:lo)
ATTR = {"DEPTH": (2, 0), "COMPR_COVG": (3, 3), "AA_SAMPLES": (7, 4), "GPU_CACHE_SNOOPABLE": (9, 8), "ZCULL": (11, 10),
        "COMPR": (13, 12), "ALLOCATE_FROM_RESERVED_HEAP": (14, 14), "FORMAT": (17, 16), "Z_TYPE": (18, 18),
        "ZS_PACKING": (21, 19), "PAGE_SIZE": (24, 23), "LOCATION": (26, 25), "PHYSICALITY": (28, 27),
        "COHERENCY": (31, 29)}
ATTR2 = {"ZBC": (1, 0), "GPU_CACHEABLE": (3, 2), "P2P_GPU_CACHEABLE": (5, 4), "32BIT_POINTER": (6, 6),
         "FIXED_NUMA_NODE_ID": (7, 7), "SMMU_ON_GPU": (9, 8), "USE_SCANOUT_CARVEOUT": (10, 10),
         "ALLOC_COMPCACHELINE_ALIGN": (11, 11), "PRIORITY": (13, 12), "INTERNAL": (14, 14), "PREFER_2C": (15, 15),
         "NISO_DISPLAY": (16, 16), "ZBC_SKIP_ZBCREFCOUNT": (17, 17), "ISO": (18, 18), "PAGE_OFFLINING": (19, 19),
         "PAGE_SIZE_HUGE": (21, 20), "PROTECTION_USER": (22, 22), "PROTECTION_DEVICE": (23, 23), "USE_EGM": (24, 24),
         "MEMORY_PROTECTION": (26, 25), "ALLOCATE_FROM_SUBHEAP": (27, 27), "ENABLE_LOCALIZED_MEMORY": (30, 29),
         "REGISTER_MEMDESC_TO_PHYS_RM": (31, 31)}
# values: PAGE_SIZE BIG 2, HUGE 3; LOCATION VIDMEM 0, PCI 1; PHYSICALITY NONCONTIGUOUS 1; COHERENCY WRITE_COMBINE 2;
# ATTR2 GPU_CACHEABLE YES 1; PAGE_SIZE_HUGE 2MB 1, 256GB 3; PAGE_OFFLINING OFF 1; MEMORY_PROTECTION PROTECTED 1
FLAGS = {"ALIGNMENT_HINT": 0x80, "ALIGNMENT_FORCE": 0x100, "MAP_NOT_REQUIRED": 0x8000, "USE_BEGIN_END": 0x20000,
         "TURBO_CIPHER_ENCRYPTED": 0x40000, "VIRTUAL": 0x80000, "FIXED_ADDRESS_ALLOCATE": 0x10}   # NVOS32_ALLOC_FLAGS_*
TYPE_IMAGE = 0
# the driver's request, worked out by hand: attr = PAGE_SIZE (24:23) | PHYSICALITY NONCONTIGUOUS (1 << 27) |
# COHERENCY WRITE_COMBINE (2 << 29); attr2 = GPU_CACHEABLE YES (1 << 2) | PAGE_SIZE_HUGE 2MB (1 << 20) for 2 MiB pages
ATTR_64K, ATTR_2M = 0x4900_0000, 0x4980_0000
ATTR2_64K, ATTR2_2M = 0x0000_0004, 0x0010_0004
# ctrl/ctrl2080/ctrl2080fb.h NV2080_CTRL_FB_INFO_INDEX_*
FB_INDEX = {"BAR1_SIZE": 0x5, "RAM_SIZE": 0x7, "TOTAL_RAM_SIZE": 0x8, "HEAP_SIZE": 0x9, "HEAP_FREE": 0x16,
            "BAR1_AVAIL_SIZE": 0x1D, "USABLE_RAM_SIZE": 0x20}
H200_MIB = 143771          # nvidia-smi's total memory of an H200; OGKM README.md: "NVIDIA H200 | 2335 10DE 18BE"


def test_vidmem_facts_match_the_headers():
  assert vidmem.ATTR_FIELDS == ATTR and vidmem.ATTR2_FIELDS == ATTR2
  assert {k: vidmem.ALLOC_FLAGS[k] for k in FLAGS} == FLAGS and vidmem.TYPE_IMAGE == TYPE_IMAGE
  assert vidmem.FB_INFO_INDEX == FB_INDEX and vidmem.FB_INFO_MAX_LIST_SIZE == 0x80
  assert vidmem.HEAP_OWNER_RM_SCRATCH == (0xDEAF0000, 0xDEAF0003)     # src/nvidia/generated/g_heap_nvoc.h
  for page, attr, attr2 in ((vidmem.PAGE_64K, ATTR_64K, ATTR2_64K), (vidmem.PAGE_2M, ATTR_2M, ATTR2_2M)):
    p = ffi.new("NV_MEMORY_ALLOCATION_PARAMS *")
    vidmem.request(p, 0xC1D00001, 4 * page, page)
    assert (p.owner, p.type, p.size, p.alignment, p.attr, p.attr2) == (0xC1D00001, 0, 4 * page, page, attr, attr2)
    assert p.flags == FLAGS["ALIGNMENT_FORCE"] | FLAGS["MAP_NOT_REQUIRED"]
    assert vidmem.rm_validate(p) is None and vidmem.rm_page_size(p) == page
  assert vidmem.placement(1) == (0x10000, 0x10000) and vidmem.placement(16 * MIB) == (0x200000, 16 * MIB)
  assert vidmem.placement(16 * MIB - 1) == (0x10000, 16 * MIB) and vidmem.placement(16 * MIB + 1) == (0x200000, 18 * MIB)


@pytest.mark.skipif(shutil.which("gcc") is None or not os.environ.get("NV_OPEN_GPU_KERNEL_MODULES"),
                    reason="needs gcc and NV_OPEN_GPU_KERNEL_MODULES (a checkout of open-gpu-kernel-modules at 580.142)")
def test_gcc_probe_of_the_vidmem_facts(tmp_path):
  ogkm = os.environ["NV_OPEN_GPU_KERNEL_MODULES"]
  lines = [f'printf("F ATTR {k} %d %d\\n", 1 ? NVOS32_ATTR_{k}, 0 ? NVOS32_ATTR_{k});' for k in ATTR]
  lines += [f'printf("F ATTR2 {k} %d %d\\n", 1 ? NVOS32_ATTR2_{k}, 0 ? NVOS32_ATTR2_{k});' for k in ATTR2]
  lines += [f'printf("C {k} %u\\n", (unsigned)NVOS32_ALLOC_FLAGS_{k});' for k in FLAGS]
  lines += [f'printf("I {k} %u\\n", (unsigned)NV2080_CTRL_FB_INFO_INDEX_{k});' for k in FB_INDEX]
  words = {"ATTR_64K": "DRF_DEF(OS32, _ATTR, _PAGE_SIZE, _BIG) | DRF_DEF(OS32, _ATTR, _LOCATION, _VIDMEM) | "
                       "DRF_DEF(OS32, _ATTR, _PHYSICALITY, _NONCONTIGUOUS) | DRF_DEF(OS32, _ATTR, _COHERENCY, _WRITE_COMBINE)",
           "ATTR_2M": "DRF_DEF(OS32, _ATTR, _PAGE_SIZE, _HUGE) | DRF_DEF(OS32, _ATTR, _LOCATION, _VIDMEM) | "
                      "DRF_DEF(OS32, _ATTR, _PHYSICALITY, _NONCONTIGUOUS) | DRF_DEF(OS32, _ATTR, _COHERENCY, _WRITE_COMBINE)",
           "ATTR2_64K": "DRF_DEF(OS32, _ATTR2, _GPU_CACHEABLE, _YES)",
           "ATTR2_2M": "DRF_DEF(OS32, _ATTR2, _GPU_CACHEABLE, _YES) | DRF_DEF(OS32, _ATTR2, _PAGE_SIZE_HUGE, _2MB)"}
  lines += [f'printf("W {k} %u\\n", (unsigned)({v}));' for k, v in words.items()]
  src = tmp_path / "probe.c"
  src.write_text('#include <stdio.h>\n#include "nvtypes.h"\n#include "nvmisc.h"\n#include "nvos.h"\n'
                 '#include "ctrl/ctrl2080/ctrl2080fb.h"\nint main(void) {\n' + "\n".join(lines) + "\nreturn 0;\n}\n")
  cc = subprocess.run(["gcc", "-I", os.path.join(ogkm, "src/common/sdk/nvidia/inc"), "-o", str(tmp_path / "probe"), str(src)],
                      capture_output=True, text=True)
  assert cc.returncode == 0, cc.stderr[-3000:]
  out = subprocess.run([str(tmp_path / "probe")], check=True, capture_output=True, text=True).stdout.split("\n")
  want = {"ATTR_64K": ATTR_64K, "ATTR_2M": ATTR_2M, "ATTR2_64K": ATTR2_64K, "ATTR2_2M": ATTR2_2M}
  for line in filter(None, out):
    kind, *rest = line.split()
    if kind == "F": assert {"ATTR": ATTR, "ATTR2": ATTR2}[rest[0]][rest[1]] == (int(rest[2]), int(rest[3])), rest
    elif kind == "C": assert FLAGS[rest[0]] == int(rest[1]), rest
    elif kind == "I": assert FB_INDEX[rest[0]] == int(rest[1]), rest
    else: assert want[rest[0]] == int(rest[1]), rest


# ---- the emulated RM: vidmemConstruct's checks, driven with hand-built parameters ----
@pytest.fixture
def fresh():
  d = NVDriver(kernel=EmulatedNVKernel())
  yield d
  d.close()


def _alloc(d, parent=None, **fields) -> tuple[str, object]:
  """NV_ESC_RM_ALLOC of NV01_MEMORY_LOCAL_USER: (status name, the parameters RM wrote back)."""
  p = ffi.new("NV_MEMORY_ALLOCATION_PARAMS *")
  vidmem.request(p, d.rm.root, MIB, vidmem.PAGE_64K)
  for k, v in fields.items(): setattr(p, k, v)
  try:
    handle = d.rm.alloc(d.device if parent is None else parent, 0x40, p)
    return "NV_OK", (handle, p)
  except RMError as e: return rm.NV_STATUS[e.status], p


def test_rm_video_memory_rejections(fresh):
  """stdmemValidateParams (mem_mgr/standard_mem.c), vidmemConstruct (mem_mgr/video_mem.c), memmgrDeterminePageSize
  (gpu/mem_mgr/mem_mgr.c), memmgrAllocDetermineAlignment_GM107 (gpu/mem_mgr/arch/maxwell/mem_mgr_gm107.c), resource_list.h
  (parents Device, Subdevice): each refusal with its status."""
  d = fresh
  refused = {
    "internal flags from a user": dict(internalflags=1),
    "size 0": dict(size=0),
    "owner 0": dict(owner=0),
    "owner 0xFFFFFFFF": dict(owner=0xFFFFFFFF),
    "owner in RM's scratch range": dict(owner=0xDEAF0002),
    "page offlining off": dict(attr2=ATTR2_64K | 1 << 19),
    "a range without USE_BEGIN_END": dict(rangeHi=1 << 30),
    "location PCI": dict(attr=ATTR_64K | 1 << 25),
    "VIRTUAL": dict(flags=FLAGS["VIRTUAL"]),
    "protected memory without CC": dict(attr2=ATTR2_64K | 1 << 25),
    "from a subheap": dict(attr2=ATTR2_64K | 1 << 27),
    "encrypted video memory": dict(flags=FLAGS["TURBO_CIPHER_ENCRYPTED"]),
    "256 GiB pages on Hopper": dict(attr=ATTR_2M, attr2=ATTR2_64K | 3 << 20),
    "forced alignment of 12 KiB": dict(alignment=0x3000),
    "compression (not emulated)": dict(attr=ATTR_64K | 1 << 12),
    "block linear (not emulated)": dict(attr=ATTR_64K | 2 << 16),
    "fixed address (not emulated)": dict(flags=FLAGS["FIXED_ADDRESS_ALLOCATE"]),
    "parent a channel group": dict(parent=d.group),
  }
  want = ["NV_ERR_INVALID_ARGUMENT", "NV_ERR_INVALID_ARGUMENT", "NV_ERR_INVALID_OWNER", "NV_ERR_INVALID_OWNER",
          "NV_ERR_INVALID_OWNER", "NV_ERR_INSUFFICIENT_PERMISSIONS"] + ["NV_ERR_INVALID_ARGUMENT"] * 6 + \
         ["NV_ERR_INVALID_STATE", "NV_ERR_INVALID_ARGUMENT"] + ["NV_ERR_NOT_SUPPORTED"] * 3 + ["NV_ERR_INVALID_OBJECT_PARENT"]
  got = {name: _alloc(d, **kw)[0] for name, kw in refused.items()}
  assert got == dict(zip(refused, want))
  # accepted, and what RM writes back: the page size it picked, whole pages, the offset it placed them at
  status, (_, p) = _alloc(d, attr=ATTR_64K & ~(3 << 23), attr2=ATTR2_64K, size=3 * MIB + 5)     # DEFAULT: 2 MiB pages
  assert status == "NV_OK" and p.size == 4 * MIB and (p.attr >> 23) & 3 == 3 and (p.attr2 >> 20) & 3 == 1
  assert p.offset % (2 * MIB) == 0 and p.limit == p.offset + p.size - 1
  status, (_, p) = _alloc(d, attr=ATTR_64K & ~(3 << 23) | 1 << 23, size=5)       # 4 KiB pages: PMA's 64 KiB
  assert status == "NV_OK" and p.size == 0x10000
  status, (_, p) = _alloc(d, flags=FLAGS["ALIGNMENT_HINT"], alignment=0x3000, size=0x10000)   # a hint falls back
  assert status == "NV_OK" and p.offset % 0x10000 == 0
  assert _alloc(d, parent=d.subdevice)[0] == "NV_OK"
  assert _alloc(d, alignment=4 * MIB)[1][1].offset % (4 * MIB) == 0                # a larger forced alignment holds


def test_rm_cpu_mapping_of_video_memory(fresh):
  """memMap (rmapi/mapping_cpu.c) offset/length checks; the mmap of /dev/nvidiaN must be at offset 0 and exactly the
  mapped length (kernel-open/nvidia/nv-mmap.c)."""
  d = fresh
  handle = _alloc(d)[1][0]

  def nvos33(offset, length, fd):
    p = ffi.new("nv_ioctl_nvos33_parameters_with_fd *")
    p.params.hClient, p.params.hDevice, p.params.hMemory, p.params.offset, p.params.length = d.rm.root, d.device, handle, offset, length
    p.fd = fd
    d.rm.escape(d.fd_ctl, rm.NV_ESC_RM_MAP_MEMORY, p)
    return rm.NV_STATUS[p.params.status]
  fd = d._open_device()
  assert [nvos33(MIB, 1, fd), nvos33(0, 0, fd), nvos33(4096, MIB, fd)] == \
         ["NV_ERR_INVALID_BASE", "NV_ERR_INVALID_LIMIT", "NV_ERR_INVALID_LIMIT"]
  assert nvos33(0x10000, 0x20000, fd) == "NV_OK"
  rw, shared = kernel_mod.PROT_READ | kernel_mod.PROT_WRITE, kernel_mod.MAP_SHARED
  for length, offset in ((0x10000, 0), (0x20000, 0x1000)):
    with pytest.raises(kernel_mod.KernelCallError) as e: d.k.mmap(0, length, rw, shared, fd, offset)
    assert e.value.errno == errno.EINVAL
  addr = d.k.mmap(0, 0x20000, rw, shared, fd, 0)
  d.view(addr, 4)[:] = b"HBM3"
  assert bytes(d.k.vram.array(d.k.clients[d.rm.root][handle].info["vidmem"], 4, 0x10000)) == b"HBM3"
  d.k.munmap(addr, 0x20000)
  d.k.close(fd)


def test_h200_memory_and_out_of_memory(fresh):
  """The emulated H200 reports 143771 MiB (NV2080_CTRL_CMD_FB_GET_INFO_V2) and holds that much: 140 GiB fit (a sparse
  memfd: nothing is touched), another GiB does not, and the driver says so with a MemoryError."""
  d = fresh
  cards = ffi.new("nv_ioctl_card_info_t[32]")
  d.rm.escape(d.fd_ctl, rm.NV_ESC_CARD_INFO, cards)
  assert cards[0].pci_info.device_id == 0x2335 and cards[0].pci_info.vendor_id == 0x10DE
  assert d.vram_bytes == H200_MIB * MIB
  total, free = d._fb_info("TOTAL_RAM_SIZE", "HEAP_FREE")
  big = d.alloc(140 << 30)
  assert big.video and big.addr % (2 * MIB) == 0 and big.mapped == (140 << 30) + 2 * MIB   # 2 MiB pages (+ OVERRUN)
  assert free - d._fb_info("HEAP_FREE")[0] >= 140 << 30
  with pytest.raises(MemoryError, match=r"out of GPU memory allocating .* MiB of 143771 MiB free"): d.alloc(1 << 30)
  d.free(big)
  again = d.alloc(1 << 30)               # freed memory is RM's again
  d.free(again)
  for bad in (0, 129):
    p = ffi.new("NV2080_CTRL_FB_GET_INFO_V2_PARAMS *"); p.fbInfoListSize = bad
    with pytest.raises(RMError, match="NV_ERR_INVALID_ARGUMENT"): d.rm.control(d.subdevice, rm.NV2080_CTRL_CMD_FB_GET_INFO_V2, p)


def test_what_lives_where(fresh):
  """alloc: video memory mapped as device memory on the GPU; alloc_polled and the driver's fences, GPFIFO rings,
  USERD, error notifier and pushbuffers: pinned host memory (system memory on the GPU)."""
  d = fresh
  v, h = d.alloc(1000), d.alloc_polled(1000)
  client = d.k.clients[d.rm.root]
  assert v.video and client[v.handle].cls == rm.NV01_MEMORY_LOCAL_USER and not d.k.gpu.mem.is_system(v.addr)
  assert not h.video and client[h.handle].cls == rm.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR and d.k.gpu.mem.is_system(h.addr)
  assert v.addr % 0x10000 == 0 and v.addr in d.k.bar1                    # the CPU maps it through BAR1
  for ch in d.channels.values():
    assert not any(m.video for m in (ch.ring, ch.userd, ch.fence))
  assert not d.error_notifier.video
  assert all(not a[0].video for a in d._arenas)          # after open: pushbuffers only
  d.view(v.addr, 8)[:] = b"baregrad"                      # host writes through BAR1; the GPU reads the same bytes
  assert d.k.gpu.mem.read(v.addr, 8) == b"baregrad"
  used = d.k.vram.used
  d.free(v)
  assert d.k.vram.used == used - v.mapped and v.addr not in d.k.bar1 and v.handle not in client
  w = d.alloc(1000)                                       # the same address and pages again: scrubbed
  assert w.addr == v.addr and d.k.gpu.mem.read(w.addr, 8) == bytes(8)


@pytest.fixture(scope="module")
def dev():
  if "NV" not in Device._open or not Device._open["NV"].driver.k.emulated:
    Device._open["NV"] = Device("NV", NVDriver(kernel=EmulatedNVKernel()))
  return Device._open["NV"]


def test_the_gpu_writes_its_own_launch_memory_and_code(dev):
  """What a launch reads from video memory (its QMD, constant banks, code) reaches it from the pushbuffer (I2M), never
  through the host's BAR1 mapping: the emulated GPU counts the bytes launches read that it did not write itself
  (drivers/emu/nv_gpu.py host_written). Eager launches, a new program, a jitted step replayed with new inputs, and
  uploads of small tensors (the copy engine) all leave it at zero."""
  from baregrad.tensor.jit import jit
  g = dev.driver.k.gpu
  before, inline = dict(g.host_written), g.inline_bytes
  rng = np.random.default_rng(3)
  x = Tensor(rng.standard_normal((7, 5), dtype=np.float32), device="NV")
  w = Tensor(rng.standard_normal((5, 3), dtype=np.float32), device="NV")
  np.testing.assert_allclose(((x @ w) * 2.5 - 1).numpy(), (x.numpy() @ w.numpy()) * 2.5 - 1, rtol=1e-5, atol=1e-5)

  @jit
  def step(a): return (a @ w).relu().sum(axis=1)
  for _ in range(4):
    an = rng.standard_normal((7, 5), dtype=np.float32)
    np.testing.assert_allclose(step(Tensor(an, device="NV")).numpy(), np.maximum(an @ w.numpy(), 0).sum(1),
                               rtol=1e-5, atol=1e-5)
  dev.synchronize()
  assert g.inline_bytes > inline
  assert g.host_written == before, {k: g.host_written[k] - before[k] for k in before}


def test_tensors_programs_and_launch_memory_are_video_memory(dev):
  """An add and a small matmul move no byte of system memory (drivers/emu/counters.py); their buffers, the programs
  and the QMD/constant-bank-0 memory are video memory; signals and kernel arguments are pinned host memory."""
  d = dev.driver
  rng = np.random.default_rng(0)
  an, bn = rng.standard_normal((48, 40), dtype=np.float32), rng.standard_normal((40, 24), dtype=np.float32)
  a, b = Tensor(an, device="NV").realize(), Tensor(bn, device="NV").realize()
  c = Tensor(rng.standard_normal((48, 40), dtype=np.float32), device="NV").realize()
  dev.synchronize()
  for f, ref in ((lambda: a + c, an + c.numpy()), (lambda: a @ b, an @ bn)):
    counters.reset()
    r = f().realize()
    dev.synchronize()
    t = counters.total()
    assert t.kernels >= 1 and t.global_bytes > 0 and t.global_system_bytes == 0
    np.testing.assert_allclose(r.numpy(), ref, rtol=1e-4, atol=1e-4)
  for buf in (a, b, r):
    mem = d._allocation(buf._buffer().addr, 4)
    # the generic memory PTE kind (dev_mmu.h NV_MMU_PTE_KIND_GENERIC_MEMORY), as RM received it: PITCH (0) is
    # display-surface memory, which an H200 streamed at 2/5 of the bandwidth
    assert mem.video and d.k.clients[d.rm.root][mem.handle].info["kind"] == vidmem.PTE_KIND_GENERIC_MEMORY == 0x06
  assert d.k.gpu.programs and all(d._allocation(code, 1).video for code in d.k.gpu.programs)     # programs
  launch = [arena[0] for arena in d._arenas if arena[0].video]
  assert launch, "QMDs and constant bank 0 should be in video memory"
  sig = Signal(dev, "where")
  assert not d._allocation(sig.addr, 16).video
  kernargs = d._allocation(dev.kernargs.mem.addr, 8)
  assert not kernargs.video and kernargs.handle in d.k.clients[d.rm.root]      # moved to pinned memory, same address


def test_round_trip_goes_through_the_copy_engine(dev, monkeypatch):
  """9 MiB in and out: the copy channel moves every byte (in staging-buffer chunks each way through the two staging
  buffers), the host never reads video memory (no view of it while copying out), the bytes come back exact."""
  d = dev.driver
  n = 9 * MIB
  x = np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8)
  mem = d.alloc(n)
  before = dict(d.k.gpu.copy_bytes)
  d.copyin(mem.addr, memoryview(x))
  assert d.k.gpu.copy_bytes["copy"] - before.get("copy", 0) == n
  views = []
  real_view = d.view
  monkeypatch.setattr(d, "view", lambda addr, nbytes: (views.append((addr, nbytes)), real_view(addr, nbytes))[1])
  y = np.empty(n, np.uint8)
  d.copyout(memoryview(y), mem.addr)
  monkeypatch.undo()
  np.testing.assert_array_equal(y, x)
  assert d.k.gpu.copy_bytes["copy"] - before.get("copy", 0) == 2 * n
  assert not any(d._in_device(addr, 1) for addr, _ in views), "the host read video memory"
  d.free(mem)


def test_staged_copies_split_between_host_threads(dev, monkeypatch):
  """A staged copy's host part is split between threads (parts of odd sizes here, chunks of the staging size and a
  tail): every byte arrives, both ways, and the copy threads did the work."""
  from baregrad.drivers import hostcopy
  monkeypatch.setattr(hostcopy, "COPY_THREADS", 4)
  monkeypatch.setattr(hostcopy, "PART_MIN", 4096)
  d = dev.driver
  n = 2 * d.STAGING + 12345
  x = np.random.default_rng(2).integers(0, 256, n, dtype=np.uint8)
  mem = d.alloc(n)
  d.copyin(mem.addr, memoryview(x))
  y = np.zeros(n, np.uint8)
  d.copyout(memoryview(y), mem.addr)
  np.testing.assert_array_equal(y, x)
  assert any(t.name.startswith("baregrad-copy") for t in threading.enumerate())
  d.free(mem)


def test_copy_threads_in_a_forked_child():
  """The parent's copy threads do not exist in a forked child: the child's split copy runs on threads it makes
  itself and is exact (an alarm ends a child that waits)."""
  from baregrad.drivers import hostcopy
  threads = hostcopy._CopyThreads()
  src = np.arange(1 << 16, dtype=np.uint8)
  dst = np.zeros_like(src)
  old = hostcopy.COPY_THREADS, hostcopy.PART_MIN
  hostcopy.COPY_THREADS, hostcopy.PART_MIN = 4, 4096
  try:
    threads.copy(dst, src)
    pid = os.fork()
    if pid == 0:
      signal.alarm(20)
      out = np.zeros_like(src)
      threads.copy(out, src)
      os._exit(3 if not np.array_equal(out, src) else 4 if threads._pid != os.getpid() else 0)
    _, status = os.waitpid(pid, 0)
  finally:
    hostcopy.COPY_THREADS, hostcopy.PART_MIN = old
  assert np.array_equal(dst, src)
  assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child: {status:#x}"


def test_a_failed_copy_part_is_raised_after_the_others_finish(monkeypatch):
  """A part of a split copy that fails is raised only once no other part still writes (a later copy reuses the
  staging buffer the others write into)."""
  import time
  from baregrad.drivers import hostcopy
  monkeypatch.setattr(hostcopy, "COPY_THREADS", 4)
  monkeypatch.setattr(hostcopy, "PART_MIN", 4096)
  src, dst = np.arange(1 << 16, dtype=np.uint8), np.zeros(1 << 16, np.uint8)
  real, finished = np.copyto, []
  def copyto(d, s):
    if d.ctypes.data == dst.ctypes.data: raise MemoryError("part 0")
    time.sleep(0.2)
    real(d, s)
    finished.append(d.ctypes.data)
  monkeypatch.setattr(np, "copyto", copyto)
  with pytest.raises(MemoryError, match="part 0"): hostcopy._CopyThreads().copy(dst, src)
  assert len(finished) == 3


def test_small_copies_by_the_copy_engine_and_host_memory_by_the_cpu(dev):
  """Video memory is written and read by the copy engine however small the copy (the host never touches it through
  BAR1); pinned host memory by the CPU."""
  d = dev.driver
  v, h = d.alloc(4096), d.alloc_polled(4096)
  data = bytes(range(256)) * 16
  before = sum(d.k.gpu.copy_bytes.values())
  d.copyin(h.addr, data)                       # pinned host memory: the CPU
  out = bytearray(4096)
  d.copyout(memoryview(out), h.addr)
  assert bytes(out) == data and sum(d.k.gpu.copy_bytes.values()) == before
  d.copyin(v.addr, data[:100])                 # video memory, even 100 bytes: the copy engine
  assert sum(d.k.gpu.copy_bytes.values()) == before + 100
  d.copyin(v.addr + 100, data[100:])
  d.copyout(memoryview(out), v.addr)
  assert bytes(out) == data and sum(d.k.gpu.copy_bytes.values()) == before + 2 * 4096
  d.free(v); d.free(h)


def test_tensor_round_trip_and_out_of_memory(dev):
  x = np.arange(3 * MIB, dtype=np.float32)
  t = Tensor(x, device="NV").realize()
  np.testing.assert_array_equal(t.numpy(), x)
  with pytest.raises(MemoryError, match="out of GPU memory"):
    dev.driver.alloc(200 << 30)


def test_closing_with_a_kernel_in_flight_on_video_memory():
  """The RM client freed while a channel runs a kernel on video memory: the channel threads stop before the memory
  goes, and a thread still holding memory of a freed allocation reads zeros, not unmapped pages (a crash before)."""
  code = ("import numpy as np\n"
          "from baregrad.tensor import Tensor\n"
          "from baregrad.hcq.device import Device\n"
          "for i in range(2):\n"
          "  x = Tensor(np.ones((384, 384), np.float32), device='NV').realize()\n"
          "  ((x @ x).sin() @ x).realize()                     # submitted, not waited for\n"
          "  d = Device.get('NV')\n"
          "  d.driver.close()                                  # the RM client goes with the kernel running\n"
          "  Device._open.pop('NV', None)\n"
          "print('closed twice')\n")
  env = dict(os.environ, EMU="1", DEV="NV")
  p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
  assert p.returncode == 0 and "closed twice" in p.stdout, (p.returncode, p.stdout, p.stderr[-3000:])


def test_rendered_kernels_carry_their_block_as_maxntid(dev):
  """The PTX of each kernel says the block it runs with (.maxntid): ptxas keeps its registers within what that block
  fits in the 64K register file and records EIATTR_MAX_THREADS, which the cubin reader returns."""
  from baregrad.compiler import codegen
  x = Tensor(np.arange(64 * 48, dtype=np.float32).reshape(64, 48), device="NV")
  np.testing.assert_allclose(x.sum(1).numpy(), np.arange(64 * 48, dtype=np.float32).reshape(64, 48).sum(1), rtol=1e-6)
  progs = [p for p in codegen._programs.values() if p.device == "NV" and ".entry" in str(p.source)]
  assert progs
  for p in progs:
    local = tuple(p.meta["local_size"])
    assert f".maxntid {local[0]}, {local[1]}, {local[2]}" in str(p.source), str(p.source)[:400]
    assert tuple(p.handle.max_threads) == local


def test_what_the_gpu_wrote_is_forgotten_with_its_memory(dev):
  """The emulated GPU's record of what it wrote itself (I2M, copy engine: NVGpu.gpu_written) drops the ranges of
  memory that is unmapped, so it does not grow with every allocation a process ever made, and a host write into
  memory allocated again at the same address is not taken for the GPU's."""
  d = dev.driver
  g = d.k.gpu
  mem = d.alloc(1 << 20)
  d.copyin(mem.addr, bytes(4096))                        # the copy engine writes it
  assert g.gpu_written.covers(mem.addr, mem.addr + 4096)
  before = len(g.gpu_written.starts)
  d.free(mem)
  assert not g.gpu_written.covers(mem.addr, mem.addr + 4096) and len(g.gpu_written.starts) < before
