"""EMU=1 DEV=NV: an emulated NVIDIA kernel driver (RM + UVM) with one GPU: an H200 (GH100, sm_90, HOPPER_COMPUTE_A,
PCI 0x2335, 143771 MiB of HBM3e) by default, or an A100 (GA100) or RTX 4090 (AD102): `EmulatedNVKernel(gpu="GA100")`.

Implements the kernel interface of drivers/kernel.py: `open` of /dev/nvidiactl, /dev/nvidia0, /dev/nvidia-uvm
gives fake descriptors; `ioctl` decodes the same request numbers and parameter structs the driver uses
(drivers/nv/rm.py) and checks them as RM does: the request size, the fd kind (control device / GPU device / UVM),
the client, parent handles and classes (which class may live under which), parameter sizes, duplicate handles,
UVM initialization order, VA ranges; a bad call gets the NV status code the real driver returns. Anonymous
mmaps are real host memory; an mmap of a /dev/nvidiaN fd after NV_ESC_RM_MAP_MEMORY maps the RM object (the
usermode doorbell page). Memory described by an OS descriptor and mapped with UVM_MAP_EXTERNAL_ALLOCATION becomes
GPU memory at that VA (drivers/emu/nv_gpu.py); each GPFIFO channel gets a processor thread. The OS descriptor path
checks what RM checks (RmAllocOsDescriptor's flags, an aligned address, pages os_lock_user_pages can pin -- any
readable and writable mapping of the process, so another device's memory too --, the parent, osCreateMemFromOsDescriptor's
limit and page-array flags), and UVM's external ranges and mappings what UVM checks (4K ranges, the attributes, the
GPU's reach, the object's size); drivers/nv/osdesc.py holds the facts.

Video memory (NV01_MEMORY_LOCAL_USER, drivers/nv/vidmem.py holds the facts): the GPU's memory is a sparse memfd of the
model's size (`VideoMemory`: pages exist once touched, a freed range is punched out, so it reads zeros again as RM's
scrubbed pages do). An allocation is checked as vidmemConstruct checks it (parameters, page size, alignment) and
placed first fit; more than the GPU holds is NV_ERR_NO_MEMORY. NV_ESC_RM_MAP_MEMORY of it and an mmap of the
/dev/nvidiaN fd (offset 0, the mapped length) map those memfd pages for the CPU at the address the caller asks for
(BAR1); UVM_MAP_EXTERNAL_ALLOCATION maps them into the GPU's memory as device memory (what a kernel moves there is not
system traffic: drivers/emu/counters.py). A host read through such a CPU mapping is invisible here (on the hardware a
slow uncached PCIe read): the driver never does it; every byte the copy engine moves is counted in
`copy_engine_bytes` (per channel: `NVGpu.copy_bytes`). NV2080_CTRL_CMD_FB_GET_INFO_V2 reports the sizes.

The GPU lists the classes its chip lists on RM 580.142 (CHIP_CLASSES, NV0080_CTRL_CMD_GPU_GET_CLASSLIST_V2); of those
it emulates the device, subdevice, VA space, channel group, context share, the Ampere/Hopper usermode and GPFIFO
channel classes, and the chip's compute and DMA-copy class (another listed class: NV_ERR_NOT_SUPPORTED, an unlisted
one: NV_ERR_INVALID_CLASS). Rules RM and UVM enforce that the emulator copies, each with its source beside it:
a channel group needs a GR or CE engine type and binds its channels to it (a channel's engineType is 0, inheriting
it, or the same); a compute object needs a GR channel; a channel group is scheduled only if each GR channel in an
externally owned VA space is bound through UVM_REGISTER_CHANNEL, whose VA region must be free in UVM's VA space.
"""
from __future__ import annotations
import ctypes, errno, mmap, os, threading, weakref
from dataclasses import dataclass, field
import numpy as np
from baregrad.drivers import kernel as kernel_mod
from baregrad.drivers.kernel import KernelCallError, KernelInterface
from baregrad.drivers.nv import rm, osdesc, vidmem
from baregrad.drivers.nv.rm import ffi
from .nv_gpu import NVGpu, ChannelProcessor, EmulatedProgram, GPU_MODELS, DEFAULT_GPU

DRIVER_VERSION = "580.159.04"
GPU_UUID = bytes.fromhex("475055b4e4a6d1c2a1b2c3d4e5f60718")
S = rm.STATUS
CTL, DEV, UVM = "/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-uvm"
PAGE = 0x1000

