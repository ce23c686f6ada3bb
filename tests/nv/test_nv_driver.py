"""NV driver facts and error paths, no GPU and no emulator needed: struct layouts against the numbers derived from
NVIDIA's open-gpu-kernel-modules 580.142 headers, ioctl encoding, pushbuffer/GPFIFO formats, QMD packing, and the
errors for a missing device, an unsupported driver series and a failing RM call (fake kernel interfaces)."""
import errno
import pytest
from baregrad.drivers.nv import rm, qmd, pushbuf as pb
from baregrad.drivers.nv.rm import ffi
from baregrad.drivers.nv.driver import NVDriver, NVError, RMError, check_version

# (struct, size, {field: offset}): x86-64 layouts worked out by hand from the headers named in the comments
LAYOUTS = [
  ("NVOS00_PARAMETERS", 16, {"hObjectOld": 8, "status": 12}),                                 # nvos.h
  ("NVOS02_PARAMETERS", 48, {"flags": 16, "pMemory": 24, "limit": 32, "status": 40}),         # nvos.h
  ("nv_ioctl_nvos02_parameters_with_fd", 56, {"fd": 48}),                                     # nv-unix-nvos-params-wrappers.h
  ("NVOS21_PARAMETERS", 32, {"hClass": 12, "pAllocParms": 16, "paramsSize": 24, "status": 28}),  # nvos.h
  ("NVOS33_PARAMETERS", 48, {"offset": 16, "length": 24, "pLinearAddress": 32, "status": 40, "flags": 44}),
  ("nv_ioctl_nvos33_parameters_with_fd", 56, {"fd": 48}),
  ("NVOS46_PARAMETERS", 64, {"offset": 16, "flags": 32, "kindOverride": 40, "dmaOffset": 48, "status": 56}),
  ("NVOS54_PARAMETERS", 32, {"cmd": 8, "flags": 12, "params": 16, "paramsSize": 24, "status": 28}),
  ("nv_ioctl_card_info_t", 72, {"pci_info": 4, "gpu_id": 16, "interrupt_line": 20, "reg_address": 24,
                                "fb_size": 48, "minor_number": 56, "dev_name": 60}),          # nv-ioctl.h
  ("nv_ioctl_rm_api_version_t", 72, {"reply": 4, "versionString": 8}),                       # nv-ioctl.h
  ("NV0080_ALLOC_PARAMETERS", 56, {"flags": 16, "vaSpaceSize": 24, "vaMode": 48}),            # cl0080.h
  ("NV_VASPACE_ALLOCATION_PARAMETERS", 56, {"vaSize": 8, "bigPageSize": 32, "vaBase": 40, "pasid": 48}),  # nvos.h
  ("NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS", 20, {"engineType": 12, "bIsCallingContextVgpuPlugin": 16}),
  ("NV_CHANNEL_ALLOC_PARAMS", 368, {"gpFifoOffset": 8, "gpFifoEntries": 16, "hContextShare": 24, "hUserdMemory": 32,
                                    "userdOffset": 64, "engineType": 128, "instanceMem": 144, "hPhysChannelGroup": 240,
                                    "errorNotifierMem": 248, "ProcessID": 296, "encryptIv": 304, "hmacNonce": 328,
                                    "tpcConfigID": 360}),                                    # alloc/alloc_channel.h
  ("NV0080_CTRL_GPU_GET_CLASSLIST_V2_PARAMS", 804, {"classList": 4}),                         # ctrl0080gpu.h (200 classes)
  ("NV2080_CTRL_GPU_GET_GID_INFO_PARAMS", 268, {"length": 8, "data": 12}),                    # ctrl2080gpu.h
  ("UVM_INITIALIZE_PARAMS", 16, {"rmStatus": 8}),                                             # uvm_linux_ioctl.h
  ("UVM_REGISTER_GPU_PARAMS", 40, {"numaEnabled": 16, "numaNodeId": 20, "rmCtrlFd": 24, "hClient": 28, "rmStatus": 36}),
  ("UVM_REGISTER_GPU_VASPACE_PARAMS", 32, {"rmCtrlFd": 16, "hVaSpace": 24, "rmStatus": 28}),  # uvm_ioctl.h
  ("UvmGpuMappingAttributes", 36, {"gpuMappingType": 16, "gpuCompressionType": 32}),          # uvm_types.h
  ("UVM_MAP_EXTERNAL_ALLOCATION_PARAMS", 9264, {"perGpuAttributes": 24, "gpuAttributesCount": 9240, "rmCtrlFd": 9248,
                                                "hMemory": 9256, "rmStatus": 9260}),          # 256 = UVM_MAX_GPUS
  ("UVM_CREATE_EXTERNAL_RANGE_PARAMS", 24, {"length": 8, "rmStatus": 16}),
]


