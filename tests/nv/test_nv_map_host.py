"""NV map_host: host memory another device allocated, mapped for the GPU the way RM and UVM allow it (open-gpu-kernel-
modules 580.142, "OGKM"): the pages described to RM as an OS descriptor (NV_ESC_RM_ALLOC_MEMORY / NVOS02 of class 0x71,
which pins them), mapped by UVM at the same GPU virtual address (UVM_CREATE_EXTERNAL_RANGE, UVM_MAP_EXTERNAL_ALLOCATION),
unmapped and freed by `free` (UVM_FREE, NV_ESC_RM_FREE). The emulated RM/UVM refuse what the real ones refuse, with
their status codes; NV <-> NV copies then run on the NV copy engine, without the host relay.

Expected values are transcribed by hand from OGKM (file named beside each), not read from drivers/nv/osdesc.py."""
import gc, threading, time, types
import numpy as np
import pytest

from baregrad.drivers import kernel as kernel_mod, settings
from baregrad.drivers.emu import nv_gpu
from baregrad.drivers.emu.memory import MemoryFault
from baregrad.drivers.emu.nv_kernel import EmulatedNVKernel, GPU_UUID
from baregrad.drivers.nv import osdesc, rm
from baregrad.drivers.nv.driver import NVDriver, NVError, HostMapError, EscapeError
from baregrad.drivers.nv.rm import ffi
from baregrad.hcq import transfer
from baregrad.hcq.buffer import Buffer
from baregrad.hcq.device import Device
from baregrad.compiler.dtype import dtypes
from baregrad.tensor import Tensor

PAGE = 0x1000
RW, RO = kernel_mod.PROT_READ | kernel_mod.PROT_WRITE, kernel_mod.PROT_READ
REAL = kernel_mod.KernelInterface()

# ---- facts, transcribed from OGKM 580.142 ----
# src/common/sdk/nvidia/inc/nvos.h: NV_OS_DESC_MEMORY_ALLOCATION_PARAMS {NvU32 type, flags, attr, attr2; NvP64
# descriptor NV_ALIGN_BYTES(8); NvU64 limit NV_ALIGN_BYTES(8); NvU32 descriptorType, tag}
OS_DESC_PARAMS = (40, {"type": 0, "flags": 4, "attr": 8, "attr2": 12, "descriptor": 16, "limit": 24, "descriptorType": 32,
                       "tag": 36})
# nvos.h NVOS02_FLAGS_*: PHYSICALITY 7:4 (NONCONTIGUOUS 1), LOCATION 11:8 (PCI 0, VIDMEM 2), COHERENCY 15:12 (UNCACHED 0,
# CACHED 1, WRITE_COMBINE 2, WRITE_BACK 5), ALLOC_USER_READ_ONLY 21:21, MAPPING 31:30 (DEFAULT 0, NO_MAP 1)
NONCONTIGUOUS, CACHED, NO_MAP = 0x1 << 4, 0x1 << 12, 0x1 << 30
VIDMEM, WRITE_COMBINE, WRITE_BACK, UNCACHED, USER_READ_ONLY = 0x2 << 8, 0x2 << 12, 0x5 << 12, 0x0 << 12, 0x1 << 21
HOST_PAGES = NONCONTIGUOUS | CACHED | NO_MAP           # what the driver asks for: 0x40001010


