"""EMU=1 DEV=NV: an emulated NVIDIA kernel driver (RM + UVM) with one Hopper (sm_90, HOPPER_COMPUTE_A) GPU.

Implements the kernel interface of drivers/kernel.py: `open` of /dev/nvidiactl, /dev/nvidia0, /dev/nvidia-uvm
gives fake descriptors; `ioctl` decodes the same request numbers and parameter structs the driver uses
(drivers/nv/rm.py) and checks them as RM does: the request size, the fd kind (control device / GPU device / UVM),
the client, parent handles and classes (which class may live under which), parameter sizes, duplicate handles,
UVM initialization order, VA ranges; a bad call gets the NV status code the real driver returns. Anonymous
mmaps are real host memory; an mmap of a /dev/nvidiaN fd after NV_ESC_RM_MAP_MEMORY maps the RM object (the
usermode doorbell page). Memory described by an OS descriptor and mapped with UVM_MAP_EXTERNAL_ALLOCATION becomes
GPU memory at that VA (drivers/emu/nv_gpu.py); each GPFIFO channel gets a processor thread.
"""
from __future__ import annotations
import errno, struct
from dataclasses import dataclass, field
from baregrad.drivers import kernel as kernel_mod
from baregrad.drivers.kernel import KernelCallError, KernelInterface
from baregrad.drivers.nv import rm
from baregrad.drivers.nv.rm import ffi
from .nv_gpu import NVGpu, ChannelProcessor, EmulatedProgram

DRIVER_VERSION = "580.159.04"
GPU_UUID = bytes.fromhex("475055b4e4a6d1c2a1b2c3d4e5f60718")
S = rm.STATUS
CTL, DEV, UVM = "/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-uvm"
PAGE = 0x1000

# class -> classes its parent may have; the GPU's class list
PARENTS = {
  rm.NV01_DEVICE_0: (rm.NV01_ROOT_CLIENT,), rm.NV20_SUBDEVICE_0: (rm.NV01_DEVICE_0,),
  rm.HOPPER_USERMODE_A: (rm.NV20_SUBDEVICE_0,), rm.FERMI_VASPACE_A: (rm.NV01_DEVICE_0,),
  rm.KEPLER_CHANNEL_GROUP_A: (rm.NV01_DEVICE_0,), rm.FERMI_CONTEXT_SHARE_A: (rm.KEPLER_CHANNEL_GROUP_A,),
  rm.HOPPER_CHANNEL_GPFIFO_A: (rm.KEPLER_CHANNEL_GROUP_A,), rm.HOPPER_COMPUTE_A: (rm.HOPPER_CHANNEL_GPFIFO_A,),
  rm.HOPPER_DMA_COPY_A: (rm.HOPPER_CHANNEL_GPFIFO_A,), rm.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR: (rm.NV01_DEVICE_0,),
}
GPU_CLASSES = [rm.NV01_DEVICE_0, rm.NV20_SUBDEVICE_0, rm.HOPPER_USERMODE_A, rm.FERMI_VASPACE_A, rm.KEPLER_CHANNEL_GROUP_A,
               rm.FERMI_CONTEXT_SHARE_A, rm.HOPPER_CHANNEL_GPFIFO_A, rm.HOPPER_COMPUTE_A, rm.HOPPER_DMA_COPY_A,
               rm.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR]
# control command -> classes it is valid on (the command's high 16 bits name its interface's class)
CONTROL_CLASSES = {
  rm.NV0080_CTRL_CMD_GPU_GET_CLASSLIST_V2: (rm.NV01_DEVICE_0,), rm.NV2080_CTRL_CMD_GPU_GET_GID_INFO: (rm.NV20_SUBDEVICE_0,),
  rm.NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN: (rm.HOPPER_CHANNEL_GPFIFO_A,),
  rm.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE: (rm.KEPLER_CHANNEL_GROUP_A,),
}


