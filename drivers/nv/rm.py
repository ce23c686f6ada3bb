"""NVIDIA kernel driver (RM + UVM) interface facts: ioctl numbers, parameter structs, classes, status codes.

Only what baregrad uses, written by hand from NVIDIA's open-gpu-kernel-modules at tag 580.142 (the 580 driver
series); the header each item comes from is named next to it. The RM structs change between driver series, so
`SUPPORTED_SERIES` lists the series these layouts were checked for (the driver refuses others).
"""
from __future__ import annotations
import cffi

SUPPORTED_SERIES = ("580",)
HEADERS_VERSION = "580.142"

ffi = cffi.FFI()
ffi.cdef("""
/* src/nvidia/arch/nvalloc/unix/include/nv-ioctl.h */
typedef struct { uint32_t domain; uint8_t bus, slot, function; uint16_t vendor_id, device_id; } nv_pci_info_t;
typedef struct {
  uint8_t valid; nv_pci_info_t pci_info; uint32_t gpu_id; uint16_t interrupt_line;
  uint64_t reg_address, reg_size, fb_address, fb_size; uint32_t minor_number; uint8_t dev_name[10];
} nv_ioctl_card_info_t;
typedef struct { uint32_t cmd, reply; char versionString[64]; } nv_ioctl_rm_api_version_t;
typedef struct { int ctl_fd; } nv_ioctl_register_fd_t;

/* src/common/sdk/nvidia/inc/nvos.h */
typedef struct { uint32_t hRoot, hObjectParent, hObjectOld, status; } NVOS00_PARAMETERS;
typedef struct { uint32_t hRoot, hObjectParent, hObjectNew, hClass, flags; uint64_t pMemory, limit; uint32_t status; } NVOS02_PARAMETERS;
typedef struct { uint32_t hRoot, hObjectParent, hObjectNew, hClass; uint64_t pAllocParms; uint32_t paramsSize, status; } NVOS21_PARAMETERS;
typedef struct { uint32_t hClient, hDevice, hMemory; uint64_t offset, length, pLinearAddress; uint32_t status, flags; } NVOS33_PARAMETERS;
typedef struct {
  uint32_t hClient, hDevice, hDma, hMemory; uint64_t offset, length; uint32_t flags, flags2, kindOverride;
  uint64_t dmaOffset; uint32_t status;
} NVOS46_PARAMETERS;
typedef struct { uint32_t hClient, hObject, cmd, flags; uint64_t params; uint32_t paramsSize, status; } NVOS54_PARAMETERS;
typedef struct { uint32_t hObjectError, hObjectEccError, hVASpace, engineType; uint8_t bIsCallingContextVgpuPlugin; } NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS;
typedef struct { uint32_t index, flags; uint64_t vaSize, vaStartInternal, vaLimitInternal; uint32_t bigPageSize; uint64_t vaBase; uint32_t pasid; } NV_VASPACE_ALLOCATION_PARAMETERS;
typedef struct { uint32_t hVASpace, flags, subctxId; } NV_CTXSHARE_ALLOCATION_PARAMETERS;
typedef struct {
  uint32_t owner, type, flags, width, height; int32_t pitch; uint32_t attr, attr2, format, comprCovg, zcullCovg;
  uint64_t rangeLo, rangeHi, size, alignment, offset, limit, address;
  uint32_t ctagOffset, hVASpace, internalflags, tag; int32_t numaNode;
} NV_MEMORY_ALLOCATION_PARAMS;   /* NvP64 address and the NvU64s are NV_ALIGN_BYTES(8) */

/* src/nvidia/arch/nvalloc/unix/include/nv-unix-nvos-params-wrappers.h */
typedef struct { NVOS02_PARAMETERS params; int fd; } nv_ioctl_nvos02_parameters_with_fd;
typedef struct { NVOS33_PARAMETERS params; int fd; } nv_ioctl_nvos33_parameters_with_fd;

/* src/common/sdk/nvidia/inc/class/cl0000.h, cl0080.h, cl2080.h */
typedef struct { uint32_t hClient, processID; char processName[100]; uint64_t pOsPidInfo; } NV0000_ALLOC_PARAMETERS;   /* NV_PROC_NAME_MAX_LENGTH 100 */
typedef struct {
  uint32_t deviceId, hClientShare, hTargetClient, hTargetDevice, flags; uint64_t vaSpaceSize, vaStartInternal, vaLimitInternal;
  uint32_t vaMode;
} NV0080_ALLOC_PARAMETERS;
typedef struct { uint32_t subDeviceId; } NV2080_ALLOC_PARAMETERS;

/* src/common/sdk/nvidia/inc/alloc/alloc_channel.h */
typedef struct { uint64_t base, size; uint32_t addressSpace, cacheAttrib; } NV_MEMORY_DESC_PARAMS;
typedef struct {
  uint32_t hObjectError, hObjectBuffer; uint64_t gpFifoOffset; uint32_t gpFifoEntries, flags, hContextShare, hVASpace;
  uint32_t hUserdMemory[8]; uint64_t userdOffset[8]; uint32_t engineType, cid, subDeviceId, hObjectEccError;
  NV_MEMORY_DESC_PARAMS instanceMem, userdMem, ramfcMem, mthdbufMem;
  uint32_t hPhysChannelGroup, internalFlags; NV_MEMORY_DESC_PARAMS errorNotifierMem, eccErrorNotifierMem;
  uint32_t ProcessID, SubProcessID, encryptIv[3], decryptIv[3], hmacNonce[8], tpcConfigID;
} NV_CHANNEL_ALLOC_PARAMS;

/* ctrl/ctrl0080/ctrl0080gpu.h, ctrl/ctrl2080/ctrl2080gpu.h, ctrl/ctrl2080/ctrl2080fb.h (NV2080_CTRL_FB_INFO_MAX_LIST_SIZE
   0x80), ctrl/ctrlc36f.h, ctrl/ctrla06f/ctrla06fgpfifo.h */
typedef struct { uint32_t numClasses; uint32_t classList[200]; } NV0080_CTRL_GPU_GET_CLASSLIST_V2_PARAMS;
typedef struct { uint32_t index, flags, length; uint8_t data[256]; } NV2080_CTRL_GPU_GET_GID_INFO_PARAMS;
typedef struct { uint32_t index, data; } NV2080_CTRL_FB_INFO;     /* NVXXXX_CTRL_XXX_INFO, ctrl/ctrlxxxx.h */
typedef struct { uint32_t fbInfoListSize; NV2080_CTRL_FB_INFO fbInfoList[128]; } NV2080_CTRL_FB_GET_INFO_V2_PARAMS;
typedef struct { uint32_t hChannel; uint64_t totalBufferSize; } NV2080_CTRL_GR_GET_CTX_BUFFER_SIZE_PARAMS;
typedef struct { uint32_t workSubmitToken; } NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN_PARAMS;
typedef struct { uint8_t bEnable, bSkipSubmit, bSkipEnable; } NVA06C_CTRL_GPFIFO_SCHEDULE_PARAMS;

/* kernel-open/nvidia-uvm/uvm_linux_ioctl.h, uvm_ioctl.h, uvm_types.h (NvProcessorUuid = 16 bytes) */
typedef struct { uint64_t flags; uint32_t rmStatus; } UVM_INITIALIZE_PARAMS;
typedef struct { int32_t uvmFd; uint32_t rmStatus; } UVM_MM_INITIALIZE_PARAMS;
typedef struct { uint8_t gpu_uuid[16]; uint8_t numaEnabled; int32_t numaNodeId, rmCtrlFd; uint32_t hClient, hSmcPartRef, rmStatus; } UVM_REGISTER_GPU_PARAMS;
typedef struct { uint8_t gpuUuid[16]; int32_t rmCtrlFd; uint32_t hClient, hVaSpace, rmStatus; } UVM_REGISTER_GPU_VASPACE_PARAMS;
typedef struct { uint64_t base, length; uint32_t rmStatus; } UVM_CREATE_EXTERNAL_RANGE_PARAMS;
typedef struct { uint8_t gpuUuid[16]; uint32_t gpuMappingType, gpuCachingType, gpuFormatType, gpuElementBits, gpuCompressionType; } UvmGpuMappingAttributes;
typedef struct {
  uint64_t base, length, offset; UvmGpuMappingAttributes perGpuAttributes[256]; uint64_t gpuAttributesCount;
  int32_t rmCtrlFd; uint32_t hClient, hMemory, rmStatus;
} UVM_MAP_EXTERNAL_ALLOCATION_PARAMS;
typedef struct { uint64_t base, length; uint32_t rmStatus; } UVM_FREE_PARAMS;
typedef struct {
  uint8_t gpuUuid[16]; int32_t rmCtrlFd; uint32_t hClient, hChannel; uint64_t base, length; uint32_t rmStatus;
} UVM_REGISTER_CHANNEL_PARAMS;
typedef struct { uint8_t gpuUuid[16]; uint32_t hClient, hChannel, rmStatus; } UVM_UNREGISTER_CHANNEL_PARAMS;
""")

