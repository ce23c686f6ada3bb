"""OS-descriptor memory (NV01_MEMORY_SYSTEM_OS_DESCRIPTOR, class 0x71): host pages the process already has, described
to RM and mapped for the GPU by UVM. The facts RM and UVM check on that path, from NVIDIA's open-gpu-kernel-modules
at tag 580.142 (the header or source of each is named beside it); shared by the driver and the emulated RM/UVM.

How a user-space client describes its pages to RM (src/nvidia/arch/nvalloc/unix/src/escape.c, 580.142): the NVOS02
escape NV_ESC_RM_ALLOC_MEMORY on a /dev/nvidiaN fd with hClass 0x71 and the address in pMemory (RmAllocOsDescriptor
checks the flags, RmCreateOsDescriptor pins the pages with os_lock_user_pages and hands RM a page array), or the
NVOS32 escape NV_ESC_RM_VID_HEAP_CONTROL with NVOS32_FUNCTION_ALLOC_OS_DESCRIPTOR (the same RmCreateOsDescriptor).
NV_ESC_RM_ALLOC of class 0x71 takes NV_OS_DESC_MEMORY_ALLOCATION_PARAMS but never pins: a VIRTUAL_ADDRESS descriptor
there is NV_ERR_NOT_SUPPORTED (osCreateMemFromOsDescriptor, arch/nvalloc/unix/src/osmemdesc.c).
"""
from __future__ import annotations
import cffi

ffi = cffi.FFI()
ffi.cdef("""
/* src/common/sdk/nvidia/inc/nvos.h (NvP64 descriptor and NvU64 limit are NV_ALIGN_BYTES(8)) */
typedef struct {
  uint32_t type, flags, attr, attr2; uint64_t descriptor, limit; uint32_t descriptorType, tag;
} NV_OS_DESC_MEMORY_ALLOCATION_PARAMS;
""")

# NVOS02_PARAMETERS.flags fields, name -> (high bit, low bit) (nvos.h NVOS02_FLAGS_*)
NVOS02_FIELDS = {"PHYSICALITY": (7, 4), "LOCATION": (11, 8), "COHERENCY": (15, 12), "ALLOC": (17, 16),
                 "GPU_CACHEABLE": (18, 18), "KERNEL_MAPPING": (19, 19), "ALLOC_NISO_DISPLAY": (20, 20),
                 "ALLOC_USER_READ_ONLY": (21, 21), "ALLOC_DEVICE_READ_ONLY": (22, 22), "PEER_MAP_OVERRIDE": (23, 23),
                 "ALLOC_TYPE_SYNCPOINT": (24, 24), "MEMORY_PROTECTION": (26, 25), "REGISTER_MEMDESC_TO_PHYS_RM": (27, 27),
                 "MAPPING": (31, 30)}
PHYSICALITY_CONTIGUOUS, PHYSICALITY_NONCONTIGUOUS = 0, 1                 # NVOS02_FLAGS_PHYSICALITY_*
LOCATION_PCI, LOCATION_VIDMEM = 0, 2                                     # NVOS02_FLAGS_LOCATION_*
COHERENCY_UNCACHED, COHERENCY_CACHED, COHERENCY_WRITE_COMBINE = 0, 1, 2  # NVOS02_FLAGS_COHERENCY_*
COHERENCY_WRITE_THROUGH, COHERENCY_WRITE_PROTECT, COHERENCY_WRITE_BACK = 3, 4, 5
MAPPING_DEFAULT, MAPPING_NO_MAP, MAPPING_NEVER_MAP = 0, 1, 2             # NVOS02_FLAGS_MAPPING_*

# NV_OS_DESC_MEMORY_ALLOCATION_PARAMS.descriptorType (nvos.h NVOS32_DESCRIPTOR_TYPE_*)
DESCRIPTOR_TYPES = {0: "VIRTUAL_ADDRESS", 1: "OS_PAGE_ARRAY", 2: "OS_IO_MEMORY", 3: "OS_PHYS_ADDR", 4: "OS_FILE_HANDLE",
                    5: "OS_DMA_BUF_PTR", 6: "OS_SGT_PTR", 7: "KERNEL_VIRTUAL_ADDRESS"}