class RMFail(Exception):
  def __init__(self, status: str): self.status = S[status]


@dataclass
class Obj:
  cls: int
  parent: int
  children: list = field(default_factory=list)
  info: dict = field(default_factory=dict)


@dataclass
class File:
  path: str
  uvm_state: str = ""          # "", "initialized", "mm"
  registered_ctl: int | None = None
  map_context: tuple | None = None   # (object host address, length) from NV_ESC_RM_MAP_MEMORY


class EmulatedNVKernel:
  emulated = True

  def __init__(self, va_space_mm: bool = True):
    # va_space_mm=False: a kernel where UVM's va_space_mm is disabled, so UVM_MM_INITIALIZE answers
    # NV_WARN_NOTHING_TO_DO (uvm.c, uvm_api_mm_initialize; 580.142), which is not an error
    self.va_space_mm = va_space_mm
    self.real = KernelInterface()
    self.gpu = NVGpu()
    self.files: dict[int, File] = {}
    self._next_fd = 1000
    self.clients: dict[int, dict[int, Obj]] = {}
    self._next_client = 0xC1D00000
    self.anon: dict[int, int] = {}         # host mappings made through this interface: address -> length
    self.uvm_ranges: dict[int, int] = {}   # external ranges: base -> length
    self.uvm_gpu_registered = False
    self.tokens: dict[int, int] = {}
    self.version_text = f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {DRIVER_VERSION}  (emulated)\n"

  # ---- files ----
  def exists(self, path: str) -> bool: return path in (CTL, DEV, UVM, "/proc/driver/nvidia/version")

  def read_text(self, path: str) -> str:
    if path != "/proc/driver/nvidia/version": raise KernelCallError(errno.ENOENT, f"{path}: no such file")
    return self.version_text

  def open(self, path: str, flags: int = 0) -> int:
    if path not in (CTL, DEV, UVM):
      kernel_mod.log("open", path=path, flags=flags, result=-1)
      raise KernelCallError(errno.ENOENT, f"open({path!r}) failed: errno {errno.ENOENT} (ENOENT) [emulated NV]")
    self._next_fd += 1
    self.files[self._next_fd] = File(path)
    kernel_mod.log("open", path=path, flags=flags, result=self._next_fd)
    return self._next_fd

  def close(self, fd: int) -> None:
    if self.files.pop(fd, None) is None: raise KernelCallError(errno.EBADF, f"close({fd}) failed: EBADF [emulated NV]")
    kernel_mod.log("close", fd=fd, result=0)

  def mmap(self, addr: int, length: int, prot: int, flags: int, fd: int, offset: int) -> int:
    if fd == -1:
      res = self.real.mmap(addr, length, prot, flags, fd, offset)
      self.anon[res] = length
      return res
    f = self._file(fd, "mmap")
    if f.path != DEV or f.map_context is None:
      raise KernelCallError(errno.EINVAL, f"mmap of fd {fd} ({f.path}) without an NV_ESC_RM_MAP_MEMORY context [emulated NV]")
    host, size = f.map_context
    if offset != 0 or length > size: raise KernelCallError(errno.EINVAL, f"mmap of {length:#x} bytes at offset {offset:#x} "
                                                                          f"exceeds the mapped object ({size:#x} bytes)")
    kernel_mod.log("mmap", addr=addr, length=length, prot=prot, flags=flags, fd=fd, offset=offset, result=host)
    return host

  def munmap(self, addr: int, length: int) -> None:
    if addr in self.anon:
      del self.anon[addr]
      self.real.munmap(addr, length)
    else: kernel_mod.log("munmap", addr=addr, length=length, result=0)

  def _file(self, fd: int, what: str) -> File:
    if fd not in self.files: raise KernelCallError(errno.EBADF, f"{what} on fd {fd}: not open [emulated NV]")
    return self.files[fd]

  # ---- the side channel and faults ----
  def register_program(self, code_addr: int, source: str | None, name: str, param_base: int, params: list):
    """The driver hands over the PTX of the cubin it uploaded at `code_addr` (drivers/emu/README.md)."""
    if source is None: raise ValueError(f"emulated NV GPU: no PTX for kernel {name}: the emulator runs PTX, not SASS")
    self.gpu.programs[code_addr] = EmulatedProgram(source, name, param_base, params)

  def unregister_program(self, code_addr: int):
    self.gpu.programs.pop(code_addr, None)

  def fault(self) -> str | None:
    with self.gpu.lock: faults = list(self.gpu.faults.values())
    return "; ".join(faults) or None

  # ---- ioctl ----
  def ioctl(self, fd: int, request: int, arg, name: str | None = None, fields=None) -> int:
    f = self._file(fd, f"ioctl {name or hex(request)}")
    addr = int(ffi.cast("uintptr_t", arg))
    if f.path == UVM: r = self._uvm(f, request, addr, name)
    else: r = self._escape(fd, f, request, addr, name)
    kernel_mod.log("ioctl", fd=fd, request=request, name=name, fields=fields() if callable(fields) else fields, result=r, path=f.path)
    return r

  def _einval(self, what: str):
    raise KernelCallError(errno.EINVAL, f"ioctl {what} failed: errno {errno.EINVAL} (EINVAL) [emulated NV]")

  def _escape(self, fd: int, f: File, request: int, addr: int, name) -> int:
    nr, kind, size = request & 0xFF, (request >> 8) & 0xFF, (request >> 16) & 0x3FFF
    if kind != ord(rm.NV_IOCTL_MAGIC) or nr not in rm.ESCAPES or request >> 30 != 3:
      self._einval(f"{request:#x} on {f.path} (not an NV escape)")
    esc_name, struct_name = rm.ESCAPES[nr]
    if size != ffi.sizeof(struct_name): self._einval(f"{esc_name}: size {size}, the driver expects {ffi.sizeof(struct_name)}")
    p = ffi.cast(struct_name.replace("[32]", "") + " *", addr)
    device_only = nr in (rm.NV_ESC_RM_ALLOC_MEMORY, rm.NV_ESC_REGISTER_FD)   # the rest: /dev/nvidiactl only (escape.c)
    if (f.path == CTL) == device_only or f.path not in (CTL, DEV):
      if nr in (rm.NV_ESC_CARD_INFO, rm.NV_ESC_CHECK_VERSION_STR, rm.NV_ESC_REGISTER_FD): self._einval(f"{esc_name} on {f.path}")
      (p.params if nr in (rm.NV_ESC_RM_ALLOC_MEMORY, rm.NV_ESC_RM_MAP_MEMORY) else p).status = S["NV_ERR_INVALID_ARGUMENT"]
      return 0
    if nr == rm.NV_ESC_CHECK_VERSION_STR:
      p.reply = rm.NV_RM_API_VERSION_REPLY_RECOGNIZED
      if p.cmd == rm.NV_RM_API_VERSION_CMD_QUERY: p.versionString = DRIVER_VERSION.encode()
      return 0
    if nr == rm.NV_ESC_CARD_INFO:
      cards = ffi.cast("nv_ioctl_card_info_t *", addr)
      for i in range(rm.NV_MAX_DEVICES): cards[i] = ffi.new("nv_ioctl_card_info_t *")[0]
      cards[0].valid, cards[0].gpu_id, cards[0].minor_number = 1, 0x100, 0
      cards[0].pci_info.vendor_id, cards[0].pci_info.device_id, cards[0].pci_info.bus = 0x10DE, 0x2330, 1   # H100 SXM
      return 0
    if nr == rm.NV_ESC_REGISTER_FD:
      if p.ctl_fd not in self.files or self.files[p.ctl_fd].path != CTL: self._einval(f"{esc_name}: ctl_fd {p.ctl_fd} is not /dev/nvidiactl")
      f.registered_ctl = p.ctl_fd
      return 0
    handlers = {rm.NV_ESC_RM_ALLOC: (self._alloc, lambda: p), rm.NV_ESC_RM_CONTROL: (self._control, lambda: p),
                rm.NV_ESC_RM_FREE: (self._free, lambda: p), rm.NV_ESC_RM_ALLOC_MEMORY: (self._alloc_memory, lambda: p),
                rm.NV_ESC_RM_MAP_MEMORY: (self._map_memory, lambda: p), rm.NV_ESC_RM_MAP_MEMORY_DMA: (self._unsupported, lambda: p)}
    fn, params = handlers[nr]
    out = params()
    status_target = out.params if nr in (rm.NV_ESC_RM_ALLOC_MEMORY, rm.NV_ESC_RM_MAP_MEMORY) else out
    try:
      fn(out, fd)
      status_target.status = rm.NV_OK
    except RMFail as e:
      status_target.status = e.status
    return 0

  def _unsupported(self, p, fd): raise RMFail("NV_ERR_NOT_SUPPORTED")

  # ---- RM objects ----
  def _client(self, h: int) -> dict:
    if h not in self.clients: raise RMFail("NV_ERR_INVALID_CLIENT")
    return self.clients[h]

  def _obj(self, client: dict, h: int, what: str = "NV_ERR_INVALID_OBJECT_HANDLE") -> Obj:
    if h not in client: raise RMFail(what)
    return client[h]

  def _find(self, client: dict, h: int, cls) -> Obj:
    o = client.get(h)
    if o is None or o.cls not in ((cls,) if isinstance(cls, int) else cls): raise RMFail("NV_ERR_INVALID_OBJECT_HANDLE")
    return o

  def _params(self, p, struct_name: str):
    if p.paramsSize != ffi.sizeof(struct_name) or not p.pAllocParms: raise RMFail("NV_ERR_INVALID_PARAM_STRUCT")
    return ffi.cast(struct_name + " *", p.pAllocParms)

  def _alloc(self, p, fd):
    if p.hClass == rm.NV01_ROOT_CLIENT:
      if p.hObjectNew == 0:
        self._next_client += 1
        p.hObjectNew = self._next_client
      if p.hObjectNew in self.clients: raise RMFail("NV_ERR_INSERT_DUPLICATE_NAME")
      self.clients[p.hObjectNew] = {p.hObjectNew: Obj(rm.NV01_ROOT_CLIENT, 0)}
      return
    client = self._client(p.hRoot)
    if p.hClass not in PARENTS or p.hClass == rm.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR: raise RMFail("NV_ERR_INVALID_CLASS")
    parent = self._obj(client, p.hObjectParent, "NV_ERR_INVALID_OBJECT_PARENT")
    if parent.cls not in PARENTS[p.hClass]: raise RMFail("NV_ERR_INVALID_OBJECT_PARENT")
    if p.hObjectNew == 0: raise RMFail("NV_ERR_INVALID_OBJECT_NEW")
    if p.hObjectNew in client: raise RMFail("NV_ERR_INSERT_DUPLICATE_NAME")
    obj = Obj(p.hClass, p.hObjectParent)
    struct_name = rm.ALLOC_PARAMS.get(p.hClass)
    a = self._params(p, struct_name) if struct_name else None
    if p.hClass == rm.NV01_DEVICE_0 and a.deviceId != 0: raise RMFail("NV_ERR_INVALID_DEVICE")
    if p.hClass == rm.NV20_SUBDEVICE_0 and a.subDeviceId != 0: raise RMFail("NV_ERR_INVALID_DEVICE")
    if p.hClass == rm.HOPPER_USERMODE_A:
      obj.info["host"] = self.real.mmap(0, 0x10000, 3, kernel_mod.MAP_PRIVATE | kernel_mod.MAP_ANONYMOUS, -1, 0)
      obj.info["size"] = 0x10000
    if p.hClass == rm.KEPLER_CHANNEL_GROUP_A and a.engineType not in (rm.NV2080_ENGINE_TYPE_GRAPHICS, rm.NV2080_ENGINE_TYPE_COPY0):
      raise RMFail("NV_ERR_INVALID_ARGUMENT")
    if p.hClass == rm.FERMI_CONTEXT_SHARE_A: self._find(client, a.hVASpace, rm.FERMI_VASPACE_A)
    if p.hClass in (rm.HOPPER_COMPUTE_A, rm.HOPPER_DMA_COPY_A):
      if any(client[c].cls == p.hClass for c in parent.children): raise RMFail("NV_ERR_INVALID_STATE")
      if p.hClass == rm.HOPPER_COMPUTE_A and parent.info["engine"] != rm.NV2080_ENGINE_TYPE_GRAPHICS: raise RMFail("NV_ERR_INVALID_CLASS")
      parent.info["objects"][p.hObjectNew] = p.hClass
    if p.hClass == rm.HOPPER_CHANNEL_GPFIFO_A: self._channel(client, parent, obj, a, p.hObjectNew)
    client[p.hObjectNew] = obj
    parent.children.append(p.hObjectNew)

  def _channel(self, client, group: Obj, obj: Obj, a, handle: int):
    ctx = self._find(client, a.hContextShare, rm.FERMI_CONTEXT_SHARE_A)
    if ctx.parent != obj.parent and ctx.parent not in (obj.parent,): raise RMFail("NV_ERR_INVALID_OBJECT_HANDLE")
    if a.gpFifoEntries == 0 or a.gpFifoEntries & (a.gpFifoEntries - 1): raise RMFail("NV_ERR_INVALID_ARGUMENT")
    if a.engineType not in (rm.NV2080_ENGINE_TYPE_GRAPHICS, rm.NV2080_ENGINE_TYPE_COPY0): raise RMFail("NV_ERR_INVALID_ARGUMENT")
    userd = self._find(client, a.hUserdMemory[0], rm.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR)
    if a.userdOffset[0] + 0x200 > userd.info["size"]: raise RMFail("NV_ERR_INVALID_OFFSET")
    notifier = None
    if a.hObjectError:
      err = self._find(client, a.hObjectError, rm.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR)
      notifier = err.info.get("va")
    if not self._gpu_mapped(a.gpFifoOffset, 8 * a.gpFifoEntries): raise RMFail("NV_ERR_INVALID_ADDRESS")
    if userd.info.get("va") is None: raise RMFail("NV_ERR_INVALID_ADDRESS")
    token = len(self.tokens) + 1
    obj.info.update(engine=a.engineType, objects={}, token=token)
    proc = ChannelProcessor(self.gpu, "compute" if a.engineType == rm.NV2080_ENGINE_TYPE_GRAPHICS else "copy", handle,
                            a.gpFifoOffset, a.gpFifoEntries, userd.info["va"] + a.userdOffset[0], notifier, obj.info["objects"], None)
    obj.info["proc"] = proc
    self.tokens[token] = handle

  def _gpu_mapped(self, va: int, n: int) -> bool:
    try: self.gpu.mem.read(va, 1); self.gpu.mem.read(va + n - 1, 1); return True
    except Exception: return False

  def _control(self, p, fd):
    client = self._client(p.hClient)
    obj = self._obj(client, p.hObject)
    if p.cmd not in CONTROL_CLASSES: raise RMFail("NV_ERR_NOT_SUPPORTED")
    if obj.cls not in CONTROL_CLASSES[p.cmd]: raise RMFail("NV_ERR_NOT_SUPPORTED")
    struct_name = rm.CONTROLS[p.cmd][1]
    if p.paramsSize != ffi.sizeof(struct_name) or not p.params: raise RMFail("NV_ERR_INVALID_PARAM_STRUCT")
    c = ffi.cast(struct_name + " *", p.params)
    if p.cmd == rm.NV0080_CTRL_CMD_GPU_GET_CLASSLIST_V2:
      c.numClasses = len(GPU_CLASSES)
      c.classList[0:len(GPU_CLASSES)] = GPU_CLASSES
    elif p.cmd == rm.NV2080_CTRL_CMD_GPU_GET_GID_INFO:
      if c.flags != rm.NV2080_GPU_CMD_GPU_GET_GID_FLAGS_FORMAT_BINARY: raise RMFail("NV_ERR_NOT_SUPPORTED")
      c.length = 16
      c.data[0:16] = GPU_UUID
    elif p.cmd == rm.NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN:
      c.workSubmitToken = obj.info["token"]
    elif p.cmd == rm.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE:
      if c.bEnable:
        for h in obj.children:
          ch = client[h]
          if ch.cls == rm.HOPPER_CHANNEL_GPFIFO_A and not ch.info["proc"].is_alive():
            self.gpu.channels.append(ch.info["proc"])
            ch.info["proc"].start()

  def _free(self, p, fd):
    client = self._client(p.hRoot)
    if p.hObjectOld == p.hRoot:
      for o in client.values(): self._release(o)
      del self.clients[p.hRoot]
      return
    obj = self._obj(client, p.hObjectOld)
    def drop(h):
      o = client.pop(h)
      for c in o.children: drop(c)
      self._release(o)
    if obj.parent in client and p.hObjectOld in client[obj.parent].children: client[obj.parent].children.remove(p.hObjectOld)
    drop(p.hObjectOld)

  def _release(self, o: Obj):
    if "proc" in o.info: self.gpu.release(o.info["proc"])

  def _alloc_memory(self, p, fd):
    a = p.params
    if self.files[fd].registered_ctl is None: raise RMFail("NV_ERR_INVALID_ARGUMENT")
    client = self._client(a.hRoot)
    if a.hClass != rm.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR: raise RMFail("NV_ERR_INVALID_CLASS")
    parent = self._obj(client, a.hObjectParent, "NV_ERR_INVALID_OBJECT_PARENT")
    if parent.cls != rm.NV01_DEVICE_0: raise RMFail("NV_ERR_INVALID_OBJECT_PARENT")
    if a.hObjectNew == 0: raise RMFail("NV_ERR_INVALID_OBJECT_NEW")
    if a.hObjectNew in client: raise RMFail("NV_ERR_INSERT_DUPLICATE_NAME")
    size = a.limit + 1
    if a.pMemory % PAGE or size % PAGE: raise RMFail("NV_ERR_INVALID_ADDRESS")
    if not any(b <= a.pMemory and a.pMemory + size <= b + n for b, n in self.anon.items()):
      raise RMFail("NV_ERR_INVALID_ADDRESS")   # not memory this process mapped
    client[a.hObjectNew] = Obj(a.hClass, a.hObjectParent, info={"host": a.pMemory, "size": size})
    parent.children.append(a.hObjectNew)

  def _map_memory(self, p, fd):
    a = p.params
    client = self._client(a.hClient)
    obj = self._obj(client, a.hMemory)
    if obj.parent != a.hDevice: raise RMFail("NV_ERR_INVALID_OBJECT_PARENT")
    if "host" not in obj.info or obj.cls == rm.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR: raise RMFail("NV_ERR_INVALID_CLASS")
    if a.offset + a.length > obj.info["size"] or a.length == 0: raise RMFail("NV_ERR_INVALID_LIMIT")
    target = self.files.get(p.fd)
    if target is None or target.path != DEV or target.registered_ctl is None: raise RMFail("NV_ERR_INVALID_ARGUMENT")
    target.map_context = (obj.info["host"] + a.offset, a.length)
    a.pLinearAddress = obj.info["host"] + a.offset

  # ---- UVM ----
  def _uvm(self, f: File, request: int, addr: int, name) -> int:
    if request not in rm.UVM_IOCTLS: self._einval(f"{request:#x} on {UVM} (unknown UVM ioctl)")
    uvm_name, struct_name = rm.UVM_IOCTLS[request]
    p = ffi.cast(struct_name + " *", addr)
    try:
      getattr(self, "_" + uvm_name.lower())(f, p)
      p.rmStatus = rm.NV_OK
    except RMFail as e:
      p.rmStatus = e.status
    return 0

  def _need_init(self, f: File):
    if f.uvm_state != "initialized": raise RMFail("NV_ERR_ILLEGAL_ACTION")

  def _uvm_initialize(self, f, p):
    if f.uvm_state: raise RMFail("NV_ERR_ILLEGAL_ACTION")
    f.uvm_state = "initialized"

  def _uvm_mm_initialize(self, f, p):
    other = self.files.get(p.uvmFd)
    if other is None or other.path != UVM or other.uvm_state != "initialized": raise RMFail("NV_ERR_INVALID_ARGUMENT")
    if f.uvm_state: raise RMFail("NV_ERR_IN_USE")
    if not self.va_space_mm: raise RMFail("NV_WARN_NOTHING_TO_DO")
    f.uvm_state = "mm"

  def _check_rm(self, fd: int, h: int):
    if fd not in self.files or self.files[fd].path != CTL: raise RMFail("NV_ERR_INVALID_ARGUMENT")
    return self._client(h)

  def _uvm_register_gpu(self, f, p):
    self._need_init(f)
    self._check_rm(p.rmCtrlFd, p.hClient)
    if bytes(p.gpu_uuid) != GPU_UUID: raise RMFail("NV_ERR_INVALID_DEVICE")
    self.uvm_gpu_registered = True

  def _uvm_register_gpu_vaspace(self, f, p):
    self._need_init(f)
    client = self._check_rm(p.rmCtrlFd, p.hClient)
    if not self.uvm_gpu_registered or bytes(p.gpuUuid) != GPU_UUID: raise RMFail("NV_ERR_INVALID_DEVICE")
    self._find(client, p.hVaSpace, rm.FERMI_VASPACE_A)
    self.vaspace = p.hVaSpace

  def _uvm_create_external_range(self, f, p):
    self._need_init(f)
    if p.base % PAGE or p.length % PAGE or p.length == 0: raise RMFail("NV_ERR_INVALID_ADDRESS")
    if any(b < p.base + p.length and p.base < b + n for b, n in self.uvm_ranges.items()): raise RMFail("NV_ERR_UVM_ADDRESS_IN_USE")
    self.uvm_ranges[p.base] = p.length

  def _uvm_map_external_allocation(self, f, p):
    self._need_init(f)
    client = self._check_rm(p.rmCtrlFd, p.hClient)
    if not any(b <= p.base and p.base + p.length <= b + n for b, n in self.uvm_ranges.items()): raise RMFail("NV_ERR_INVALID_ADDRESS")
    if p.gpuAttributesCount < 1 or bytes(p.perGpuAttributes[0].gpuUuid) != GPU_UUID: raise RMFail("NV_ERR_INVALID_DEVICE")
    if getattr(self, "vaspace", None) is None: raise RMFail("NV_ERR_INVALID_STATE")
    mem = self._find(client, p.hMemory, rm.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR)
    if p.offset + p.length > mem.info["size"]: raise RMFail("NV_ERR_INVALID_LIMIT")
    self.gpu.map_host(p.base, mem.info["host"] + p.offset, p.length)
    mem.info["va"] = p.base

  def _uvm_free(self, f, p):
    self._need_init(f)
    if self.uvm_ranges.get(p.base) != p.length: raise RMFail("NV_ERR_INVALID_ADDRESS")
    del self.uvm_ranges[p.base]
    try: self.gpu.mem.unmap(p.base)
    except ValueError: pass