# ---- ioctl numbers ----
NV_IOCTL_MAGIC = "F"                     # nv-ioctl-numbers.h
NV_IOCTL_BASE = 200
NV_ESC_CARD_INFO = NV_IOCTL_BASE + 0
NV_ESC_REGISTER_FD = NV_IOCTL_BASE + 1
NV_ESC_CHECK_VERSION_STR = NV_IOCTL_BASE + 10
NV_ESC_RM_ALLOC_MEMORY = 0x27            # nv_escape.h
NV_ESC_RM_FREE = 0x29
NV_ESC_RM_CONTROL = 0x2A
NV_ESC_RM_ALLOC = 0x2B
NV_ESC_RM_MAP_MEMORY = 0x4E
NV_ESC_RM_UNMAP_MEMORY = 0x4F
NV_ESC_RM_MAP_MEMORY_DMA = 0x57

# escape -> (name, parameter struct); the request is _IOWR('F', nr, sizeof(struct)) (kernel-open/common/inc/nv.h)
ESCAPES = {
  NV_ESC_CARD_INFO: ("NV_ESC_CARD_INFO", "nv_ioctl_card_info_t[32]"),
  NV_ESC_REGISTER_FD: ("NV_ESC_REGISTER_FD", "nv_ioctl_register_fd_t"),
  NV_ESC_CHECK_VERSION_STR: ("NV_ESC_CHECK_VERSION_STR", "nv_ioctl_rm_api_version_t"),
  NV_ESC_RM_ALLOC_MEMORY: ("NV_ESC_RM_ALLOC_MEMORY", "nv_ioctl_nvos02_parameters_with_fd"),
  NV_ESC_RM_FREE: ("NV_ESC_RM_FREE", "NVOS00_PARAMETERS"),
  NV_ESC_RM_CONTROL: ("NV_ESC_RM_CONTROL", "NVOS54_PARAMETERS"),
  NV_ESC_RM_ALLOC: ("NV_ESC_RM_ALLOC", "NVOS21_PARAMETERS"),
  NV_ESC_RM_MAP_MEMORY: ("NV_ESC_RM_MAP_MEMORY", "nv_ioctl_nvos33_parameters_with_fd"),
  NV_ESC_RM_MAP_MEMORY_DMA: ("NV_ESC_RM_MAP_MEMORY_DMA", "NVOS46_PARAMETERS"),
}
NV_MAX_DEVICES = 32                      # nvlimits.h
NV_RM_API_VERSION_CMD_STRICT, NV_RM_API_VERSION_CMD_RELAXED, NV_RM_API_VERSION_CMD_QUERY = 0, ord("1"), ord("2")
NV_RM_API_VERSION_REPLY_RECOGNIZED = 1