DESCRIPTOR_TYPE_VIRTUAL_ADDRESS = 0

# UvmGpuMappingAttributes: the values uvm_map_external_allocation accepts (kernel-open/common/inc/nv_uvm_user_types.h
# enums; uvm_api_mapping_type_invalid / _caching_type_invalid / _kind_type_invalid in uvm_map_external.c); 0 is each
# one's Default. Element bits 3 (24-bit) is not a value (CUDA has no 24-bit width).
UVM_MAPPING_TYPES = (0, 1, 2, 3)              # Default, ReadWriteAtomic, ReadWrite, ReadOnly
UVM_CACHING_TYPES = (0, 1, 2)                 # Default, ForceUncached, ForceCached
UVM_FORMAT_TYPES = (0, 1)                     # Default, BlockLinear
UVM_ELEMENT_BITS = (0, 1, 2, 4, 5, 6)         # Default, 8, 16, 32, 64, 128
UVM_COMPRESSION_TYPE_COUNT = 2                # Default, EnabledNoPlc
UVM_MAX_GPUS = 32 * 8                         # uvm_types.h: NV_MAX_DEVICES * UVM_PARENT_ID_MAX_SUB_PROCESSORS


def word_field(word: int, fields: dict, name: str) -> int:
  """The value of field `name` ((hi, lo) bits in `fields`) of an RM flags/attribute word."""
  hi, lo = fields[name]
  return (word >> lo) & ((1 << (hi - lo + 1)) - 1)


def pack_word(fields: dict, prefix: str, values: dict) -> int:
  """An RM flags/attribute word from field values; a value its field cannot hold is a ValueError naming it."""
  word = 0
  for name, value in values.items():
    hi, lo = fields[name]
    if not 0 <= value < 1 << (hi - lo + 1): raise ValueError(f"{prefix}_{name} ({hi}:{lo}) cannot hold {value}")
    word |= value << lo
  return word


def field(flags: int, name: str) -> int:
  """The value of NVOS02 flags field `name`."""
  return word_field(flags, NVOS02_FIELDS, name)


def flags(**fields: int) -> int:
  """NVOS02 flags from field values: flags(PHYSICALITY=PHYSICALITY_NONCONTIGUOUS, ...)."""
  return pack_word(NVOS02_FIELDS, "NVOS02_FLAGS", fields)


# what baregrad asks for: anonymous host pages are write-back cacheable and not physically contiguous, the only flags
# RM takes for pinned user pages (osCreateOsDescriptorFromPageArray, osmemdesc.c); NO_MAP is required by
# RmAllocOsDescriptor (escape.c)
HOST_PAGES = flags(PHYSICALITY=PHYSICALITY_NONCONTIGUOUS, LOCATION=LOCATION_PCI, COHERENCY=COHERENCY_CACHED,
                   MAPPING=MAPPING_NO_MAP)


def rm_check_flags(os02_flags: int) -> str | None:
  """The status RmAllocOsDescriptor and osCreateOsDescriptorFromPageArray return for these NVOS02 flags (None: accepted)
  when the pages are ordinary user memory (pinned into a page array)."""
  if field(os02_flags, "LOCATION") != LOCATION_PCI or field(os02_flags, "MAPPING") != MAPPING_NO_MAP:
    return "NV_ERR_INVALID_FLAGS"                       # RmAllocOsDescriptor
  if field(os02_flags, "COHERENCY") not in (COHERENCY_CACHED, COHERENCY_WRITE_BACK, COHERENCY_UNCACHED):
    return "NV_ERR_INVALID_FLAGS"                       # RmAllocOsDescriptor: no OS32 coherency for it
  return None


def page_array_check_flags(os02_flags: int) -> str | None:
  """osCreateOsDescriptorFromPageArray (osmemdesc.c): pinned anonymous memory is write-back cacheable and RM cannot
  make it contiguous."""
  if field(os02_flags, "COHERENCY") not in (COHERENCY_CACHED, COHERENCY_WRITE_BACK) or \
     field(os02_flags, "PHYSICALITY") == PHYSICALITY_CONTIGUOUS:
    return "NV_ERR_INVALID_FLAGS"
  return None
