"""Video memory (NV01_MEMORY_LOCAL_USER, class 0x40): the GPU's own memory (HBM3e on an H200), allocated through RM,
mapped for the GPU by UVM and for the CPU through BAR1. The facts RM checks on that path, from NVIDIA's
open-gpu-kernel-modules at tag 580.142 (the file of each is named beside it); shared by the driver and the emulated RM.

How a user-space client allocates it: NV_ESC_RM_ALLOC of class 0x40 under the device with NV_MEMORY_ALLOCATION_PARAMS
(src/nvidia/src/kernel/rmapi/resource_list.h: parents Device or Subdevice, the parameters RS_REQUIRED; the struct is
in drivers/nv/rm.py). vidmemConstruct (src/nvidia/src/kernel/mem_mgr/video_mem.c) validates them
(stdmemValidateParams, mem_mgr/standard_mem.c), requires LOCATION VIDMEM and no VIRTUAL flag, picks the page size
(memmgrDeterminePageSize, gpu/mem_mgr/mem_mgr.c) and the alignment (memmgrAllocDetermineAlignment_GM107,
gpu/mem_mgr/arch/maxwell/mem_mgr_gm107.c), and takes the pages from PMA (_vidmemPmaAllocate): NV_ERR_NO_MEMORY when
they are not there. GPU_CACHEABLE YES makes the GPU's PTEs cached (memSetSysmemCacheAttrib's counterpart for vidmem:
mem_mgr/mem.c maps attr2 GPU_CACHEABLE to the memdesc's GPU cache attribute).

The CPU maps it through BAR1: NV_ESC_RM_MAP_MEMORY (NVOS33) with the /dev/nvidiaN fd to map through (escape.c forces
CACHING_TYPE DEFAULT; memMap maps video memory write-combined, rmapi/mapping_cpu.c; offset < size, 0 < length,
offset + length <= size, else NV_ERR_INVALID_BASE / NV_ERR_INVALID_LIMIT), then mmap of that fd at offset 0 and exactly
the mapped length (kernel-open/nvidia/nv-mmap.c nvidia_mmap_helper: vm_pgoff 0, the VMA size the context's). Host
writes through it are fine (write-combined); host reads cross PCIe uncached, one transaction each: the driver never
reads video memory that way (copyout goes through the copy engine). Freeing the object drops its CPU mappings
(clientUnmapResourceRefMappings, src/nvidia/src/libraries/resserv/src/rs_client.c).

UVM maps it into the GPU VA space like any RM allocation (UVM_CREATE_EXTERNAL_RANGE, UVM_MAP_EXTERNAL_ALLOCATION), with
PTEs of the largest page size that the allocation's page size, the VA, the length and the offset all allow
(uvm_map_external_allocation_on_gpu, kernel-open/nvidia-uvm/uvm_map_external.c): a 2 MiB-page allocation mapped at a 2
MiB-aligned VA gets 2 MiB PTEs.
"""
from __future__ import annotations
from .osdesc import pack_word, word_field

# NV_MEMORY_ALLOCATION_PARAMS.attr fields, name -> (high bit, low bit) (nvos.h NVOS32_ATTR_*)
ATTR_FIELDS = {"DEPTH": (2, 0), "COMPR_COVG": (3, 3), "AA_SAMPLES": (7, 4), "GPU_CACHE_SNOOPABLE": (9, 8),
               "ZCULL": (11, 10), "COMPR": (13, 12), "ALLOCATE_FROM_RESERVED_HEAP": (14, 14), "FORMAT": (17, 16),
               "Z_TYPE": (18, 18), "ZS_PACKING": (21, 19), "PAGE_SIZE": (24, 23), "LOCATION": (26, 25),
               "PHYSICALITY": (28, 27), "COHERENCY": (31, 29)}