# UVM ioctls are plain numbers, not _IOC encoded (uvm_linux_ioctl.h, uvm_ioctl.h with UVM_IOCTL_BASE(i) = i)
UVM_INITIALIZE = 0x30000001
UVM_REGISTER_GPU_VASPACE = 25
UVM_REGISTER_CHANNEL = 27
UVM_UNREGISTER_CHANNEL = 28
UVM_MAP_EXTERNAL_ALLOCATION = 33
UVM_FREE = 34
UVM_REGISTER_GPU = 37
UVM_CREATE_EXTERNAL_RANGE = 73
UVM_MM_INITIALIZE = 75
UVM_IOCTLS = {
  UVM_INITIALIZE: ("UVM_INITIALIZE", "UVM_INITIALIZE_PARAMS"),
  UVM_REGISTER_GPU_VASPACE: ("UVM_REGISTER_GPU_VASPACE", "UVM_REGISTER_GPU_VASPACE_PARAMS"),
  UVM_REGISTER_CHANNEL: ("UVM_REGISTER_CHANNEL", "UVM_REGISTER_CHANNEL_PARAMS"),
  UVM_UNREGISTER_CHANNEL: ("UVM_UNREGISTER_CHANNEL", "UVM_UNREGISTER_CHANNEL_PARAMS"),
  UVM_MAP_EXTERNAL_ALLOCATION: ("UVM_MAP_EXTERNAL_ALLOCATION", "UVM_MAP_EXTERNAL_ALLOCATION_PARAMS"),
  UVM_FREE: ("UVM_FREE", "UVM_FREE_PARAMS"),
  UVM_REGISTER_GPU: ("UVM_REGISTER_GPU", "UVM_REGISTER_GPU_PARAMS"),
  UVM_CREATE_EXTERNAL_RANGE: ("UVM_CREATE_EXTERNAL_RANGE", "UVM_CREATE_EXTERNAL_RANGE_PARAMS"),
  UVM_MM_INITIALIZE: ("UVM_MM_INITIALIZE", "UVM_MM_INITIALIZE_PARAMS"),
}