def test_os_descriptor_facts_match_the_headers():
  size, offsets = OS_DESC_PARAMS
  assert osdesc.ffi.sizeof("NV_OS_DESC_MEMORY_ALLOCATION_PARAMS") == size
  assert {f: osdesc.ffi.offsetof("NV_OS_DESC_MEMORY_ALLOCATION_PARAMS", f) for f in offsets} == offsets
  assert osdesc.HOST_PAGES == HOST_PAGES == 0x40001010
  assert osdesc.HOST_PAGES == rm.NVOS02_FLAGS_PHYSICALITY_NONCONTIGUOUS | rm.NVOS02_FLAGS_COHERENCY_CACHED | rm.NVOS02_FLAGS_MAPPING_NO_MAP
  assert osdesc.flags(LOCATION=osdesc.LOCATION_VIDMEM, COHERENCY=osdesc.COHERENCY_WRITE_BACK) == VIDMEM | WRITE_BACK
  assert osdesc.flags(ALLOC_USER_READ_ONLY=1) == USER_READ_ONLY and osdesc.field(0xC0000000, "MAPPING") == 3
  # nvos.h NVOS32_DESCRIPTOR_TYPE_*; uvm_types.h UVM_MAX_GPUS = NV_MAX_DEVICES (32) * UVM_PARENT_ID_MAX_SUB_PROCESSORS (8)
  assert osdesc.DESCRIPTOR_TYPES[0] == "VIRTUAL_ADDRESS" and osdesc.DESCRIPTOR_TYPES[7] == "KERNEL_VIRTUAL_ADDRESS"
  assert osdesc.UVM_MAX_GPUS == 256 == len(ffi.new("UVM_MAP_EXTERNAL_ALLOCATION_PARAMS *").perGpuAttributes)
  # kernel-open/common/inc/nv_uvm_user_types.h: mapping types 0..3, caching 0..2, format 0..1, element bits 0,1,2,4,5,6
  assert (osdesc.UVM_MAPPING_TYPES, osdesc.UVM_CACHING_TYPES, osdesc.UVM_FORMAT_TYPES) == ((0, 1, 2, 3), (0, 1, 2), (0, 1))
  assert osdesc.UVM_ELEMENT_BITS == (0, 1, 2, 4, 5, 6) and osdesc.UVM_COMPRESSION_TYPE_COUNT == 2


# ---- the emulated RM and UVM, driven with hand-built parameters ----
_opened: list = []
_maps: list = []


@pytest.fixture(autouse=True)
def _cleanup():
  yield
  while _opened: _opened.pop().close()
  while _maps: REAL.munmap(*_maps.pop())


def _driver(gpu: str = "GH100") -> NVDriver:
  d = NVDriver(kernel=EmulatedNVKernel(gpu=gpu))
  _opened.append(d)
  return d


def _host(nbytes: int, prot: int = RW) -> int:
  """Host pages this process maps outside the NV driver (as another device's memory is)."""
  addr = REAL.mmap(0, nbytes, prot, kernel_mod.MAP_SHARED | kernel_mod.MAP_ANONYMOUS, -1, 0)
  _maps.append((addr, nbytes))
  return addr


def _alloc_memory(d, addr: int, limit: int, flags: int = HOST_PAGES, parent=None, handle=None, root=None, fd=None):
  """NV_ESC_RM_ALLOC_MEMORY of class 0x71: (status name, handle)."""
  p = ffi.new("nv_ioctl_nvos02_parameters_with_fd *")
  p.params.hRoot = d.rm.root if root is None else root
  p.params.hObjectParent = d.device if parent is None else parent
  p.params.hObjectNew = d.rm.new_handle() if handle is None else handle
  p.params.hClass, p.params.flags, p.params.pMemory, p.params.limit, p.fd = 0x71, flags, addr, limit, -1
  d.rm.escape(d.fd_dev if fd is None else fd, rm.NV_ESC_RM_ALLOC_MEMORY, p)
  return rm.NV_STATUS[p.params.status], p.params.hObjectNew


def _uvm(d, cmd: int, attrs: dict | None = None, **values) -> str:
  p = ffi.new(rm.UVM_IOCTLS[cmd][1] + " *")
  for k, v in values.items(): setattr(p, k, v)
  if cmd == rm.UVM_MAP_EXTERNAL_ALLOCATION:
    a = p.perGpuAttributes[0]
    a.gpuUuid[0:16] = GPU_UUID
    for k, v in (attrs or {}).items():
      if k == "gpuUuid": a.gpuUuid[0:16] = v
      else: setattr(a, k, v)
  d.k.ioctl(d.fd_uvm, cmd, p)
  return rm.NV_STATUS[p.rmStatus]


def _map(d, base, length, handle, offset=0, count=1, attrs=None) -> str:
  return _uvm(d, rm.UVM_MAP_EXTERNAL_ALLOCATION, attrs, base=base, length=length, offset=offset, gpuAttributesCount=count,
              rmCtrlFd=d.fd_ctl, hClient=d.rm.root, hMemory=handle)