# .attr2 fields (nvos.h NVOS32_ATTR2_*; PAGE_OFFLINING and BLACKLIST are the same bit)
ATTR2_FIELDS = {"ZBC": (1, 0), "GPU_CACHEABLE": (3, 2), "P2P_GPU_CACHEABLE": (5, 4), "32BIT_POINTER": (6, 6),
                "FIXED_NUMA_NODE_ID": (7, 7), "SMMU_ON_GPU": (9, 8), "USE_SCANOUT_CARVEOUT": (10, 10),
                "ALLOC_COMPCACHELINE_ALIGN": (11, 11), "PRIORITY": (13, 12), "INTERNAL": (14, 14), "PREFER_2C": (15, 15),
                "NISO_DISPLAY": (16, 16), "ZBC_SKIP_ZBCREFCOUNT": (17, 17), "ISO": (18, 18), "PAGE_OFFLINING": (19, 19),
                "PAGE_SIZE_HUGE": (21, 20), "PROTECTION_USER": (22, 22), "PROTECTION_DEVICE": (23, 23),
                "USE_EGM": (24, 24), "MEMORY_PROTECTION": (26, 25), "ALLOCATE_FROM_SUBHEAP": (27, 27),
                "ENABLE_LOCALIZED_MEMORY": (30, 29), "REGISTER_MEMDESC_TO_PHYS_RM": (31, 31)}

PAGE_SIZE_DEFAULT, PAGE_SIZE_4KB, PAGE_SIZE_BIG, PAGE_SIZE_HUGE = 0, 1, 2, 3       # NVOS32_ATTR_PAGE_SIZE_*
LOCATION_VIDMEM, LOCATION_PCI, LOCATION_ANY = 0, 1, 3                             # NVOS32_ATTR_LOCATION_*
PHYSICALITY_DEFAULT, PHYSICALITY_NONCONTIGUOUS, PHYSICALITY_CONTIGUOUS, PHYSICALITY_ALLOW_NONCONTIGUOUS = 0, 1, 2, 3
COHERENCY_UNCACHED, COHERENCY_CACHED, COHERENCY_WRITE_COMBINE = 0, 1, 2           # NVOS32_ATTR_COHERENCY_*
COMPR_NONE, FORMAT_PITCH = 0, 0                                                   # NVOS32_ATTR_COMPR_NONE, _FORMAT_PITCH
GPU_CACHEABLE_DEFAULT, GPU_CACHEABLE_YES, GPU_CACHEABLE_NO, GPU_CACHEABLE_INVALID = 0, 1, 2, 3   # NVOS32_ATTR2_GPU_CACHEABLE_*
PAGE_SIZE_HUGE_DEFAULT, PAGE_SIZE_HUGE_2MB, PAGE_SIZE_HUGE_512MB, PAGE_SIZE_HUGE_256GB = 0, 1, 2, 3
PAGE_OFFLINING_OFF = 1                                                            # NVOS32_ATTR2_PAGE_OFFLINING_OFF
MEMORY_PROTECTION_PROTECTED = 1                                                   # NVOS32_ATTR2_MEMORY_PROTECTION_*
ALLOCATE_FROM_SUBHEAP_YES = 1

TYPE_IMAGE = 0                                   # NVOS32_TYPE_IMAGE
# NV_MEMORY_ALLOCATION_PARAMS.format is the PTE kind (src/common/inc/swref/published/hopper/gh100/dev_mmu.h,
# NV_MMU_PTE_KIND_*): PITCH 0x00 is the linear layout of display surfaces; GENERIC_MEMORY 0x06 is what memory for
# compute gets on Turing and later (nouveau's nouveau_choose_pte_kind, nvkms's genericPageKind, the kernel's GSP RPCs
# for FB memory). On an H200 a float32 add streamed 1.86 TB/s in PITCH memory, against 4.4 for PyTorch's.
PTE_KIND_PITCH, PTE_KIND_GENERIC_MEMORY = 0x00, 0x06
# NV_MEMORY_ALLOCATION_PARAMS.flags (nvos.h NVOS32_ALLOC_FLAGS_*)
ALLOC_FLAGS = {"IGNORE_BANK_PLACEMENT": 0x1, "FORCE_MEM_GROWS_UP": 0x2, "FORCE_MEM_GROWS_DOWN": 0x4,
               "FORCE_ALIGN_HOST_PAGE": 0x8, "FIXED_ADDRESS_ALLOCATE": 0x10, "BANK_HINT": 0x20, "BANK_FORCE": 0x40,
               "ALIGNMENT_HINT": 0x80, "ALIGNMENT_FORCE": 0x100, "BANK_GROW_DOWN": 0x200, "LAZY": 0x400,
               "FORCE_REVERSE_ALLOC": 0x800, "NO_SCANOUT": 0x1000, "PITCH_FORCE": 0x2000, "MEMORY_HANDLE_PROVIDED": 0x4000,
               "MAP_NOT_REQUIRED": 0x8000, "PERSISTENT_VIDMEM": 0x10000, "USE_BEGIN_END": 0x20000,
               "TURBO_CIPHER_ENCRYPTED": 0x40000, "VIRTUAL": 0x80000, "FORCE_INTERNAL_INDEX": 0x100000,
               "ZCULL_COVG_SPECIFIED": 0x200000, "EXTERNALLY_MANAGED": 0x400000, "FORCE_DEDICATED_PDE": 0x800000,
               "PROTECTED": 0x1000000, "MAXIMIZE_ADDRESS_SPACE": 0x2000000, "SPARSE": 0x4000000,
               "ALLOCATE_KERNEL_PRIVILEGED": 0x8000000, "SKIP_RESOURCE_ALLOC": 0x10000000,
               "PREFER_PTES_IN_SYSMEMORY": 0x20000000, "WPR1": 0x40000000, "WPR2": 0x80000000}