def escape_request(nr: int) -> int:
  """_IOWR('F', nr, sizeof(params)) for an RM escape (Linux <asm-generic/ioctl.h> layout)."""
  size = ffi.sizeof(ESCAPES[nr][1])
  return (3 << 30) | (size << 16) | (ord(NV_IOCTL_MAGIC) << 8) | nr


# ---- classes (src/common/sdk/nvidia/inc/class/*.h) ----
NV01_ROOT_CLIENT = 0x41                  # nvos.h
NV01_DEVICE_0 = 0x80                     # cl0080.h
NV20_SUBDEVICE_0 = 0x2080                # cl2080.h
NV01_MEMORY_LOCAL_USER = 0x40           # cl0040.h: video memory (RM's VideoMemory, mem_mgr/video_mem.c)
NV01_MEMORY_SYSTEM_OS_DESCRIPTOR = 0x71  # cl0071.h
FERMI_VASPACE_A = 0x90F1                 # cl90f1.h
FERMI_CONTEXT_SHARE_A = 0x9067           # cl9067.h
KEPLER_CHANNEL_GROUP_A = 0xA06C          # cla06c.h
AMPERE_USERMODE_A, HOPPER_USERMODE_A = 0xC561, 0xC661          # clc561.h, clc661.h
AMPERE_CHANNEL_GPFIFO_A, HOPPER_CHANNEL_GPFIFO_A = 0xC56F, 0xC86F  # clc56f.h, clc86f.h
AMPERE_COMPUTE_A, AMPERE_COMPUTE_B, ADA_COMPUTE_A, HOPPER_COMPUTE_A = 0xC6C0, 0xC7C0, 0xC9C0, 0xCBC0
AMPERE_DMA_COPY_A, AMPERE_DMA_COPY_B, HOPPER_DMA_COPY_A = 0xC6B5, 0xC7B5, 0xC8B5   # clc6b5.h, clc7b5.h, clc8b5.h

# compute class -> (sm arch, QMD version); newest first. The driver takes the newest class of each kind that the GPU
# lists (NV0080_CTRL_CMD_GPU_GET_CLASSLIST_V2; the lists are src/nvidia/generated/g_gpu_class_list.c: GA100 lists
# AMPERE_COMPUTE_A / AMPERE_DMA_COPY_A, GA102 AMPERE_COMPUTE_B / AMPERE_DMA_COPY_B, AD102 ADA_COMPUTE_A /
# AMPERE_DMA_COPY_B, GH100 HOPPER_COMPUTE_A / HOPPER_DMA_COPY_A and, besides the Hopper ones, the Ampere channel and
# usermode classes)
COMPUTE_CLASSES = {
  HOPPER_COMPUTE_A: ("sm_90", (4, 0)),
  ADA_COMPUTE_A: ("sm_89", (3, 0)),
  AMPERE_COMPUTE_B: ("sm_86", (3, 0)),
  AMPERE_COMPUTE_A: ("sm_80", (3, 0)),
}
COPY_CLASSES = (HOPPER_DMA_COPY_A, AMPERE_DMA_COPY_B, AMPERE_DMA_COPY_A)
CHANNEL_CLASSES = (HOPPER_CHANNEL_GPFIFO_A, AMPERE_CHANNEL_GPFIFO_A)
USERMODE_CLASSES = (HOPPER_USERMODE_A, AMPERE_USERMODE_A)