def test_rm_os_descriptor_rejections():
  """RmAllocOsDescriptor / RmCreateOsDescriptor (arch/nvalloc/unix/src/escape.c), os_lock_user_pages (kernel-open/nvidia/
  os-mlock.c), resource_list.h (parent Device), osCreateMemFromOsDescriptor and osCreateOsDescriptorFromPageArray
  (arch/nvalloc/unix/src/osmemdesc.c), each with the status it returns."""
  d = _driver()
  host, ro = _host(5 * PAGE), _host(PAGE, RO)
  REAL.munmap(host + 4 * PAGE, PAGE)            # a hole after 4 pages
  _maps[-2] = (host, 4 * PAGE)
  assert _alloc_memory(d, host, 4 * PAGE - 1)[0] == "NV_OK"
  refused = {
    "location VIDMEM": dict(flags=HOST_PAGES | VIDMEM),
    "mapping DEFAULT": dict(flags=HOST_PAGES & ~NO_MAP),
    "coherency WRITE_COMBINE": dict(flags=(HOST_PAGES & ~CACHED) | WRITE_COMBINE),
    "coherency UNCACHED (pinned pages are write-back)": dict(flags=(HOST_PAGES & ~CACHED) | UNCACHED),
    "physically contiguous": dict(flags=HOST_PAGES & ~NONCONTIGUOUS),
    "unaligned address": dict(addr=host + 8),
    "limit 2**64 - 1": dict(limit=(1 << 64) - 1),
    "unmapped pages": dict(addr=8 * PAGE),
    "read-only pages, writable descriptor": dict(addr=ro, limit=PAGE - 1),
    "past the end of the mapping": dict(limit=5 * PAGE - 1),
    "parent a subdevice": dict(parent=d.subdevice),
    "unknown client": dict(root=0x1234),
    "duplicate handle": dict(handle=d.device),
    "limit 0": dict(limit=0),
  }
  want = ["NV_ERR_INVALID_FLAGS"] * 5 + ["NV_ERR_NOT_SUPPORTED", "NV_ERR_INVALID_LIMIT"] + ["NV_ERR_INVALID_ADDRESS"] * 3 + \
         ["NV_ERR_INVALID_OBJECT_PARENT", "NV_ERR_INVALID_CLIENT", "NV_ERR_INSERT_DUPLICATE_NAME",
          "NV_ERR_INVALID_PARAM_STRUCT"]
  got = [_alloc_memory(d, **{"addr": host, "limit": PAGE - 1, **kw})[0] for kw in refused.values()]
  assert dict(zip(refused, got)) == dict(zip(refused, want))
  # on /dev/nvidiactl: the escape layer refuses it (-EINVAL, no status: escape.c NV_ACTUAL_DEVICE_ONLY)
  with pytest.raises(EscapeError): _alloc_memory(d, host, PAGE - 1, fd=d.fd_ctl)
  # accepted: write-back coherency, read-only pages described read-only, a limit that is not a page multiple (RM
  # rounds the pages up: pageCount = 1 + limit / page size)
  assert _alloc_memory(d, host, PAGE - 1, flags=(HOST_PAGES & ~CACHED) | WRITE_BACK)[0] == "NV_OK"
  assert _alloc_memory(d, ro, PAGE - 1, flags=HOST_PAGES | USER_READ_ONLY)[0] == "NV_OK"
  status, odd = _alloc_memory(d, host, PAGE + 0x7FF)
  assert status == "NV_OK"
  base = d._take_va(4 * PAGE)
  assert _uvm(d, rm.UVM_CREATE_EXTERNAL_RANGE, base=base, length=4 * PAGE) == "NV_OK"
  assert _map(d, base, 3 * PAGE, odd) == "NV_ERR_INVALID_OFFSET"      # the object is 2 pages
  assert _map(d, base, 2 * PAGE, odd) == "NV_OK"