@pytest.mark.parametrize("name,size,offsets", LAYOUTS, ids=[l[0] for l in LAYOUTS])
def test_struct_layout(name, size, offsets):
  assert ffi.sizeof(name) == size
  for f, off in offsets.items(): assert ffi.offsetof(name, f) == off, f


def test_ioctl_numbers():
  # _IOWR('F', nr, size): direction 3 << 30, size << 16, 'F' (0x46) << 8, nr
  assert rm.escape_request(rm.NV_ESC_RM_ALLOC) == 0xC020462B
  assert rm.escape_request(rm.NV_ESC_RM_CONTROL) == 0xC020462A
  assert rm.escape_request(rm.NV_ESC_RM_FREE) == 0xC0104629
  assert rm.escape_request(rm.NV_ESC_CHECK_VERSION_STR) == 0xC04846D2
  assert rm.escape_request(rm.NV_ESC_CARD_INFO) == 0xC90046C8          # 32 x 72 bytes
  assert rm.escape_request(rm.NV_ESC_RM_MAP_MEMORY) == 0xC038464E
  assert (rm.UVM_INITIALIZE, rm.UVM_MAP_EXTERNAL_ALLOCATION, rm.UVM_CREATE_EXTERNAL_RANGE) == (0x30000001, 33, 73)
  assert (rm.NV0080_CTRL_CMD_GPU_GET_CLASSLIST_V2 >> 8) & 0xFFFF == 0x8002   # class 0x0080, interface 0x02


def test_pushbuffer_formats():
  h = pb.method_header(pb.SUBC_COMPUTE, pb.SEND_PCAS_A, 1)
  assert h == (1 << 29) | (1 << 16) | (1 << 13) | (0x2B4 >> 2) == 0x200120AD
  assert pb.decode_header(h) == (1, 1, 0x2B4, 1)
  w0, w1 = pb.gp_entry(0x12_3456_7890, 100)
  assert (w0, w1) == (0x34567890, 0x12 | (100 << 10))
  assert pb.decode_gp_entry(w0, w1) == (0x12_3456_7890, 100)
  with pytest.raises(ValueError, match="2\\*\\*40"): pb.gp_entry(1 << 41, 4)


@pytest.mark.parametrize("version", [(4, 0), (3, 0)])
def test_qmd_round_trip(version):
  table = qmd.TABLES[version]
  fields = qmd.launch_fields(version, program=0x7F12_3456_7800, cbufs={0: (0x20_0000_1100, 0x300)}, grid=(70000, 3, 2),
                             block=(256, 2, 1), registers=38, shared=1024, barriers=1, sm_config=(8 << 10, 8 << 10, 100 << 10),
                             sass_version=0x90)
  data = qmd.pack(table, fields)
  assert len(data) == qmd.QMD_BYTES == 384           # V04_00 runs to bit 3071 (clcbc0qmd.h); V03_00 fits
  back = qmd.unpack(table, data)
  assert {k: back[k] for k in fields} == fields
  launch = qmd.read_launch(version, data)
  assert launch["program"] == 0x7F12_3456_7800 and launch["cbuf0"] == 0x20_0000_1100
  assert launch["grid"] == (70000, 3, 2) and launch["block"] == (256, 2, 1) and launch["version"] == version
  bits = int.from_bytes(data, "little")
  assert (bits >> 580) & 0xF == version[0]                        # QMD_MAJOR_VERSION MW(583:580), both versions
  if version == (4, 0):
    assert int.from_bytes(data[128:132], "little") == 70000        # GRID_WIDTH MW(1055:1024)
    assert (bits >> 1536) & 0xFFFFFFFF == (0x20_0000_1100 >> 6)    # CONSTANT_BUFFER_ADDR_LOWER_SHIFTED6(0)
  else:
    assert int.from_bytes(data[48:52], "little") == 70000          # CTA_RASTER_WIDTH MW(415:384)
    assert int.from_bytes(data[128:132], "little") == 0x00001100   # CONSTANT_BUFFER_ADDR_LOWER(0) MW(1055:1024)
  with pytest.raises(ValueError, match="REGISTER_COUNT"):
    qmd.pack(table, {**fields, ("REGISTER_COUNT" if version == (4, 0) else "REGISTER_COUNT_V"): 1 << 9})