# The class list of each emulated chip: RM's class database is the generic list, the chip's no-engine list and its
# engine class descriptors (gpuGetGenericClassList, gpuGetNoEngClassList_<chip>, gpuGetEngClassDescriptorList_<chip> in
# src/nvidia/generated/g_gpu_class_list.c, assembled by src/nvidia/src/kernel/gpu/gpu.c), and
# NV0080_CTRL_CMD_GPU_GET_CLASSLIST_V2 returns each class id once (gpuGetClassList, gpu/gpu_resource_desc.c; 580.142).
# Ids from src/common/sdk/nvidia/inc/class/cl*.h.
CLASS_IDS = {
  "NV01_ROOT": 0x0000, "NV01_ROOT_NON_PRIV": 0x0001, "NV01_CONTEXT_DMA": 0x0002, "NV01_TIMER": 0x0004,
  "NV01_EVENT": 0x0005, "FABRIC_MANAGER_SESSION": 0x000f, "NV0020_GPU_MANAGEMENT": 0x0020,
  "NV01_MEMORY_SYSTEM": 0x003e, "NV01_MEMORY_LOCAL_PRIVILEGED": 0x003f, "NV01_MEMORY_LOCAL_USER": 0x0040,
  "NV01_ROOT_CLIENT": 0x0041, "NV_MEMORY_EXTENDED_USER": 0x0042, "NV_CE_UTILS": 0x0050,
  "NV0060_SYNC_GPU_BOOST": 0x0060, "NV01_MEMORY_VIRTUAL": 0x0070, "NV01_MEMORY_SYSTEM_OS_DESCRIPTOR": 0x0071,
  "NV04_DISPLAY_COMMON": 0x0073, "NV01_MEMORY_FRAMEBUFFER_CONSOLE": 0x0076, "NV01_EVENT_KERNEL_CALLBACK": 0x0078,
  "NV01_EVENT_OS_EVENT": 0x0079, "NV04_SOFTWARE_TEST": 0x007d, "NV01_EVENT_KERNEL_CALLBACK_EX": 0x007e,
  "NV01_DEVICE_0": 0x0080, "NV01_MEMORY_LIST_SYSTEM": 0x0081, "NV01_MEMORY_LIST_FBMEM": 0x0082,
  "NV01_MEMORY_LIST_OBJECT": 0x0083, "KERNEL_GRAPHICS_CONTEXT": 0x0090, "NV0092_RG_LINE_CALLBACK": 0x0092,
  "NV01_MEMORY_HW_RESOURCES": 0x00b1, "NV01_MEMORY_LOCAL_PHYSICAL": 0x00c2, "NV_SEMAPHORE_SURFACE": 0x00da,
  "NV40_DEBUG_BUFFER": 0x00db, "RM_USER_SHARED_DATA": 0x00de, "NV_MEMORY_EXPORT": 0x00e0, "NV_IMEX_SESSION": 0x00f1,
  "IO_VASPACE_A": 0x00f2, "NV01_MEMORY_FLA": 0x00f3, "NV_MEMORY_FABRIC": 0x00f8,
  "NV_MEMORY_FABRIC_IMPORT_V2": 0x00f9, "NV_MEMORY_FABRIC_IMPORTED_REF": 0x00fb, "FABRIC_VASPACE_A": 0x00fc,
  "NV_MEMORY_MULTICAST_FABRIC": 0x00fd, "NV_MEMORY_MAPPER": 0x00fe, "LOCK_STRESS_OBJECT": 0x0100,
  "LOCK_TEST_RELAXED_DUP_OBJECT": 0x0101, "NV20_SUBDEVICE_0": 0x2080, "NV2081_BINAPI": 0x2081,
  "NV2082_BINAPI_PRIVILEGED": 0x2082, "NV20_SUBDEVICE_DIAG": 0x208f, "NV30_GSYNC": 0x30f1, "NV40_I2C": 0x402c,
  "NV50_P2P": 0x503b, "NV50_THIRD_PARTY_P2P": 0x503c, "NV50_CHANNEL_GPFIFO": 0x506f,
  "NV50_DEFERRED_API_CLASS": 0x5080, "NV50_MEMORY_VIRTUAL": 0x50a0, "GT200_DEBUGGER": 0x83de,
  "G84_PERFBUFFER": 0x844c, "MPS_COMPUTE": 0x900e, "NV9010_VBLANK_CALLBACK": 0x9010, "FERMI_TWOD_A": 0x902d,
  "FERMI_CONTEXT_SHARE_A": 0x9067, "GF100_CHANNEL_GPFIFO": 0x906f, "GF100_DISP_SW": 0x9072,
  "GF100_TIMED_SEMAPHORE_SW": 0x9074, "GF100_ZBC_CLEAR": 0x9096, "GF100_PROFILER": 0x90cc, "NV_EVENT_BUFFER": 0x90cd,
  "NV01_MEMORY_DEVICELESS": 0x90ce, "GF100_SUBDEVICE_MASTER": 0x90e6, "GF100_SUBDEVICE_INFOROM": 0x90e7,
  "GF100_HDACODEC": 0x90ec, "FERMI_VASPACE_A": 0x90f1, "KEPLER_CHANNEL_GROUP_A": 0xa06c,
  "KEPLER_DEVICE_VGPU": 0xa080, "NVA081_VGPU_CONFIG": 0xa081, "NVA084_KERNEL_HOST_VGPU_DEVICE": 0xa084,
  "NVENC_SW_SESSION": 0xa0bc, "NVFBC_SW_SESSION": 0xa0bd, "KEPLER_INLINE_TO_MEMORY_B": 0xa140,
  "MAXWELL_PROFILER": 0xb0cc, "MAXWELL_PROFILER_CONTEXT": 0xb1cc, "MAXWELL_PROFILER_DEVICE": 0xb2cc,
  "NVB8B0_VIDEO_DECODER": 0xb8b0, "NVB8D1_VIDEO_NVJPG": 0xb8d1, "NVB8FA_VIDEO_OFA": 0xb8fa, "GP100_UVM_SW": 0xc076,
  "VOLTA_USERMODE_A": 0xc361, "ACCESS_COUNTER_NOTIFY_BUFFER": 0xc365, "MMU_FAULT_BUFFER": 0xc369,
  "VOLTA_CHANNEL_GPFIFO_A": 0xc36f, "NVC372_DISPLAY_SW": 0xc372, "TURING_USERMODE_A": 0xc461,
  "TURING_CHANNEL_GPFIFO_A": 0xc46f, "NVC4D1_VIDEO_NVJPG": 0xc4d1, "AMPERE_USERMODE_A": 0xc561,
  "AMPERE_CHANNEL_GPFIFO_A": 0xc56f, "UVM_CHANNEL_RETAINER": 0xc574, "AMPERE_SMC_PARTITION_REF": 0xc637,
  "AMPERE_SMC_EXEC_PARTITION_REF": 0xc638, "AMPERE_SMC_CONFIG_SESSION": 0xc639, "AMPERE_SMC_MONITOR_SESSION": 0xc640,
  "HOPPER_USERMODE_A": 0xc661, "NVC67A_CURSOR_IMM_CHANNEL_PIO": 0xc67a, "NVC67B_WINDOW_IMM_CHANNEL_DMA": 0xc67b,
  "NVC67E_WINDOW_CHANNEL_DMA": 0xc67e, "AMPERE_A": 0xc697, "NVC6B0_VIDEO_DECODER": 0xc6b0,
  "AMPERE_DMA_COPY_A": 0xc6b5, "AMPERE_COMPUTE_A": 0xc6c0, "NVC6FA_VIDEO_OFA": 0xc6fa,
  "MMU_VIDMEM_ACCESS_BIT_BUFFER": 0xc763, "NVC770_DISPLAY": 0xc770, "NVC771_DISP_SF_USER": 0xc771,
  "NVC773_DISP_CAPABILITIES": 0xc773, "NVC77D_CORE_CHANNEL_DMA": 0xc77d, "NVC77F_ANY_CHANNEL_DMA": 0xc77f,
  "AMPERE_DMA_COPY_B": 0xc7b5, "HOPPER_MMU_VIDMEM_ACCESS_BIT_BUFFER": 0xc863, "HOPPER_CHANNEL_GPFIFO_A": 0xc86f,
  "HOPPER_DMA_COPY_A": 0xc8b5, "ADA_A": 0xc997, "NVC9B0_VIDEO_DECODER": 0xc9b0, "NVC9B7_VIDEO_ENCODER": 0xc9b7,
  "ADA_COMPUTE_A": 0xc9c0, "NVC9D1_VIDEO_NVJPG": 0xc9d1, "NVC9FA_VIDEO_OFA": 0xc9fa,
  "NV_CONFIDENTIAL_COMPUTE": 0xcb33, "HOPPER_A": 0xcb97, "HOPPER_SEC2_WORK_LAUNCH_A": 0xcba2,
  "HOPPER_COMPUTE_A": 0xcbc0, "NV_COUNTER_COLLECTION_UNIT": 0xcbca,
}
GENERIC_CLASSES = (
  "LOCK_STRESS_OBJECT", "LOCK_TEST_RELAXED_DUP_OBJECT", "NV01_CONTEXT_DMA", "NV01_DEVICE_0", "NV01_EVENT",
  "NV01_EVENT_KERNEL_CALLBACK", "NV01_EVENT_KERNEL_CALLBACK_EX", "NV01_EVENT_OS_EVENT", "NV01_MEMORY_LIST_SYSTEM",
  "NV01_MEMORY_SYSTEM", "NV01_MEMORY_SYSTEM_OS_DESCRIPTOR", "NV01_ROOT", "NV01_ROOT_CLIENT", "NV01_ROOT_NON_PRIV",
  "NV20_SUBDEVICE_0",
)
CHIP_CLASSES = {
  "GA100": (  # gpuGetNoEngClassList_GA100, then gpuGetEngClassDescriptorList_GA100
    "AMPERE_SMC_CONFIG_SESSION", "AMPERE_SMC_EXEC_PARTITION_REF", "AMPERE_SMC_MONITOR_SESSION",
    "AMPERE_SMC_PARTITION_REF", "FABRIC_MANAGER_SESSION", "GF100_CHANNEL_GPFIFO", "GF100_PROFILER", "GT200_DEBUGGER",
    "KERNEL_GRAPHICS_CONTEXT", "MAXWELL_PROFILER_CONTEXT", "MAXWELL_PROFILER_DEVICE", "MPS_COMPUTE",
    "NV0020_GPU_MANAGEMENT", "NV0092_RG_LINE_CALLBACK", "NV01_MEMORY_DEVICELESS", "NV01_MEMORY_FLA",
    "NV01_MEMORY_FRAMEBUFFER_CONSOLE", "NV01_MEMORY_HW_RESOURCES", "NV01_MEMORY_LIST_FBMEM",
    "NV01_MEMORY_LIST_OBJECT", "NV01_MEMORY_LOCAL_PHYSICAL", "NV01_MEMORY_LOCAL_PRIVILEGED", "NV01_TIMER",
    "NV2081_BINAPI", "NV2082_BINAPI_PRIVILEGED", "NV20_SUBDEVICE_DIAG", "NV30_GSYNC", "NV40_DEBUG_BUFFER",
    "NV40_I2C", "NV9010_VBLANK_CALLBACK", "NVENC_SW_SESSION", "NVFBC_SW_SESSION", "NV_CE_UTILS", "NV_EVENT_BUFFER",
    "NV_IMEX_SESSION", "NV_MEMORY_EXPORT", "NV_MEMORY_FABRIC", "NV_MEMORY_FABRIC_IMPORTED_REF",
    "NV_MEMORY_FABRIC_IMPORT_V2", "NV_MEMORY_MAPPER", "NV_SEMAPHORE_SURFACE", "UVM_CHANNEL_RETAINER",
    "ACCESS_COUNTER_NOTIFY_BUFFER", "AMPERE_A", "AMPERE_CHANNEL_GPFIFO_A", "AMPERE_COMPUTE_A", "AMPERE_DMA_COPY_A",
    "AMPERE_USERMODE_A", "FABRIC_VASPACE_A", "FERMI_CONTEXT_SHARE_A", "FERMI_TWOD_A", "FERMI_VASPACE_A",
    "G84_PERFBUFFER", "GF100_SUBDEVICE_INFOROM", "GF100_SUBDEVICE_MASTER", "GF100_TIMED_SEMAPHORE_SW",
    "GF100_ZBC_CLEAR", "GP100_UVM_SW", "IO_VASPACE_A", "KEPLER_CHANNEL_GROUP_A", "KEPLER_DEVICE_VGPU",
    "KEPLER_INLINE_TO_MEMORY_B", "MAXWELL_PROFILER", "MMU_FAULT_BUFFER", "NV0060_SYNC_GPU_BOOST",
    "NV01_MEMORY_LOCAL_USER", "NV01_MEMORY_VIRTUAL", "NV04_SOFTWARE_TEST", "NV50_CHANNEL_GPFIFO",
    "NV50_DEFERRED_API_CLASS", "NV50_MEMORY_VIRTUAL", "NV50_P2P", "NV50_THIRD_PARTY_P2P", "NVA081_VGPU_CONFIG",
    "NVA084_KERNEL_HOST_VGPU_DEVICE", "NVC4D1_VIDEO_NVJPG", "NVC6B0_VIDEO_DECODER", "NVC6FA_VIDEO_OFA",
    "NV_CONFIDENTIAL_COMPUTE", "RM_USER_SHARED_DATA", "TURING_CHANNEL_GPFIFO_A", "TURING_USERMODE_A",
    "VOLTA_CHANNEL_GPFIFO_A", "VOLTA_USERMODE_A",
  ),
  "AD102": (  # gpuGetNoEngClassList_AD102, then gpuGetEngClassDescriptorList_AD102
    "AMPERE_SMC_CONFIG_SESSION", "AMPERE_SMC_EXEC_PARTITION_REF", "AMPERE_SMC_MONITOR_SESSION",
    "AMPERE_SMC_PARTITION_REF", "FABRIC_MANAGER_SESSION", "GF100_CHANNEL_GPFIFO", "GF100_PROFILER", "GT200_DEBUGGER",
    "KERNEL_GRAPHICS_CONTEXT", "MAXWELL_PROFILER_CONTEXT", "MAXWELL_PROFILER_DEVICE", "MMU_VIDMEM_ACCESS_BIT_BUFFER",
    "MPS_COMPUTE", "NV0020_GPU_MANAGEMENT", "NV0092_RG_LINE_CALLBACK", "NV01_MEMORY_DEVICELESS", "NV01_MEMORY_FLA",
    "NV01_MEMORY_FRAMEBUFFER_CONSOLE", "NV01_MEMORY_HW_RESOURCES", "NV01_MEMORY_LIST_FBMEM",
    "NV01_MEMORY_LIST_OBJECT", "NV01_MEMORY_LOCAL_PHYSICAL", "NV01_MEMORY_LOCAL_PRIVILEGED", "NV01_TIMER",
    "NV2081_BINAPI", "NV2082_BINAPI_PRIVILEGED", "NV20_SUBDEVICE_DIAG", "NV30_GSYNC", "NV40_DEBUG_BUFFER",
    "NV40_I2C", "NV9010_VBLANK_CALLBACK", "NVENC_SW_SESSION", "NVFBC_SW_SESSION", "NV_CE_UTILS", "NV_EVENT_BUFFER",
    "NV_IMEX_SESSION", "NV_MEMORY_EXPORT", "NV_MEMORY_FABRIC", "NV_MEMORY_FABRIC_IMPORTED_REF",
    "NV_MEMORY_FABRIC_IMPORT_V2", "NV_MEMORY_MAPPER", "NV_SEMAPHORE_SURFACE", "UVM_CHANNEL_RETAINER",
    "ACCESS_COUNTER_NOTIFY_BUFFER", "ADA_A", "ADA_COMPUTE_A", "AMPERE_CHANNEL_GPFIFO_A", "AMPERE_DMA_COPY_B",
    "AMPERE_USERMODE_A", "FABRIC_VASPACE_A", "FERMI_CONTEXT_SHARE_A", "FERMI_TWOD_A", "FERMI_VASPACE_A",
    "G84_PERFBUFFER", "GF100_DISP_SW", "GF100_HDACODEC", "GF100_SUBDEVICE_INFOROM", "GF100_SUBDEVICE_MASTER",
    "GF100_TIMED_SEMAPHORE_SW", "GF100_ZBC_CLEAR", "GP100_UVM_SW", "IO_VASPACE_A", "KEPLER_CHANNEL_GROUP_A",
    "KEPLER_DEVICE_VGPU", "KEPLER_INLINE_TO_MEMORY_B", "MAXWELL_PROFILER", "MMU_FAULT_BUFFER",
    "NV0060_SYNC_GPU_BOOST", "NV01_MEMORY_LOCAL_USER", "NV01_MEMORY_VIRTUAL", "NV04_DISPLAY_COMMON",
    "NV04_SOFTWARE_TEST", "NV50_CHANNEL_GPFIFO", "NV50_DEFERRED_API_CLASS", "NV50_MEMORY_VIRTUAL", "NV50_P2P",
    "NV50_THIRD_PARTY_P2P", "NVA081_VGPU_CONFIG", "NVA084_KERNEL_HOST_VGPU_DEVICE", "NVC372_DISPLAY_SW",
    "NVC67A_CURSOR_IMM_CHANNEL_PIO", "NVC67B_WINDOW_IMM_CHANNEL_DMA", "NVC67E_WINDOW_CHANNEL_DMA", "NVC770_DISPLAY",
    "NVC771_DISP_SF_USER", "NVC773_DISP_CAPABILITIES", "NVC77D_CORE_CHANNEL_DMA", "NVC77F_ANY_CHANNEL_DMA",
    "NVC9B0_VIDEO_DECODER", "NVC9B7_VIDEO_ENCODER", "NVC9D1_VIDEO_NVJPG", "NVC9FA_VIDEO_OFA",
    "NV_CONFIDENTIAL_COMPUTE", "RM_USER_SHARED_DATA", "TURING_CHANNEL_GPFIFO_A", "TURING_USERMODE_A",
    "VOLTA_CHANNEL_GPFIFO_A", "VOLTA_USERMODE_A",
  ),
  "GH100": (  # gpuGetNoEngClassList_GH100, then gpuGetEngClassDescriptorList_GH100
    "AMPERE_SMC_CONFIG_SESSION", "AMPERE_SMC_EXEC_PARTITION_REF", "AMPERE_SMC_MONITOR_SESSION",
    "AMPERE_SMC_PARTITION_REF", "FABRIC_MANAGER_SESSION", "GF100_CHANNEL_GPFIFO", "GF100_PROFILER", "GT200_DEBUGGER",
    "HOPPER_MMU_VIDMEM_ACCESS_BIT_BUFFER", "KERNEL_GRAPHICS_CONTEXT", "MAXWELL_PROFILER_CONTEXT",
    "MAXWELL_PROFILER_DEVICE", "MMU_VIDMEM_ACCESS_BIT_BUFFER", "MPS_COMPUTE", "NV0020_GPU_MANAGEMENT",
    "NV0092_RG_LINE_CALLBACK", "NV01_MEMORY_DEVICELESS", "NV01_MEMORY_FLA", "NV01_MEMORY_FRAMEBUFFER_CONSOLE",
    "NV01_MEMORY_HW_RESOURCES", "NV01_MEMORY_LIST_FBMEM", "NV01_MEMORY_LIST_OBJECT", "NV01_MEMORY_LOCAL_PHYSICAL",
    "NV01_MEMORY_LOCAL_PRIVILEGED", "NV01_TIMER", "NV2081_BINAPI", "NV2082_BINAPI_PRIVILEGED", "NV20_SUBDEVICE_DIAG",
    "NV30_GSYNC", "NV40_DEBUG_BUFFER", "NV40_I2C", "NV9010_VBLANK_CALLBACK", "NVENC_SW_SESSION", "NVFBC_SW_SESSION",
    "NV_CE_UTILS", "NV_COUNTER_COLLECTION_UNIT", "NV_EVENT_BUFFER", "NV_IMEX_SESSION", "NV_MEMORY_EXPORT",
    "NV_MEMORY_EXTENDED_USER", "NV_MEMORY_FABRIC", "NV_MEMORY_FABRIC_IMPORTED_REF", "NV_MEMORY_FABRIC_IMPORT_V2",
    "NV_MEMORY_MAPPER", "NV_MEMORY_MULTICAST_FABRIC", "NV_SEMAPHORE_SURFACE", "UVM_CHANNEL_RETAINER",
    "ACCESS_COUNTER_NOTIFY_BUFFER", "AMPERE_CHANNEL_GPFIFO_A", "AMPERE_USERMODE_A", "FABRIC_VASPACE_A",
    "FERMI_CONTEXT_SHARE_A", "FERMI_TWOD_A", "FERMI_VASPACE_A", "G84_PERFBUFFER", "GF100_SUBDEVICE_INFOROM",
    "GF100_SUBDEVICE_MASTER", "GF100_TIMED_SEMAPHORE_SW", "GF100_ZBC_CLEAR", "GP100_UVM_SW", "HOPPER_A",
    "HOPPER_CHANNEL_GPFIFO_A", "HOPPER_COMPUTE_A", "HOPPER_DMA_COPY_A", "HOPPER_SEC2_WORK_LAUNCH_A",
    "HOPPER_USERMODE_A", "IO_VASPACE_A", "KEPLER_CHANNEL_GROUP_A", "KEPLER_DEVICE_VGPU", "KEPLER_INLINE_TO_MEMORY_B",
    "MAXWELL_PROFILER", "MMU_FAULT_BUFFER", "NV0060_SYNC_GPU_BOOST", "NV01_MEMORY_LOCAL_USER", "NV01_MEMORY_VIRTUAL",
    "NV04_SOFTWARE_TEST", "NV50_CHANNEL_GPFIFO", "NV50_DEFERRED_API_CLASS", "NV50_MEMORY_VIRTUAL", "NV50_P2P",
    "NV50_THIRD_PARTY_P2P", "NVA081_VGPU_CONFIG", "NVA084_KERNEL_HOST_VGPU_DEVICE", "NVB8B0_VIDEO_DECODER",
    "NVB8D1_VIDEO_NVJPG", "NVB8FA_VIDEO_OFA", "NV_CONFIDENTIAL_COMPUTE", "RM_USER_SHARED_DATA",
    "TURING_CHANNEL_GPFIFO_A", "TURING_USERMODE_A", "VOLTA_CHANNEL_GPFIFO_A", "VOLTA_USERMODE_A",
  ),
}