def test_rm_alloc_of_the_os_descriptor_class_does_not_take_a_user_address():
  """NV_ESC_RM_ALLOC of class 0x71 (NV_OS_DESC_MEMORY_ALLOCATION_PARAMS) pins nothing: a VIRTUAL_ADDRESS descriptor is
  NV_ERR_NOT_SUPPORTED and KERNEL_VIRTUAL_ADDRESS the switch's default, NV_ERR_INVALID_ARGUMENT (osmemdesc.c)."""
  d = _driver()
  host = _host(PAGE)
  a = osdesc.ffi.new("NV_OS_DESC_MEMORY_ALLOCATION_PARAMS *")
  a.descriptor, a.limit = host, PAGE - 1
  statuses = []
  for kind in (0, 7):
    a.descriptorType = kind
    p = ffi.new("NVOS21_PARAMETERS *")
    p.hRoot, p.hObjectParent, p.hObjectNew, p.hClass = d.rm.root, d.device, d.rm.new_handle(), 0x71
    p.pAllocParms, p.paramsSize = int(osdesc.ffi.cast("uintptr_t", a)), 40
    d.rm.escape(d.fd_ctl, rm.NV_ESC_RM_ALLOC, p)
    statuses.append(rm.NV_STATUS[p.status])
  assert statuses == ["NV_ERR_NOT_SUPPORTED", "NV_ERR_INVALID_ARGUMENT"]


def test_uvm_external_range_and_mapping_rejections():
  """uvm_create_external_range, uvm_map_external_allocation(_on_gpu) (kernel-open/nvidia-uvm/uvm_map_external.c),
  uvm_api_range_invalid_4k (uvm_api.h), uvm_gpu_can_address (uvm_gpu.c), uvm_free (uvm_va_range.c)."""
  d = _driver("GA100")
  host = _host(2 * PAGE)
  handle = _alloc_memory(d, host, 2 * PAGE - 1)[1]
  base = d._take_va(4 * PAGE)
  create = lambda b, n: _uvm(d, rm.UVM_CREATE_EXTERNAL_RANGE, base=b, length=n)
  assert [create(0, PAGE), create(base + 8, PAGE), create(base, 0), create(base, PAGE + 1)] == ["NV_ERR_INVALID_ADDRESS"] * 4
  assert create(base, 4 * PAGE) == "NV_OK"
  assert create(base + PAGE, PAGE) == "NV_ERR_UVM_ADDRESS_IN_USE"
  assert [_map(d, base, 2 * PAGE, handle, count=0), _map(d, base, 2 * PAGE, handle, count=257),
          _map(d, base, 2 * PAGE, handle, attrs={"gpuMappingType": 4}),
          _map(d, base, 2 * PAGE, handle, attrs={"gpuCachingType": 3}),
          _map(d, base, 2 * PAGE, handle, attrs={"gpuFormatType": 1}),        # block linear needs element bits
          _map(d, base, 2 * PAGE, handle, attrs={"gpuElementBits": 3}),       # no 24-bit elements
          _map(d, base, 2 * PAGE, handle, attrs={"gpuCompressionType": 2})] == ["NV_ERR_INVALID_ARGUMENT"] * 7
  assert _map(d, base, 2 * PAGE, handle, attrs={"gpuUuid": bytes(16)}) == "NV_ERR_INVALID_DEVICE"
  assert _map(d, base + 4 * PAGE, PAGE, handle) == "NV_ERR_INVALID_ADDRESS"       # outside every external range
  assert _map(d, base + PAGE, 4 * PAGE, handle) == "NV_ERR_INVALID_ADDRESS"       # runs past its range
  assert _map(d, base, 2 * PAGE, handle, offset=PAGE) == "NV_ERR_INVALID_OFFSET"
  assert _map(d, base, PAGE, handle, offset=0x800) == "NV_ERR_INVALID_ADDRESS"    # no page size divides the offset
  assert _map(d, base, 2 * PAGE, d.subdevice) == "NV_ERR_INVALID_OBJECT_HANDLE"
  assert _map(d, base, 2 * PAGE, handle) == "NV_OK"
  # an Ampere GPU (49 VA bits) with a 48-bit CPU addresses user VAs below 2**47; Hopper (57 bits) below 2**56
  edge = (1 << 47) - PAGE
  assert create(edge, 2 * PAGE) == "NV_OK"
  assert _map(d, edge, PAGE, handle) == "NV_OK" and _map(d, edge, 2 * PAGE, handle) == "NV_ERR_OUT_OF_RANGE"
  h = _driver("GH100")
  h_handle = _alloc_memory(h, host, 2 * PAGE - 1)[1]
  assert _uvm(h, rm.UVM_CREATE_EXTERNAL_RANGE, base=edge, length=2 * PAGE) == "NV_OK"
  assert _map(h, edge, 2 * PAGE, h_handle) == "NV_OK"
  assert _uvm(d, rm.UVM_FREE, base=base, length=PAGE) == "NV_ERR_INVALID_ADDRESS"   # not the whole range
  assert _uvm(d, rm.UVM_FREE, base=base, length=4 * PAGE) == "NV_OK"
  with pytest.raises(MemoryFault): d.k.gpu.mem.read(base, 1)                        # its mappings went with it