F = ALLOC_FLAGS
# owners RM keeps for itself (g_heap_nvoc.h HEAP_OWNER_RM_SCRATCH_BEGIN .. _END); 0 and 0xFFFFFFFF are invalid too
HEAP_OWNER_RM_SCRATCH = (0xDEAF0000, 0xDEAF0003)

# page sizes (gpu/mem_mgr: RM_PAGE_SIZE, RM_PAGE_SIZE_64K = kgmmuGetMaxBigPageSize on Pascal and later, RM_PAGE_SIZE_HUGE,
# RM_PAGE_SIZE_512M); PMA hands out at least 64 KiB (_vidmemPmaAllocate turns a 4 KiB page size into 64 KiB)
PAGE_4K, PAGE_64K, PAGE_2M, PAGE_512M = 0x1000, 0x10000, 0x200000, 0x20000000

# NV2080_CTRL_CMD_FB_GET_INFO_V2 indices (ctrl/ctrl2080/ctrl2080fb.h NV2080_CTRL_FB_INFO_INDEX_*); sizes in KiB
FB_INFO_INDEX = {"BAR1_SIZE": 0x5, "RAM_SIZE": 0x7, "TOTAL_RAM_SIZE": 0x8, "HEAP_SIZE": 0x9, "HEAP_FREE": 0x16,
                 "BAR1_AVAIL_SIZE": 0x1D, "USABLE_RAM_SIZE": 0x20}
FB_INFO_MAX_LIST_SIZE = 0x80                     # NV2080_CTRL_FB_INFO_MAX_LIST_SIZE


def field(word: int, name: str, fields: dict) -> int:
  return word_field(word, fields, name)


def attr(**values: int) -> int:
  """An attr word from field values: attr(PAGE_SIZE=PAGE_SIZE_BIG, ...)."""
  return pack_word(ATTR_FIELDS, "NVOS32_ATTR", values)


def attr2(**values: int) -> int:
  return pack_word(ATTR2_FIELDS, "NVOS32_ATTR2", values)


# ---- what the driver asks for ----
HUGE_FROM = 16 << 20     # allocations of 16 MiB and more take 2 MiB pages (rounding wastes < 1/8), smaller ones 64 KiB


def placement(nbytes: int) -> tuple[int, int]:
  """(page size, bytes) of a video-memory allocation holding `nbytes`: whole pages of the size the driver asks RM for."""
  page = PAGE_2M if nbytes >= HUGE_FROM else PAGE_64K
  return page, (max(nbytes, 1) + page - 1) // page * page


def request(p, owner: int, nbytes: int, page: int) -> None:
  """Fill NV_MEMORY_ALLOCATION_PARAMS `p` (zeroed) for `nbytes` (a multiple of `page`) of video memory: an image
  surface of the generic memory kind (uncompressed), physically noncontiguous (PMA's pages anywhere), the CPU's BAR1 mapping write-combined,
  GPU-cached, in pages of `page` bytes aligned to their size."""
  p.owner, p.type, p.size, p.alignment, p.format = owner, TYPE_IMAGE, nbytes, page, PTE_KIND_GENERIC_MEMORY
  p.flags = F["ALIGNMENT_FORCE"] | F["MAP_NOT_REQUIRED"]
  p.attr = attr(PAGE_SIZE=PAGE_SIZE_HUGE if page == PAGE_2M else PAGE_SIZE_BIG, LOCATION=LOCATION_VIDMEM,
                PHYSICALITY=PHYSICALITY_NONCONTIGUOUS, COHERENCY=COHERENCY_WRITE_COMBINE)
  p.attr2 = attr2(GPU_CACHEABLE=GPU_CACHEABLE_YES, PAGE_SIZE_HUGE=PAGE_SIZE_HUGE_2MB if page == PAGE_2M else 0)