USERMODE_CLASSES = (rm.HOPPER_USERMODE_A, rm.AMPERE_USERMODE_A)
CHANNEL_CLASSES = (rm.HOPPER_CHANNEL_GPFIFO_A, rm.AMPERE_CHANNEL_GPFIFO_A)
GR_ENGINE, CE_ENGINES = rm.NV2080_ENGINE_TYPE_GRAPHICS, range(rm.NV2080_ENGINE_TYPE_COPY0, rm.NV2080_ENGINE_TYPE_COPY0 + 10)
NV2080_ENGINE_TYPE_LAST = 0x00000040      # cl2080_notification.h: NV2080_ENGINE_TYPE_IS_VALID(i) is 0 < i < LAST
# A GR channel's context buffers (main context, patch, page pool, attribute/bundle circular buffers, ...) that
# UVM_REGISTER_CHANNEL maps into the caller's region, each at its own alignment (uvm_user_channel.c create_va_range;
# NV_ERR_INVALID_ADDRESS when they do not fit), and whose total NV2080_CTRL_CMD_GR_GET_CTX_BUFFER_SIZE reports for the
# channel. A model, not read off hardware: the sizes grow with the SM count (each SM's context-switch state) and the
# one public figure seen (a CUDA trace: 62,316,544 bytes, GPU unnamed) sits among them; the H200's exceeds a fixed
# 64 MiB, so a driver that assumes one is caught. (bytes, alignment) per buffer.
MIB = 1 << 20
CTX_BUFFERS = {
  "GA100": [(40 * MIB, 2 * MIB), (64 << 10, 64 << 10), (8 * MIB, 2 * MIB), (3 * MIB, 4 << 10)],
  "AD102": [(44 * MIB, 2 * MIB), (64 << 10, 64 << 10), (8 * MIB, 2 * MIB), (4 * MIB, 4 << 10)],
  "GH100": [(54 * MIB, 2 * MIB), (64 << 10, 64 << 10), (8 * MIB, 2 * MIB), (5 * MIB, 4 << 10)],
}