# ---- the driver ----
def _wait_fence(d, kind: str):
  ch, end = d.channels[kind], time.monotonic() + 30
  while d._u64(ch.fence.addr) < ch.fence_value and time.monotonic() < end and d.k.fault() is None: time.sleep(0.002)
  d.check_faults("NV")


def test_map_host_ioctls_copy_engine_and_free(monkeypatch):
  d = _driver()
  n = 4 * PAGE
  host = _host(n)
  view = np.frombuffer(d.view(host, n), np.uint8)
  calls = []
  real = d.k.ioctl

  def record(fd, request, arg, name=None, fields=None):
    r = real(fd, request, arg, name=name, fields=fields)
    p = ffi.cast(rm.ESCAPES[request & 0xFF][1] + " *" if fd != d.fd_uvm else rm.UVM_IOCTLS[request][1] + " *", arg)
    if name == "NV_ESC_RM_ALLOC_MEMORY":
      a = p.params
      calls.append((name, fd == d.fd_dev, a.hObjectParent == d.device, a.hClass, a.flags, a.pMemory, a.limit, a.status))
    elif name == "UVM_CREATE_EXTERNAL_RANGE" or name == "UVM_FREE": calls.append((name, p.base, p.length, p.rmStatus))
    elif name == "UVM_MAP_EXTERNAL_ALLOCATION":
      calls.append((name, p.base, p.length, p.offset, p.hMemory, p.gpuAttributesCount, bytes(p.perGpuAttributes[0].gpuUuid),
                    p.rmStatus))
    elif name == "NV_ESC_RM_FREE": calls.append((name, p.hObjectParent == d.device, p.hObjectOld, p.status))
    return r
  monkeypatch.setattr(d.k, "ioctl", record)
  mem = d.map_host(host, n)
  assert calls == [("NV_ESC_RM_ALLOC_MEMORY", True, True, 0x71, 0x40001010, host, n - 1, 0),
                   ("UVM_CREATE_EXTERNAL_RANGE", host, n, 0),
                   ("UVM_MAP_EXTERNAL_ALLOCATION", host, n, 0, mem.handle, 1, GPU_UUID, 0)]
  # the GPU reaches the pages at their host address: the copy engine writes and reads them, a semaphore lands there
  monkeypatch.undo()
  own = d.alloc(n)
  pattern = np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8)
  np.frombuffer(d.view(own.addr, n), np.uint8)[:] = pattern
  d.submit("copy", d.encode("copy", [("copy", host, own.addr, n),
                                     ("signal", types.SimpleNamespace(addr=own.addr + n), 0x1234_5678_9ABC)]))
  _wait_fence(d, "copy")
  np.testing.assert_array_equal(view, pattern)
  view[:] = pattern[::-1]
  d.submit("copy", d.encode("copy", [("copy", own.addr, host, n), ("signal", types.SimpleNamespace(addr=host), 7)]))
  _wait_fence(d, "copy")
  np.testing.assert_array_equal(np.frombuffer(d.view(own.addr, n), np.uint8), pattern[::-1])
  assert d._u64(host) == 7
  # free: UVM unmaps, RM drops the descriptor; the pages stay the owner's (not unmapped from the process)
  calls.clear()
  monkeypatch.setattr(d.k, "ioctl", record)
  d.free(mem)
  assert calls == [("UVM_FREE", host, n, 0), ("NV_ESC_RM_FREE", True, mem.handle, 0)]
  monkeypatch.undo()
  view[:] = 3                           # still host memory
  assert mem.handle not in d.k.clients[d.rm.root] and host not in d.k.uvm_ranges
  d.submit("copy", d.encode("copy", [("copy", host, own.addr, n)]))      # the GPU no longer reaches it: an MMU fault
  with pytest.raises(NVError, match=r"ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT.*destination .* is not mapped on the GPU"):
    _wait_fence(d, "copy")