# ---- what RM checks (the emulated RM runs these) ----
def rm_validate(p, protected_memory: bool = False) -> str | None:
  """The status stdmemValidateParams and vidmemConstruct return for a user client's parameters (None: accepted), in
  their order. protected_memory: Confidential Compute / APM is on."""
  if p.internalflags != 0: return "NV_ERR_INVALID_ARGUMENT"      # "Make sure UMD does not impact the internal flags"
  if p.size == 0: return "NV_ERR_INVALID_ARGUMENT"
  if p.owner in (0, 0xFFFFFFFF) or HEAP_OWNER_RM_SCRATCH[0] <= p.owner <= HEAP_OWNER_RM_SCRATCH[1]:
    return "NV_ERR_INVALID_OWNER"
  if field(p.attr2, "PAGE_OFFLINING", ATTR2_FIELDS) == PAGE_OFFLINING_OFF: return "NV_ERR_INSUFFICIENT_PERMISSIONS"
  if not p.flags & F["USE_BEGIN_END"] and (p.rangeLo or p.rangeHi): return "NV_ERR_INVALID_ARGUMENT"
  location = field(p.attr, "LOCATION", ATTR_FIELDS)
  if p.flags & F["TURBO_CIPHER_ENCRYPTED"] and location == LOCATION_VIDMEM: return "NV_ERR_INVALID_ARGUMENT"
  if field(p.attr2, "ALLOCATE_FROM_SUBHEAP", ATTR2_FIELDS) == ALLOCATE_FROM_SUBHEAP_YES: return "NV_ERR_INVALID_ARGUMENT"
  # vidmemConstruct
  if location != LOCATION_VIDMEM or p.flags & F["VIRTUAL"]: return "NV_ERR_INVALID_ARGUMENT"
  if not protected_memory and field(p.attr2, "MEMORY_PROTECTION", ATTR2_FIELDS) == MEMORY_PROTECTION_PROTECTED:
    return "NV_ERR_INVALID_ARGUMENT"
  return None


def rm_page_size(p, huge_512m: bool = True) -> int:
  """memmgrDeterminePageSize for video memory of a client (0: none, which vidmemConstruct fails with
  NV_ERR_INVALID_STATE): DEFAULT picks 2 MiB for 2 MiB and more, else 64 KiB (_memmgrPickDefaultGpuPageSize with
  bClientAllocation); 4 KiB becomes PMA's 64 KiB; 256 GiB pages exist only from Blackwell (kgmmuIsPageSize256gbSupported)."""
  size_attr = field(p.attr, "PAGE_SIZE", ATTR_FIELDS)
  if size_attr == PAGE_SIZE_DEFAULT: return PAGE_2M if p.size >= PAGE_2M else PAGE_64K
  if size_attr in (PAGE_SIZE_4KB, PAGE_SIZE_BIG): return PAGE_64K
  huge = field(p.attr2, "PAGE_SIZE_HUGE", ATTR2_FIELDS)
  if huge in (PAGE_SIZE_HUGE_DEFAULT, PAGE_SIZE_HUGE_2MB): return PAGE_2M
  if huge == PAGE_SIZE_HUGE_512MB and huge_512m: return PAGE_512M
  return 0


def rm_alignment(p, page: int) -> tuple[str | None, int, int]:
  """(status, bytes, alignment) of memmgrAllocDetermineAlignment_GM107: the size rounded up to whole pages; a requested
  alignment (ALIGNMENT_HINT / _FORCE, else 4 KiB) that is a multiple or a divisor of the page size is kept if larger;
  another one fails with ALIGNMENT_FORCE (NV_ERR_INVALID_ARGUMENT) and becomes the page size otherwise."""
  align = p.alignment if p.flags & (F["ALIGNMENT_HINT"] | F["ALIGNMENT_FORCE"]) else PAGE_4K
  size = (p.size + page - 1) // page * page
  if align and ((align > page and align % page == 0) or (align <= page and page % align == 0)):
    return None, size, max(align, page)
  if align and p.flags & F["ALIGNMENT_FORCE"]: return "NV_ERR_INVALID_ARGUMENT", 0, 0
  return None, size, page