def ctx_buffer_layout(gpu: str, base: int) -> int:
  """The end of the GR context buffers laid out from `base` at their alignments (UVM's placement)."""
  at = base
  for nbytes, align in CTX_BUFFERS[gpu]: at = -(-at // align) * align + nbytes
  return at


def user_pages_pinnable(addr: int, nbytes: int, write: bool) -> bool:
  """Whether pin_user_pages (FOLL_LONGTERM, plus FOLL_WRITE for writable memory) pins every page of [addr, addr +
  nbytes) of this process, as RM's os_lock_user_pages asks (kernel-open/nvidia/os-mlock.c, 580.142): the range lies in
  mappings without holes that allow reading (and writing). Read from the process's own VMAs, /proc/self/maps; memory
  any device or library mapped counts, as for the real kernel."""
  end, need = addr + nbytes, "rw" if write else "r"
  with open("/proc/self/maps") as f:
    for line in f:
      span, perms = line.split(None, 2)[:2]
      lo, hi = (int(x, 16) for x in span.split("-"))
      if hi <= addr: continue
      if lo > addr or any(c not in perms for c in need): return False     # a hole, or an access the VMA forbids
      addr = hi
      if addr >= end: return True
  return False


def range_invalid_4k(base: int, length: int) -> bool:
  """uvm_api_range_invalid_4k (kernel-open/nvidia-uvm/uvm_api.h, 580.142)."""
  return bool(base % 0x1000 or length % 0x1000 or base == 0 or length == 0 or base + length >= 1 << 64)


def gpu_class_list(chip: str) -> list[int]:
  return sorted({CLASS_IDS[name] for name in (*GENERIC_CLASSES, *CHIP_CLASSES[chip])})


# control command -> classes it is valid on (the command's high 16 bits name its interface's class)
CONTROL_CLASSES = {
  rm.NV0080_CTRL_CMD_GPU_GET_CLASSLIST_V2: (rm.NV01_DEVICE_0,), rm.NV2080_CTRL_CMD_GPU_GET_GID_INFO: (rm.NV20_SUBDEVICE_0,),
  rm.NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN: CHANNEL_CLASSES,
  rm.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE: (rm.KEPLER_CHANNEL_GROUP_A,),
  rm.NV2080_CTRL_CMD_FB_GET_INFO_V2: (rm.NV20_SUBDEVICE_0,),
  rm.NV2080_CTRL_CMD_GR_GET_CTX_BUFFER_SIZE: (rm.NV20_SUBDEVICE_0,),
}
# vidmem allocation fields the emulator honours; another nonzero one is valid RM input it does not emulate
# (NV_ERR_NOT_SUPPORTED): compression, block-linear or swizzled formats, fixed addresses, protected / localized memory
VIDMEM_ATTR = ("PAGE_SIZE", "LOCATION", "PHYSICALITY", "COHERENCY", "GPU_CACHE_SNOOPABLE")
VIDMEM_ATTR2 = ("GPU_CACHEABLE", "P2P_GPU_CACHEABLE", "PAGE_SIZE_HUGE", "PAGE_OFFLINING", "MEMORY_PROTECTION", "ZBC")
VIDMEM_FLAGS = sum(vidmem.F[f] for f in ("IGNORE_BANK_PLACEMENT", "FORCE_MEM_GROWS_UP", "FORCE_ALIGN_HOST_PAGE",
                                         "ALIGNMENT_HINT", "ALIGNMENT_FORCE", "MAP_NOT_REQUIRED", "NO_SCANOUT",
                                         "PERSISTENT_VIDMEM", "USE_BEGIN_END", "TURBO_CIPHER_ENCRYPTED", "VIRTUAL"))


class VideoMemory:
  """The emulated GPU's video memory: a memfd twice its size (sparse: a page exists once written), of which RM's
  allocator hands out ranges first fit while the bytes allocated stay within the GPU's memory (fragmentation never
  refuses an allocation: real PMA takes noncontiguous pages). Each allocation is mapped once more for the GPU's page
  tables to point into (`array`); a freed one is punched out of the memfd (its pages read zeros again).
  The GPU side's mapping of an allocation is a Python `mmap` whose pages stay mapped while any array of it lives: a
  channel thread that still holds one while the allocation is freed (a device closed with a kernel in flight) reads
  zeros, never unmapped memory. `close` (all the kernel's files closed, or the object collected) closes the memfd;
  mappings keep their pages."""

  def __init__(self, nbytes: int):
    self.size, self.used = nbytes, 0
    self.fd = os.memfd_create("nv-emu-video-memory", os.MFD_CLOEXEC)
    os.ftruncate(self.fd, 2 * nbytes)
    self.free_ranges = [(0, 2 * nbytes)]                  # (offset, bytes), sorted, coalesced
    self.views: dict[int, mmap.mmap] = {}                 # allocation offset -> the GPU side's mapping of it
    self.lock = threading.Lock()
    self._closer = weakref.finalize(self, os.close, self.fd)

  def alloc(self, nbytes: int, align: int) -> int | None:
    with self.lock:
      if self.used + nbytes > self.size: return None
      for i, (off, n) in enumerate(self.free_ranges):
        start = (off + align - 1) // align * align
        if start + nbytes > off + n: continue
        rest = [(off, start - off)] if start > off else []
        if start + nbytes < off + n: rest.append((start + nbytes, off + n - start - nbytes))
        self.free_ranges[i:i + 1] = rest
        self.used += nbytes
        self.views[start] = mmap.mmap(self.fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=start)
        return start
      return None

  def release(self, offset: int, nbytes: int):
    with self.lock:
      del self.views[offset]        # unmapped when the last array of it is gone
      _libc.fallocate(self.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, ctypes.c_long(offset), ctypes.c_long(nbytes))
      self.used -= nbytes
      ranges = sorted([*self.free_ranges, (offset, nbytes)])
      merged = [ranges[0]]
      for off, n in ranges[1:]:
        if merged[-1][0] + merged[-1][1] == off: merged[-1] = (merged[-1][0], merged[-1][1] + n)
        else: merged.append((off, n))
      self.free_ranges = merged

  def array(self, offset: int, nbytes: int, within: int = 0) -> np.ndarray:
    """`nbytes` at `within` bytes into the allocation at `offset`, as the GPU's page tables see them."""
    return np.frombuffer(self.views[offset], np.uint8, nbytes, within)

  def close(self): self._closer()


_libc = ctypes.CDLL(None, use_errno=True)
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 0x01, 0x02         # <linux/falloc.h>


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
  map_context: tuple | None = None   # from NV_ESC_RM_MAP_MEMORY: (object host address, length), or for video memory
                                     # ("vidmem", memfd offset, length, its VideoMemory)


class EmulatedNVKernel:
  emulated = True

  def __init__(self, va_space_mm: bool = True, gpu: str = DEFAULT_GPU):
    # va_space_mm=False: a kernel where UVM's va_space_mm is disabled, so UVM_MM_INITIALIZE answers
    # NV_WARN_NOTHING_TO_DO (uvm.c, uvm_api_mm_initialize; 580.142), which is not an error
    if gpu not in GPU_MODELS: raise ValueError(f"emulated NV GPU {gpu!r}: one of {', '.join(GPU_MODELS)}")
    self.va_space_mm = va_space_mm
    self.real = KernelInterface()
    self.model = GPU_MODELS[gpu]
    self.gpu = NVGpu(self.model)
    self.classes = gpu_class_list(gpu)
    m, listed = self.model, set(self.classes)
    usermode = [c for c in USERMODE_CLASSES if c in listed]
    channel = [c for c in CHANNEL_CLASSES if c in listed]
    # class -> classes its parent may have (the classes this emulator allocates)
    self.parents = {
      rm.NV01_DEVICE_0: (rm.NV01_ROOT_CLIENT,), rm.NV20_SUBDEVICE_0: (rm.NV01_DEVICE_0,),
      **{c: (rm.NV20_SUBDEVICE_0,) for c in usermode}, rm.FERMI_VASPACE_A: (rm.NV01_DEVICE_0,),
      rm.KEPLER_CHANNEL_GROUP_A: (rm.NV01_DEVICE_0,), rm.FERMI_CONTEXT_SHARE_A: (rm.KEPLER_CHANNEL_GROUP_A,),
      **{c: (rm.KEPLER_CHANNEL_GROUP_A,) for c in channel}, m.compute_class: tuple(channel), m.copy_class: tuple(channel),
      rm.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR: (rm.NV01_DEVICE_0,),
      rm.NV01_MEMORY_LOCAL_USER: (rm.NV01_DEVICE_0, rm.NV20_SUBDEVICE_0),     # resource_list.h
    }
    self.uvm_channels: dict[tuple, tuple] = {}   # registered (client, channel) -> (resource base, bytes) or None
    self.files: dict[int, File] = {}
    self._next_fd = 1000
    self.clients: dict[int, dict[int, Obj]] = {}
    self._next_client = 0xC1D00000
    self.anon: dict[int, int] = {}         # host mappings made through this interface: address -> length
    self.uvm_ranges: dict[int, int] = {}   # external ranges: base -> length
    self.uvm_maps: dict[int, int] = {}     # GPU mappings in them (UVM_MAP_EXTERNAL_ALLOCATION): address -> length
    self.uvm_objects: dict[int, "Obj"] = {}   # the RM memory object each GPU mapping maps: address -> object
    self._vram: VideoMemory | None = None  # made on the first video-memory allocation
    self.bar1: dict[int, int] = {}         # CPU mappings of video memory (mmap of /dev/nvidiaN): address -> length
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
    if not self.files and self._vram is not None:     # the last file: the process let go of the GPU
      for va, o in list(self.uvm_objects.items()):
        if "vidmem" in o.info: self._unmap_gpu(va)
      self._vram.close()
      self._vram = None

  def mmap(self, addr: int, length: int, prot: int, flags: int, fd: int, offset: int) -> int:
    if fd == -1:
      res = self.real.mmap(addr, length, prot, flags, fd, offset)
      self.anon[res] = length
      return res
    f = self._file(fd, "mmap")
    if f.path != DEV or f.map_context is None:
      raise KernelCallError(errno.EINVAL, f"mmap of fd {fd} ({f.path}) without an NV_ESC_RM_MAP_MEMORY context [emulated NV]")
    if f.map_context[0] == "vidmem":      # BAR1: nvidia_mmap_helper wants offset 0 and the mapped length exactly
      _, fb_offset, size, _ = f.map_context
      if offset != 0 or length != size:
        kernel_mod.log("mmap", addr=addr, length=length, prot=prot, flags=flags, fd=fd, offset=offset, result=-1)
        raise KernelCallError(errno.EINVAL, f"mmap of {length:#x} bytes at offset {offset:#x} of fd {fd}: the mapped "
                                            f"video memory is {size:#x} bytes at offset 0 [emulated NV]")
      res = self.real.mmap(addr, length, prot, flags, f.map_context[3].fd, fb_offset)
      self.bar1[res] = length
      return res
    host, size = f.map_context
    if offset != 0 or length > size: raise KernelCallError(errno.EINVAL, f"mmap of {length:#x} bytes at offset {offset:#x} "
                                                                          f"exceeds the mapped object ({size:#x} bytes)")
    kernel_mod.log("mmap", addr=addr, length=length, prot=prot, flags=flags, fd=fd, offset=offset, result=host)
    return host

  def munmap(self, addr: int, length: int) -> None:
    if addr in self.anon or addr in self.bar1:
      self.anon.pop(addr, None); self.bar1.pop(addr, None)
      self.real.munmap(addr, length)
    else: kernel_mod.log("munmap", addr=addr, length=length, result=0)

  def _file(self, fd: int, what: str) -> File:
    if fd not in self.files: raise KernelCallError(errno.EBADF, f"{what} on fd {fd}: not open [emulated NV]")
    return self.files[fd]

  # ---- the side channel and faults ----
  def register_program(self, code_addr: int, source: str | None, name: str, param_base: int, params: list):
    """The driver hands over the PTX of the cubin it uploaded at `code_addr` (drivers/emu/README.md)."""
    if source is None: raise ValueError(f"emulated NV GPU: no PTX for kernel {name}: the emulator runs PTX, not SASS")
    self.gpu.programs[code_addr] = EmulatedProgram(source, name, param_base, params, self.model.arch)

  def unregister_program(self, code_addr: int):
    self.gpu.programs.pop(code_addr, None)

  def fault(self) -> str | None:
    with self.gpu.lock: faults = list(self.gpu.faults.values())
    return "; ".join(faults) or None

  # ---- video memory ----
  @property
  def vram(self) -> VideoMemory:
    if self._vram is None: self._vram = VideoMemory(self.model.fb_mib << 20)
    return self._vram

  @property
  def copy_engine_bytes(self) -> int:
    """Bytes the GPU's copy engines moved (LAUNCH_DMA on any channel) since the kernel was opened (tools/bench.py)."""
    with self.gpu.lock: return sum(self.gpu.copy_bytes.values())

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
      # an escape on the wrong kind of file: nvidia_ioctl returns -EINVAL and leaves the status alone (escape.c
      # NV_CTL_DEVICE_ONLY / NV_ACTUAL_DEVICE_ONLY -> nv.c nvidia_ioctl, 580.142)
      self._einval(f"{esc_name} on {f.path} (it is an escape of {'/dev/nvidiaN' if device_only else '/dev/nvidiactl'})")
    if nr == rm.NV_ESC_CHECK_VERSION_STR:
      p.reply = rm.NV_RM_API_VERSION_REPLY_RECOGNIZED
      if p.cmd == rm.NV_RM_API_VERSION_CMD_QUERY: p.versionString = DRIVER_VERSION.encode()
      return 0
    if nr == rm.NV_ESC_CARD_INFO:
      cards = ffi.cast("nv_ioctl_card_info_t *", addr)
      for i in range(rm.NV_MAX_DEVICES): cards[i] = ffi.new("nv_ioctl_card_info_t *")[0]
      cards[0].valid, cards[0].gpu_id, cards[0].minor_number = 1, 0x100, 0
      cards[0].pci_info.vendor_id, cards[0].pci_info.device_id, cards[0].pci_info.bus = 0x10DE, self.model.pci_device, 1
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
    if p.hClass not in self.classes: raise RMFail("NV_ERR_INVALID_CLASS")
    if p.hClass not in self.parents: raise RMFail("NV_ERR_NOT_SUPPORTED")    # listed by the chip, not emulated
    parent = self._obj(client, p.hObjectParent, "NV_ERR_INVALID_OBJECT_PARENT")
    if parent.cls not in self.parents[p.hClass]: raise RMFail("NV_ERR_INVALID_OBJECT_PARENT")
    if p.hObjectNew == 0: raise RMFail("NV_ERR_INVALID_OBJECT_NEW")
    if p.hObjectNew in client: raise RMFail("NV_ERR_INSERT_DUPLICATE_NAME")
    obj = Obj(p.hClass, p.hObjectParent)
    if p.hClass == rm.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR: self._os_desc_alloc(p)      # raises: nothing to allocate
    struct_name = rm.ALLOC_PARAMS.get(p.hClass)
    a = self._params(p, struct_name) if struct_name else None
    if p.hClass == rm.NV01_DEVICE_0 and a.deviceId != 0: raise RMFail("NV_ERR_INVALID_DEVICE")
    if p.hClass == rm.NV20_SUBDEVICE_0 and a.subDeviceId != 0: raise RMFail("NV_ERR_INVALID_DEVICE")
    if p.hClass in USERMODE_CLASSES:
      obj.info["host"] = self.real.mmap(0, 0x10000, 3, kernel_mod.MAP_PRIVATE | kernel_mod.MAP_ANONYMOUS, -1, 0)
      obj.info["size"] = 0x10000
      self.gpu.add_doorbell(obj.info["host"])
    if p.hClass == rm.FERMI_VASPACE_A: obj.info["external"] = bool(a.flags & rm.NV_VASPACE_ALLOCATION_FLAGS_IS_EXTERNALLY_OWNED)
    if p.hClass == rm.KEPLER_CHANNEL_GROUP_A:
      # kchangrpapiConstruct (gpu/fifo/kernel_channel_group_api.c): on GPUs with per-runlist channel RAM (GA100 and
      # later, kfifoIsPerRunlistChramSupportedInHw) a TSG needs a valid engine type, which picks its runlist
      if not 0 < a.engineType < NV2080_ENGINE_TYPE_LAST: raise RMFail("NV_ERR_INVALID_ARGUMENT")
      if a.engineType != GR_ENGINE and a.engineType not in CE_ENGINES: raise RMFail("NV_ERR_NOT_SUPPORTED")   # not emulated
      obj.info["engine"] = a.engineType
    if p.hClass == rm.FERMI_CONTEXT_SHARE_A: obj.info["vaspace"] = self._find(client, a.hVASpace, rm.FERMI_VASPACE_A)
    if p.hClass == rm.NV01_MEMORY_LOCAL_USER: self._vidmem_alloc(a, obj)
    if p.hClass in (self.model.compute_class, self.model.copy_class):
      if any(client[c].cls == p.hClass for c in parent.children): raise RMFail("NV_ERR_INVALID_STATE")
      # a class is looked up for the channel's engine (chandesConstruct, gpu/fifo/channel_descendant.c): compute needs a
      # GR channel; a copy object on a GR channel uses the GR engine's partner CE (GRCE)
      if p.hClass == self.model.compute_class and parent.info["engine"] != GR_ENGINE: raise RMFail("NV_ERR_INVALID_CLASS")
      parent.info["objects"][p.hObjectNew] = p.hClass
    if p.hClass in CHANNEL_CLASSES: self._channel(client, parent, obj, a, p.hObjectNew, p.hClass)
    client[p.hObjectNew] = obj
    parent.children.append(p.hObjectNew)

  def _os_desc_alloc(self, p):
    """NV_ESC_RM_ALLOC of NV01_MEMORY_SYSTEM_OS_DESCRIPTOR (NV_OS_DESC_MEMORY_ALLOCATION_PARAMS, resource_list.h): RM
    pins nothing on this path, so a user-space client's descriptors are refused (osdescConstruct ->
    osCreateMemFromOsDescriptor, arch/nvalloc/unix/src/osmemdesc.c, 580.142): a VIRTUAL_ADDRESS (what a user has) is
    NV_ERR_NOT_SUPPORTED, as are the kernel-only PHYS_ADDR / DMA_BUF_PTR / SGT_PTR; an unknown type is
    NV_ERR_INVALID_ARGUMENT. The page-array, IO-memory and file-handle types are not emulated (NV_ERR_NOT_SUPPORTED).
    User pages go through NV_ESC_RM_ALLOC_MEMORY (_alloc_memory), which pins them."""
    struct_name = "NV_OS_DESC_MEMORY_ALLOCATION_PARAMS"
    if p.paramsSize != osdesc.ffi.sizeof(struct_name) or not p.pAllocParms: raise RMFail("NV_ERR_INVALID_PARAM_STRUCT")
    a = osdesc.ffi.cast(struct_name + " *", p.pAllocParms)
    if not a.descriptor or a.limit == 0: raise RMFail("NV_ERR_INVALID_PARAM_STRUCT")
    if a.descriptorType not in osdesc.DESCRIPTOR_TYPES or osdesc.DESCRIPTOR_TYPES[a.descriptorType] == "KERNEL_VIRTUAL_ADDRESS":
      raise RMFail("NV_ERR_INVALID_ARGUMENT")       # the switch's default
    raise RMFail("NV_ERR_NOT_SUPPORTED")

  def _channel(self, client, group: Obj, obj: Obj, a, handle: int, cls: int):
    # kchannelConstruct (src/nvidia/src/kernel/gpu/fifo/kernel_channel.c, 580.142)
    if not a.hContextShare: raise RMFail("NV_ERR_NOT_SUPPORTED")     # the TSG's legacy context shares: not emulated
    ctx = self._find(client, a.hContextShare, rm.FERMI_CONTEXT_SHARE_A)
    if ctx.parent != obj.parent: raise RMFail("NV_ERR_INVALID_OBJECT_PARENT")   # the context share's parent is the TSG
    if a.gpFifoEntries == 0 or a.gpFifoEntries & (a.gpFifoEntries - 1): raise RMFail("NV_ERR_INVALID_ARGUMENT")
    # "Engine type of channel = ... not compatible with engine type of TSG = ...": a valid engineType must be the TSG's;
    # the channel takes the TSG's engine (0 inherits it)
    if 0 < a.engineType < NV2080_ENGINE_TYPE_LAST and a.engineType != group.info["engine"]: raise RMFail("NV_ERR_INVALID_ARGUMENT")
    engine = group.info["engine"]
    # a TSG one of whose channels had an error stays in RM's recovery (kernel_channel.c bIsRcPending): the emulator
    # takes no new channel into it; the client frees the group and makes a new one
    if any(getattr(p, "faulted", False) for p in group.info.get("procs", ())): raise RMFail("NV_ERR_INVALID_STATE")
    memory = (rm.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR, rm.NV01_MEMORY_LOCAL_USER)    # USERD / notifier: any memory object
    userd = self._find(client, a.hUserdMemory[0], memory)
    if a.userdOffset[0] + 0x200 > userd.info["size"]: raise RMFail("NV_ERR_INVALID_OFFSET")
    notifier = None
    if a.hObjectError:
      err = self._find(client, a.hObjectError, memory)
      notifier = err.info.get("va")
    if not self._gpu_mapped(a.gpFifoOffset, 8 * a.gpFifoEntries): raise RMFail("NV_ERR_INVALID_ADDRESS")
    if userd.info.get("va") is None: raise RMFail("NV_ERR_INVALID_ADDRESS")
    token = len(self.tokens) + 1
    obj.info.update(engine=engine, objects={}, token=token, vaspace=ctx.info["vaspace"], bound=False)
    proc = ChannelProcessor(self.gpu, "compute" if engine == GR_ENGINE else "copy", handle, a.gpFifoOffset,
                            a.gpFifoEntries, userd.info["va"] + a.userdOffset[0], notifier, obj.info["objects"], None, cls)
    proc.token = token
    obj.info["proc"] = proc
    group.info.setdefault("procs", []).append(proc)
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
      c.numClasses = len(self.classes)
      c.classList[0:len(self.classes)] = self.classes
    elif p.cmd == rm.NV2080_CTRL_CMD_GPU_GET_GID_INFO:
      if c.flags != rm.NV2080_GPU_CMD_GPU_GET_GID_FLAGS_FORMAT_BINARY: raise RMFail("NV_ERR_NOT_SUPPORTED")
      c.length = 16
      c.data[0:16] = GPU_UUID
    elif p.cmd == rm.NV2080_CTRL_CMD_FB_GET_INFO_V2:
      # subdeviceCtrlCmdFbGetInfoV2 / _kmemsysGetFbInfos (gpu/mem_sys/kern_mem_sys_ctrl.c): sizes in KiB
      if not 0 < c.fbInfoListSize <= vidmem.FB_INFO_MAX_LIST_SIZE: raise RMFail("NV_ERR_INVALID_ARGUMENT")
      total, free = (self.model.fb_mib << 20) >> 10, ((self.model.fb_mib << 20) - (self._vram.used if self._vram else 0)) >> 10
      values = {"TOTAL_RAM_SIZE": total, "RAM_SIZE": total, "USABLE_RAM_SIZE": total, "HEAP_SIZE": total, "HEAP_FREE": free}
      index = {v: k for k, v in vidmem.FB_INFO_INDEX.items()}
      for i in range(c.fbInfoListSize):
        name = index.get(c.fbInfoList[i].index)
        if name not in values: raise RMFail("NV_ERR_NOT_SUPPORTED")       # an index the emulator does not model
        c.fbInfoList[i].data = values[name]
    elif p.cmd == rm.NV2080_CTRL_CMD_GR_GET_CTX_BUFFER_SIZE:
      # subdeviceCtrlCmdGrGetCtxBufferSize (kernel_graphics_context / kgraphicsctx): the channel's GR context buffers,
      # laid out from an address aligned for all of them; a channel without GR context has none
      target = client.get(c.hChannel)
      if target is None or target.cls not in CHANNEL_CLASSES: raise RMFail("NV_ERR_INVALID_OBJECT_HANDLE")
      c.totalBufferSize = ctx_buffer_layout(self.model.chip, 0) if target.info.get("engine") == GR_ENGINE else 0
    elif p.cmd == rm.NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN:
      c.workSubmitToken = obj.info["token"]
    elif p.cmd == rm.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE:
      channels = [client[h] for h in obj.children if client[h].cls in CHANNEL_CLASSES]
      # kchangrpapiCtrlCmdGpFifoSchedule (gpu/fifo/kernel_channel_group_api.c): every channel must be schedulable;
      # kchannelIsSchedulable (kernel_channel.c) refuses a GR channel of an externally owned VA space that UVM has not
      # bound (bIsContextBound, set by nvGpuOpsBindChannelResources from UVM_REGISTER_CHANNEL; Bug 1737765)
      if any(ch.info["engine"] == GR_ENGINE and ch.info["vaspace"].info["external"] and not ch.info["bound"]
             for ch in channels): raise RMFail("NV_ERR_INVALID_STATE")
      if c.bEnable:
        for ch in channels:
          if not ch.info["proc"].is_alive():
            self.gpu.channels.append(ch.info["proc"])
            ch.info["proc"].start()

  def _free(self, p, fd):
    client = self._client(p.hRoot)
    if p.hObjectOld == p.hRoot:
      self._release_all(list(client.values()))
      del self.clients[p.hRoot]
      return
    obj = self._obj(client, p.hObjectOld)
    freed = []
    def drop(h):
      o = client.pop(h)
      for c in o.children: drop(c)
      freed.append(o)
    if obj.parent in client and p.hObjectOld in client[obj.parent].children: client[obj.parent].children.remove(p.hObjectOld)
    drop(p.hObjectOld)
    self._release_all(freed)

  def _release_all(self, objs: list):
    """Free objects together as RM does under a client or a device: the channels stop (their threads joined) before
    any memory goes, so no channel thread runs on memory that is already free."""
    for o in sorted(objs, key=lambda o: "proc" not in o.info): self._release(o)

  def _release(self, o: Obj):
    if "proc" in o.info: self.gpu.release(o.info["proc"])
    if "vidmem" in o.info:
      # UVM holds a duplicate of what it maps (nvUvmInterfaceDupMemory), so real pages outlive the handle while mapped;
      # the emulator drops such GPU mappings with the handle instead (the driver unmaps first: UVM_FREE, then RM_FREE)
      for va in [va for va, m in self.uvm_objects.items() if m is o]: self._unmap_gpu(va)
      o.info["vram"].release(o.info["vidmem"], o.info["size"])

  def _vidmem_alloc(self, a, obj: Obj):
    """NV01_MEMORY_LOCAL_USER: vidmemConstruct (mem_mgr/video_mem.c, 580.142) with stdmemValidateParams, the page size
    and alignment RM picks, and PMA's pages: NV_ERR_NO_MEMORY past the GPU's memory. RM writes back the size, the page
    size attributes, the offset and the limit."""
    bad = vidmem.rm_validate(a)
    if bad: raise RMFail(bad)
    if (any(vidmem.field(a.attr, f, vidmem.ATTR_FIELDS) for f in vidmem.ATTR_FIELDS if f not in VIDMEM_ATTR) or
        any(vidmem.field(a.attr2, f, vidmem.ATTR2_FIELDS) for f in vidmem.ATTR2_FIELDS if f not in VIDMEM_ATTR2) or
        a.flags & ~VIDMEM_FLAGS or a.flags & vidmem.F["USE_BEGIN_END"] or a.type != vidmem.TYPE_IMAGE or a.hVASpace or
        a.format not in (vidmem.PTE_KIND_PITCH, vidmem.PTE_KIND_GENERIC_MEMORY)):
      raise RMFail("NV_ERR_NOT_SUPPORTED")     # valid RM input that the emulator does not emulate
    page = vidmem.rm_page_size(a)
    if not page: raise RMFail("NV_ERR_INVALID_STATE")             # _vidmemQueryAlignment: no page size
    bad, size, align = vidmem.rm_alignment(a, page)
    if bad: raise RMFail(bad)
    offset = self.vram.alloc(size, align)
    if offset is None: raise RMFail("NV_ERR_NO_MEMORY")            # pmaAllocatePages
    a.size, a.offset, a.limit = size, offset, offset + size - 1
    huge = {vidmem.PAGE_2M: vidmem.PAGE_SIZE_HUGE_2MB, vidmem.PAGE_512M: vidmem.PAGE_SIZE_HUGE_512MB}.get(page)
    a.attr = (a.attr & ~(3 << 23)) | ((vidmem.PAGE_SIZE_HUGE if huge else vidmem.PAGE_SIZE_BIG) << 23)
    if huge: a.attr2 = (a.attr2 & ~(3 << 20)) | (huge << 20)
    obj.info.update(vidmem=offset, size=size, page=page, vram=self.vram, kind=a.format)

  def _alloc_memory(self, p, fd):
    """NV_ESC_RM_ALLOC_MEMORY of NV01_MEMORY_SYSTEM_OS_DESCRIPTOR: RmAllocOsDescriptor, RmCreateOsDescriptor (escape.c),
    then RM's alloc of the object (osdescConstruct, mem_mgr/os_desc_mem.c; osmemdesc.c), in their order; 580.142."""
    a = p.params
    if self.files[fd].registered_ctl is None: raise RMFail("NV_ERR_INVALID_ARGUMENT")
    if a.hClass != rm.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR: raise RMFail("NV_ERR_INVALID_CLASS")   # Nv01AllocMemory: not emulated
    bad = osdesc.rm_check_flags(a.flags)             # RmAllocOsDescriptor: LOCATION PCI, MAPPING NO_MAP, a coherency
    if bad: raise RMFail(bad)
    if a.pMemory % PAGE: raise RMFail("NV_ERR_NOT_SUPPORTED")           # RmCreateOsDescriptor: page-aligned descriptor
    if a.limit + 1 == 1 << 64: raise RMFail("NV_ERR_INVALID_LIMIT")     # "prevent an NvU64 overflow"
    size = (a.limit // PAGE + 1) * PAGE                                 # pageCount = 1 + (limit + 1 - 1) / page size
    writable = not osdesc.field(a.flags, "ALLOC_USER_READ_ONLY")       # PROTECTION_USER READ_WRITE: FOLL_WRITE
    if not user_pages_pinnable(a.pMemory, size, writable):
      raise RMFail("NV_ERR_INVALID_ADDRESS")   # os_lock_user_pages, then os_lookup_user_io_memory (no VM_IO/VM_PFNMAP here)
    client = self._client(a.hRoot)
    parent = self._obj(client, a.hObjectParent, "NV_ERR_INVALID_OBJECT_PARENT")
    if parent.cls != rm.NV01_DEVICE_0: raise RMFail("NV_ERR_INVALID_OBJECT_PARENT")   # resource_list.h: Device only
    handle = a.hObjectNew
    if handle == 0:        # RM generates one (clientGenResourceHandle) and RmAllocOsDescriptor does not return it
      self._next_internal = getattr(self, "_next_internal", 0xCAF00000) + 1
      handle = self._next_internal
    if handle in client: raise RMFail("NV_ERR_INSERT_DUPLICATE_NAME")
    if a.limit == 0: raise RMFail("NV_ERR_INVALID_PARAM_STRUCT")       # osCreateMemFromOsDescriptor: *pLimit == 0
    bad = osdesc.page_array_check_flags(a.flags)   # osCreateOsDescriptorFromPageArray: write-back, noncontiguous
    if bad: raise RMFail(bad)
    client[handle] = Obj(a.hClass, a.hObjectParent, info={"host": a.pMemory, "size": size, "writable": writable})
    parent.children.append(handle)

  def _map_memory(self, p, fd):
    a = p.params
    client = self._client(a.hClient)
    obj = self._obj(client, a.hMemory)
    if obj.parent != a.hDevice: raise RMFail("NV_ERR_INVALID_OBJECT_PARENT")
    if "vidmem" in obj.info:    # memMap (rmapi/mapping_cpu.c): offset, length; then BAR1, write-combined
      if a.offset >= obj.info["size"]: raise RMFail("NV_ERR_INVALID_BASE")
      if a.length == 0 or a.offset + a.length > obj.info["size"]: raise RMFail("NV_ERR_INVALID_LIMIT")
      target = self.files.get(p.fd)
      if target is None or target.path != DEV or target.registered_ctl is None: raise RMFail("NV_ERR_INVALID_ARGUMENT")
      target.map_context = ("vidmem", obj.info["vidmem"] + a.offset, a.length, obj.info["vram"])
      a.pLinearAddress = 0xB0000000_0000 + obj.info["vidmem"] + a.offset    # RM's cookie; the mmap places it
      return
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
    # uvm_create_external_range (kernel-open/nvidia-uvm/uvm_map_external.c, 580.142): 4K-aligned, nonzero, no overflow
    # (uvm_api_range_invalid_4k), and no UVM range there (uvm_va_range_create_external)
    self._need_init(f)
    if range_invalid_4k(p.base, p.length): raise RMFail("NV_ERR_INVALID_ADDRESS")
    if any(b < p.base + p.length and p.base < b + n for b, n in self._uvm_va_ranges()): raise RMFail("NV_ERR_UVM_ADDRESS_IN_USE")
    self.uvm_ranges[p.base] = p.length

  def _uvm_va_ranges(self) -> list[tuple[int, int]]:
    """(base, length) of every range in UVM's VA space: external ranges and registered channels' resources."""
    return [*self.uvm_ranges.items(), *(r for r in self.uvm_channels.values() if r)]

  def _uvm_register_channel(self, f, p):
    # uvm_api_register_channel (kernel-open/nvidia-uvm/uvm_user_channel.c, 580.142)
    self._need_init(f)
    if not self.uvm_gpu_registered or getattr(self, "vaspace", None) is None or bytes(p.gpuUuid) != GPU_UUID:
      raise RMFail("NV_ERR_INVALID_DEVICE")      # uvm_va_space_get_gpu_by_uuid_with_gpu_va_space
    client = self._client(p.hClient)             # rmCtrlFd is not checked (the TODO of Bug 1624521 there)
    ch = client.get(p.hChannel)
    if ch is None or ch.cls not in CHANNEL_CLASSES: raise RMFail("NV_ERR_INVALID_OBJECT_HANDLE")   # nvGpuOpsVerifyChannel
    if client.get(self.vaspace) is not ch.info["vaspace"]: raise RMFail("NV_ERR_INVALID_CHANNEL")   # another VA space
    key = (p.hClient, p.hChannel)
    if key in self.uvm_channels: raise RMFail("NV_ERR_INVALID_CHANNEL")    # already registered
    resources = None
    if ch.info["engine"] == GR_ENGINE:    # GR context buffers get VA in [base, base + length); CE channels have none
      if p.base % PAGE or p.length % PAGE or not p.base or not p.length or p.base + p.length >= 1 << 64:
        raise RMFail("NV_ERR_INVALID_ADDRESS")  # uvm_api_range_invalid
      if p.base + p.length - 1 >= self.model.max_channel_va: raise RMFail("NV_ERR_OUT_OF_RANGE")
      # the channels of one TSG share its GR context: a second one registers the region its buffers are already
      # mapped in (uvm.h: one VA region for several UvmRegisterChannel calls is allowed while everything fits)
      shared = next((r for (cl, h), r in self.uvm_channels.items()
                     if r and cl == p.hClient and h in client and client[h].parent == ch.parent), None)
      if shared is not None:
        if not (p.base <= shared[0] and shared[0] + shared[1] <= p.base + p.length): raise RMFail("NV_ERR_INVALID_ADDRESS")
        resources = shared
      else:
        end = ctx_buffer_layout(self.model.chip, p.base)      # each buffer at its alignment inside [base, base + length)
        if end > p.base + p.length or any(b < end and p.base < b + n for b, n in self._uvm_va_ranges()):
          raise RMFail("NV_ERR_INVALID_ADDRESS")  # create_va_range: "Range exceeded", or VA already in use
        resources = (p.base, end - p.base)
    self.uvm_channels[key] = resources
    ch.info["bound"] = True                     # bind_channel_resources -> nvGpuOpsBindChannelResources

  def _uvm_unregister_channel(self, f, p):
    # uvm_api_unregister_channel (uvm_user_channel.c): the channel must be registered; it is stopped
    self._need_init(f)
    key = (p.hClient, p.hChannel)
    if key not in self.uvm_channels: raise RMFail("NV_ERR_INVALID_CHANNEL")
    del self.uvm_channels[key]
    ch = self.clients.get(p.hClient, {}).get(p.hChannel)
    if ch is not None:
      ch.info["bound"] = False
      if "proc" in ch.info: self.gpu.release(ch.info["proc"])

  def _uvm_map_external_allocation(self, f, p):
    # uvm_map_external_allocation and uvm_map_external_allocation_on_gpu (uvm_map_external.c, 580.142), in their order
    self._need_init(f)
    if range_invalid_4k(p.base, p.length): raise RMFail("NV_ERR_INVALID_ADDRESS")
    if p.gpuAttributesCount == 0 or p.gpuAttributesCount > osdesc.UVM_MAX_GPUS: raise RMFail("NV_ERR_INVALID_ARGUMENT")
    if not any(b <= p.base and p.base + p.length <= b + n for b, n in self.uvm_ranges.items()):
      raise RMFail("NV_ERR_INVALID_ADDRESS")      # no external range holds [base, base + length)
    for i in range(p.gpuAttributesCount):
      at = p.perGpuAttributes[i]
      fmt_default, bits_default = at.gpuFormatType == 0, at.gpuElementBits == 0
      if (at.gpuMappingType not in osdesc.UVM_MAPPING_TYPES or at.gpuCachingType not in osdesc.UVM_CACHING_TYPES or
          at.gpuFormatType not in osdesc.UVM_FORMAT_TYPES or at.gpuElementBits not in osdesc.UVM_ELEMENT_BITS or
          at.gpuCompressionType >= osdesc.UVM_COMPRESSION_TYPE_COUNT or fmt_default != bits_default):
        raise RMFail("NV_ERR_INVALID_ARGUMENT")   # uvm_api_mapping_type_invalid, _caching_type_invalid, _kind_type_invalid
      if bytes(at.gpuUuid) != GPU_UUID or not self.uvm_gpu_registered or getattr(self, "vaspace", None) is None:
        raise RMFail("NV_ERR_INVALID_DEVICE")     # uvm_va_space_get_gpu_by_uuid_with_gpu_va_space
      if (at.gpuMappingType, at.gpuCachingType, at.gpuFormatType, at.gpuCompressionType) != (0, 0, 0, 0):
        raise RMFail("NV_ERR_NOT_SUPPORTED")      # valid, but the emulator maps with the defaults only
      if p.base + p.length > self.model.user_va_limit: raise RMFail("NV_ERR_OUT_OF_RANGE")   # uvm_gpu_can_address
      client = self._check_rm(p.rmCtrlFd, p.hClient)
      mem = self._find(client, p.hMemory, (rm.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR, rm.NV01_MEMORY_LOCAL_USER))   # DupMemory
      if p.offset % PAGE: raise RMFail("NV_ERR_INVALID_ADDRESS")    # no GPU page size (4K up) divides the offset
      if p.offset + p.length > mem.info["size"]: raise RMFail("NV_ERR_INVALID_OFFSET")   # uvm_va_range_map_rm_allocation
      # the mapping replaces what this GPU mapped in [base, base + length) (uvm_unmap_external_in_range); the emulator
      # does not split a mapping that only partly overlaps
      inside = [va for va, n in self.uvm_maps.items() if va < p.base + p.length and p.base < va + n]
      if any(va < p.base or va + self.uvm_maps[va] > p.base + p.length for va in inside): raise RMFail("NV_ERR_NOT_SUPPORTED")
      for va in inside: self._unmap_gpu(va)
      if "vidmem" in mem.info: self.gpu.mem.map_array(p.base, mem.info["vram"].array(mem.info["vidmem"], p.length, p.offset))
      else: self.gpu.map_host(p.base, mem.info["host"] + p.offset, p.length)
      self.uvm_maps[p.base] = p.length
      self.uvm_objects[p.base] = mem
      mem.info["va"] = p.base

  def _unmap_gpu(self, va: int):
    with self.gpu.lock: self.gpu.gpu_written.forget(va, va + self.uvm_maps[va])   # what it wrote there is gone
    del self.uvm_maps[va]
    self.uvm_objects.pop(va, None)
    self.gpu.mem.unmap(va)

  def _uvm_free(self, f, p):
    # uvm_free (uvm_va_range.c, 580.142): exactly one range, start and end; its GPU mappings go with it
    self._need_init(f)
    if self.uvm_ranges.get(p.base) != p.length: raise RMFail("NV_ERR_INVALID_ADDRESS")
    del self.uvm_ranges[p.base]
    for va in [va for va in self.uvm_maps if p.base <= va < p.base + p.length]: self._unmap_gpu(va)