def test_map_host_refusals_are_oserrors_that_leave_nothing_behind():
  d = _driver()
  host = _host(2 * PAGE)
  with pytest.raises(ValueError, match="multiples of the 0x1000-byte page"): d.map_host(host + 8, PAGE)
  objects = len(d.k.clients[d.rm.root])
  with pytest.raises(HostMapError, match="NV_ERR_INVALID_ADDRESS.*could not pin the pages") as e: d.map_host(8 * PAGE, PAGE)
  assert isinstance(e.value, OSError)
  d.map_host(host, 2 * PAGE)
  with pytest.raises(OSError, match="NV_ERR_UVM_ADDRESS_IN_USE"): d.map_host(host, PAGE)   # already mapped there
  assert len(d.k.clients[d.rm.root]) == objects + 1          # the refused descriptors were freed again


# ---- devices: NV <-> NV copies on the copy engine ----
@pytest.fixture(scope="module")
def nv_pair():
  before = set(Device._open)
  with settings.override(EMU=1):
    devs = Device.get("NV"), Device.get("NV:1")
  if not all(d.driver.k.emulated for d in devs): pytest.skip("NV is a real GPU here; this test uses emulated ones")
  yield devs
  gc.collect()
  for name, dev in list(Device._open.items()):
    if name not in before: dev.close()


def test_nv_to_nv_copies_run_on_the_copy_engine_not_the_host_relay(nv_pair, monkeypatch):
  nv0, nv1 = nv_pair
  monkeypatch.setattr(transfer, "_links", {})
  monkeypatch.setattr(transfer, "relay", lambda: pytest.fail("a copy went through the host relay"))
  monkeypatch.setattr(transfer, "HostLink", lambda *a: pytest.fail(f"host relay chosen for {a[0].name}->{a[1].name}"))
  engines = []
  real_copy = nv_gpu.ChannelProcessor.copy

  def copy(self, regs, launch):
    engines.append((self.gpu, self.chname, threading.current_thread().name))
    return real_copy(self, regs, launch)
  monkeypatch.setattr(nv_gpu.ChannelProcessor, "copy", copy)
  threads = {t.name for t in threading.enumerate()}
  a = np.random.default_rng(2).standard_normal((33, 7)).astype(np.float32)
  y = (Tensor(a, device="NV") * 2 + 1).to("NV:1")
  z = (y * 3).to("NV")
  np.testing.assert_allclose(z.numpy(), (a * 2 + 1) * 3, rtol=1e-6)
  np.testing.assert_allclose(y.numpy(), a * 2 + 1, rtol=1e-6)
  for src, dst in ((nv0, nv1), (nv1, nv0)):
    link = transfer.link(src, dst)
    assert (link.path, link.kind, link.engine) == ("peer", "copy", dst)
    assert transfer.copy_path(src.name, dst.name) == f"peer ({dst.name} copy queue addresses {src.name}'s memory)"
  assert (nv1.driver.k.gpu, "copy") in [e[:2] for e in engines] and (nv0.driver.k.gpu, "copy") in [e[:2] for e in engines]
  assert all(name.startswith("nv-emu-") for _, _, name in engines), engines
  assert "baregrad host relay" not in {t.name for t in threading.enumerate()} - threads


def test_a_freed_buffer_is_unmapped_from_the_peer(nv_pair):
  nv0, nv1 = nv_pair
  n = 3 * PAGE // 4
  src, dst = Buffer("NV", n, dtypes.float32).ensure_allocated(), Buffer("NV:1", n, dtypes.float32).ensure_allocated()
  data = np.arange(n, dtype=np.float32)
  src.copyin(memoryview(data).cast("B"))
  with Device.lock: transfer.copy(dst, src)
  out = np.empty(n, np.float32)
  dst.copyout(memoryview(out).cast("B"))
  np.testing.assert_array_equal(out, data)
  addr = src.addr
  assert addr in nv1.driver._host_maps and addr in nv1.driver.k.uvm_ranges       # NV:1 mapped NV's buffer, same VA
  del src
  gc.collect()
  nv0.synchronize()
  nv0.allocator.free_cache()          # NV gives the memory back: NV:1's mapping of it goes first
  assert addr not in nv1.driver._host_maps and addr not in nv1.driver.k.uvm_ranges
  with pytest.raises(MemoryFault): nv1.driver.k.gpu.mem.read(addr, 1)