# ---- error paths with fake kernel interfaces ----
class FakeKernel:
  """Answers just enough of the RM protocol; `version` and `fail` (class -> status) steer it."""
  emulated = True

  def __init__(self, version="580.159.04", fail=None, devices=True):
    self.version, self.fail, self.devices, self.calls = version, fail or {}, devices, []

  def exists(self, path): return self.devices
  def read_text(self, path): return ""
  def open(self, path, flags=0): return 3
  def close(self, fd): pass
  def mmap(self, *a): raise AssertionError("not reached")

  def ioctl(self, fd, request, arg, name=None, fields=None):
    self.calls.append(name)
    addr = int(ffi.cast("uintptr_t", arg))
    if name == "NV_ESC_CHECK_VERSION_STR":
      ffi.cast("nv_ioctl_rm_api_version_t *", addr).versionString = self.version.encode()
    elif name == "NV_ESC_RM_ALLOC":
      p = ffi.cast("NVOS21_PARAMETERS *", addr)
      if p.hClass == rm.NV01_ROOT_CLIENT: p.hObjectNew = 0xC1D00001
      p.status = self.fail.get(p.hClass, 0)
    elif name == "NV_ESC_CARD_INFO":
      ffi.cast("nv_ioctl_card_info_t *", addr)[0].valid = 1
    elif name == "UVM_INITIALIZE" or name == "UVM_MM_INITIALIZE": pass
    return 0


def test_missing_nvidiactl():
  with pytest.raises(NVError, match="/dev/nvidiactl does not exist.*EMU=1"):
    NVDriver(kernel=FakeKernel(devices=False))


def test_unsupported_driver_version():
  with pytest.raises(NVError, match=r"550\.54\.14 is not supported.*580\.x"):
    NVDriver(kernel=FakeKernel(version="550.54.14"))
  check_version("580.95.05")     # any 580.x passes


def test_failing_rm_call_names_call_class_and_status():
  k = FakeKernel(fail={rm.NV01_DEVICE_0: rm.STATUS["NV_ERR_INVALID_CLASS"]})
  with pytest.raises(RMError, match=r"NV_ESC_RM_ALLOC of NV01_DEVICE_0 \(0x80\).*NV_ERR_INVALID_CLASS \(0x22\)") as e:
    NVDriver(kernel=k)
  assert e.value.status == 0x22


def test_real_kernel_interface_errors_name_the_call():
  from baregrad.drivers.kernel import KernelInterface, KernelCallError
  k = KernelInterface()
  with pytest.raises(KernelCallError, match=r"open\('/nonexistent/nvidiactl'\) failed: errno 2 \(ENOENT"):
    k.open("/nonexistent/nvidiactl")
  with pytest.raises(KernelCallError, match=r"ioctl NV_ESC_RM_ALLOC on fd -1 .*EBADF") as e:
    k.ioctl(-1, rm.escape_request(rm.NV_ESC_RM_ALLOC), ffi.new("NVOS21_PARAMETERS *"), name="NV_ESC_RM_ALLOC")
  assert e.value.errno == errno.EBADF


def test_logging_hook_sees_calls():
  from baregrad.drivers import kernel
  seen = []
  old = kernel._logger
  kernel.set_logger(lambda call, **d: seen.append((call, d.get("name"))))
  try:
    with pytest.raises(OSError): kernel.KernelInterface().ioctl(-1, 0, ffi.new("int *"), name="X")
  finally:
    kernel.set_logger(old)
  assert seen == [("ioctl", "X")]


def test_uvm_mm_initialize_nothing_to_do_is_not_an_error():
  """UVM answers UVM_MM_INITIALIZE with NV_WARN_NOTHING_TO_DO (0x00010006, nvstatuscodes.h) where va_space_mm is
  disabled (uvm.c); the driver must go on. (0x10001, the value used before, is NV_WARN_HOT_SWITCH.)"""
  from baregrad.drivers.emu.nv_kernel import EmulatedNVKernel
  from baregrad.drivers.nv.driver import NVDriver
  assert rm.STATUS["NV_WARN_NOTHING_TO_DO"] == 0x00010006
  d = NVDriver(kernel=EmulatedNVKernel(va_space_mm=False))
  d.close()