# ---- flags and controls ----
NVOS02_FLAGS_PHYSICALITY_NONCONTIGUOUS = 1 << 4    # nvos.h NVOS02_FLAGS_PHYSICALITY 7:4
NVOS02_FLAGS_COHERENCY_CACHED = 1 << 12            # NVOS02_FLAGS_COHERENCY 15:12
NVOS02_FLAGS_MAPPING_NO_MAP = 1 << 30              # NVOS02_FLAGS_MAPPING 31:30
NV_VASPACE_ALLOCATION_FLAGS_IS_EXTERNALLY_OWNED = 1 << 3
NV_VASPACE_ALLOCATION_FLAGS_ENABLE_PAGE_FAULTING = 1 << 6
NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT_ASYNC = 1
NV2080_ENGINE_TYPE_NULL, NV2080_ENGINE_TYPE_GRAPHICS, NV2080_ENGINE_TYPE_COPY0 = 0x0, 0x1, 0x9   # cl2080_notification.h
NV0080_CTRL_CMD_GPU_GET_CLASSLIST_V2 = 0x800292    # ctrl0080gpu.h
NV2080_CTRL_CMD_GPU_GET_GID_INFO = 0x2080014A      # ctrl2080gpu.h
NV2080_GPU_CMD_GPU_GET_GID_FLAGS_FORMAT_BINARY = 2
NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN = 0xC36F0108   # ctrlc36f.h
NVA06C_CTRL_CMD_GPFIFO_SCHEDULE = 0xA06C0101       # ctrla06c.h
NV2080_CTRL_CMD_FB_GET_INFO_V2 = 0x20801303        # ctrl2080fb.h (the indices: drivers/nv/vidmem.py)
NV2080_CTRL_CMD_GR_GET_CTX_BUFFER_SIZE = 0x20801218   # ctrl2080gr.h: {NvHandle hChannel; NvU64 totalBufferSize (8-aligned)}
CONTROLS = {
  NV0080_CTRL_CMD_GPU_GET_CLASSLIST_V2: ("NV0080_CTRL_CMD_GPU_GET_CLASSLIST_V2", "NV0080_CTRL_GPU_GET_CLASSLIST_V2_PARAMS"),
  NV2080_CTRL_CMD_GPU_GET_GID_INFO: ("NV2080_CTRL_CMD_GPU_GET_GID_INFO", "NV2080_CTRL_GPU_GET_GID_INFO_PARAMS"),
  NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN: ("NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN",
                                                 "NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN_PARAMS"),
  NVA06C_CTRL_CMD_GPFIFO_SCHEDULE: ("NVA06C_CTRL_CMD_GPFIFO_SCHEDULE", "NVA06C_CTRL_GPFIFO_SCHEDULE_PARAMS"),
  NV2080_CTRL_CMD_FB_GET_INFO_V2: ("NV2080_CTRL_CMD_FB_GET_INFO_V2", "NV2080_CTRL_FB_GET_INFO_V2_PARAMS"),
  NV2080_CTRL_CMD_GR_GET_CTX_BUFFER_SIZE: ("NV2080_CTRL_CMD_GR_GET_CTX_BUFFER_SIZE", "NV2080_CTRL_GR_GET_CTX_BUFFER_SIZE_PARAMS"),
}
# class -> its allocation parameter struct (None: no parameters)
ALLOC_PARAMS = {
  NV01_ROOT_CLIENT: "NV0000_ALLOC_PARAMETERS", NV01_DEVICE_0: "NV0080_ALLOC_PARAMETERS",
  NV20_SUBDEVICE_0: "NV2080_ALLOC_PARAMETERS", FERMI_VASPACE_A: "NV_VASPACE_ALLOCATION_PARAMETERS",
  KEPLER_CHANNEL_GROUP_A: "NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS", FERMI_CONTEXT_SHARE_A: "NV_CTXSHARE_ALLOCATION_PARAMETERS",
  HOPPER_CHANNEL_GPFIFO_A: "NV_CHANNEL_ALLOC_PARAMS", AMPERE_CHANNEL_GPFIFO_A: "NV_CHANNEL_ALLOC_PARAMS",
  NV01_MEMORY_LOCAL_USER: "NV_MEMORY_ALLOCATION_PARAMS",
}
CLASS_NAMES = {v: k for k, v in dict(globals()).items() if isinstance(v, int) and k.isupper() and
               any(k.startswith(p) for p in ("NV01_", "NV20_", "FERMI_", "KEPLER_", "AMPERE_", "HOPPER_", "ADA_"))}

# NV status codes (src/common/sdk/nvidia/inc/nvstatuscodes.h)
NV_OK = 0x0
NV_STATUS = {
  0x00: "NV_OK", 0x16: "NV_ERR_ILLEGAL_ACTION", 0x17: "NV_ERR_IN_USE", 0x19: "NV_ERR_INSERT_DUPLICATE_NAME",
  0x1A: "NV_ERR_INSUFFICIENT_RESOURCES", 0x1B: "NV_ERR_INSUFFICIENT_PERMISSIONS", 0x1E: "NV_ERR_INVALID_ADDRESS",
  0x1F: "NV_ERR_INVALID_ARGUMENT", 0x20: "NV_ERR_INVALID_BASE",
  0x21: "NV_ERR_INVALID_CHANNEL", 0x22: "NV_ERR_INVALID_CLASS", 0x23: "NV_ERR_INVALID_CLIENT", 0x24: "NV_ERR_INVALID_COMMAND",
  0x26: "NV_ERR_INVALID_DEVICE", 0x29: "NV_ERR_INVALID_FLAGS", 0x2E: "NV_ERR_INVALID_LIMIT",
  0x33: "NV_ERR_INVALID_OBJECT_HANDLE", 0x34: "NV_ERR_INVALID_OBJECT_NEW", 0x36: "NV_ERR_INVALID_OBJECT_PARENT",
  0x37: "NV_ERR_INVALID_OFFSET", 0x39: "NV_ERR_INVALID_OWNER", 0x3A: "NV_ERR_INVALID_PARAM_STRUCT", 0x40: "NV_ERR_INVALID_STATE",
  0x51: "NV_ERR_NO_MEMORY", 0x56: "NV_ERR_NOT_SUPPORTED", 0x57: "NV_ERR_OBJECT_NOT_FOUND",
  0x59: "NV_ERR_OPERATING_SYSTEM", 0x5B: "NV_ERR_OUT_OF_RANGE", 0x68: "NV_ERR_UVM_ADDRESS_IN_USE", 0xFFFF: "NV_ERR_GENERIC",
  0x10006: "NV_WARN_NOTHING_TO_DO",
}
STATUS = {name: code for code, name in NV_STATUS.items()}


# robust-channel error codes, written to a faulted channel's error notifier (NvNotification.info32) and printed by the
# kernel driver as "Xid N" (src/common/sdk/nvidia/inc/nverror.h; meanings from NVIDIA's Xid catalog)
RC_ERRORS = {
  13: "ROBUST_CHANNEL_GR_EXCEPTION: graphics engine exception",
  31: "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT: GPU memory page fault",
  32: "ROBUST_CHANNEL_PBDMA_ERROR: invalid or corrupted push buffer stream",
}
ROBUST_CHANNEL_GR_EXCEPTION, ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT, ROBUST_CHANNEL_PBDMA_ERROR = 13, 31, 32
NOTIFICATION_STATUS_ERROR = 0xFFFF     # NvNotification.status of an error notifier that RM wrote


def status_name(code: int) -> str: return f"{NV_STATUS.get(code, 'unknown status')} ({code:#x})"


def class_name(cls: int) -> str: return f"{CLASS_NAMES.get(cls, 'class')} ({cls:#x})"
