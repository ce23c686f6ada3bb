"""The amdkfd ioctl interface (/dev/kfd): argument structs, request numbers and flags.

Source: Linux `include/uapi/linux/kfd_ioctl.h`. Interface version 1.11 (Linux 6.1, the copy in
/usr/include/linux on Debian 12) for everything except AMDKFD_IOC_RUNTIME_ENABLE and
`struct kfd_ioctl_runtime_enable_args`, which arrived with interface 1.14 (Linux 6.4).
Only the structs baregrad uses are written here; tests/amd/test_kfd.py compiles a C program
against the system header and compares every size, field offset and request number.
"""
from __future__ import annotations
import cffi

ffi = cffi.FFI()
ffi.cdef("""
struct kfd_ioctl_get_version_args { uint32_t major_version; uint32_t minor_version; };

struct kfd_ioctl_create_queue_args {
  uint64_t ring_base_address; uint64_t write_pointer_address; uint64_t read_pointer_address; uint64_t doorbell_offset;
  uint32_t ring_size; uint32_t gpu_id; uint32_t queue_type; uint32_t queue_percentage; uint32_t queue_priority;
  uint32_t queue_id;
  uint64_t eop_buffer_address; uint64_t eop_buffer_size; uint64_t ctx_save_restore_address;
  uint32_t ctx_save_restore_size; uint32_t ctl_stack_size;
};
struct kfd_ioctl_destroy_queue_args { uint32_t queue_id; uint32_t pad; };

struct kfd_ioctl_create_event_args {
  uint64_t event_page_offset; uint32_t event_trigger_data; uint32_t event_type; uint32_t auto_reset;
  uint32_t node_id; uint32_t event_id; uint32_t event_slot_index;
};
struct kfd_ioctl_destroy_event_args { uint32_t event_id; uint32_t pad; };
struct kfd_ioctl_set_event_args { uint32_t event_id; uint32_t pad; };

struct kfd_memory_exception_failure { uint32_t NotPresent; uint32_t ReadOnly; uint32_t NoExecute; uint32_t imprecise; };
struct kfd_hsa_memory_exception_data {
  struct kfd_memory_exception_failure failure; uint64_t va; uint32_t gpu_id; uint32_t ErrorType;
};
struct kfd_hsa_hw_exception_data { uint32_t reset_type; uint32_t reset_cause; uint32_t memory_lost; uint32_t gpu_id; };
struct kfd_event_data {
  union { struct kfd_hsa_memory_exception_data memory_exception_data;
          struct kfd_hsa_hw_exception_data hw_exception_data; };
  uint64_t kfd_event_data_ext; uint32_t event_id; uint32_t pad;
};
struct kfd_ioctl_wait_events_args {
  uint64_t events_ptr; uint32_t num_events; uint32_t wait_for_all; uint32_t timeout; uint32_t wait_result;
};

struct kfd_ioctl_acquire_vm_args { uint32_t drm_fd; uint32_t gpu_id; };

struct kfd_ioctl_alloc_memory_of_gpu_args {
  uint64_t va_addr; uint64_t size; uint64_t handle; uint64_t mmap_offset; uint32_t gpu_id; uint32_t flags;
};
struct kfd_ioctl_free_memory_of_gpu_args { uint64_t handle; };
struct kfd_ioctl_map_memory_to_gpu_args {
  uint64_t handle; uint64_t device_ids_array_ptr; uint32_t n_devices; uint32_t n_success;
};
struct kfd_ioctl_unmap_memory_from_gpu_args {
  uint64_t handle; uint64_t device_ids_array_ptr; uint32_t n_devices; uint32_t n_success;
};

struct kfd_ioctl_runtime_enable_args { uint64_t r_debug; uint32_t mode_mask; uint32_t capabilities_mask; };
""")

# <asm-generic/ioctl.h>: nr bits 0-7, type bits 8-15, size bits 16-29, direction bits 30-31
IOC_NONE, IOC_WRITE, IOC_READ = 0, 1, 2
AMDKFD_IOCTL_BASE = ord("K")


def ioc(direction: int, nr: int, size: int, kind: int = AMDKFD_IOCTL_BASE) -> int:
  return (direction << 30) | (size << 16) | (kind << 8) | nr


# name -> (direction, nr, struct): the AMDKFD_IOC_* macros of kfd_ioctl.h
IOCTLS = {
  "GET_VERSION": (IOC_READ, 0x01, "kfd_ioctl_get_version_args"),
  "CREATE_QUEUE": (IOC_READ | IOC_WRITE, 0x02, "kfd_ioctl_create_queue_args"),
  "DESTROY_QUEUE": (IOC_READ | IOC_WRITE, 0x03, "kfd_ioctl_destroy_queue_args"),
  "CREATE_EVENT": (IOC_READ | IOC_WRITE, 0x08, "kfd_ioctl_create_event_args"),
  "DESTROY_EVENT": (IOC_WRITE, 0x09, "kfd_ioctl_destroy_event_args"),
  "SET_EVENT": (IOC_WRITE, 0x0A, "kfd_ioctl_set_event_args"),
  "WAIT_EVENTS": (IOC_READ | IOC_WRITE, 0x0C, "kfd_ioctl_wait_events_args"),
  "ACQUIRE_VM": (IOC_WRITE, 0x15, "kfd_ioctl_acquire_vm_args"),
  "ALLOC_MEMORY_OF_GPU": (IOC_READ | IOC_WRITE, 0x16, "kfd_ioctl_alloc_memory_of_gpu_args"),
  "FREE_MEMORY_OF_GPU": (IOC_WRITE, 0x17, "kfd_ioctl_free_memory_of_gpu_args"),
  "MAP_MEMORY_TO_GPU": (IOC_READ | IOC_WRITE, 0x18, "kfd_ioctl_map_memory_to_gpu_args"),
  "UNMAP_MEMORY_FROM_GPU": (IOC_READ | IOC_WRITE, 0x19, "kfd_ioctl_unmap_memory_from_gpu_args"),
  "RUNTIME_ENABLE": (IOC_READ | IOC_WRITE, 0x25, "kfd_ioctl_runtime_enable_args"),   # KFD >= 1.14
}
REQUEST = {name: ioc(d, nr, ffi.sizeof(f"struct {s}")) for name, (d, nr, s) in IOCTLS.items()}
NAME_OF_NR = {nr: name for name, (_, nr, _) in IOCTLS.items()}

# kfd_ioctl_create_queue_args.queue_type
QUEUE_TYPE_COMPUTE, QUEUE_TYPE_SDMA, QUEUE_TYPE_COMPUTE_AQL, QUEUE_TYPE_SDMA_XGMI = 0, 1, 2, 3
MAX_QUEUE_PERCENTAGE, MAX_QUEUE_PRIORITY, MIN_QUEUE_RING_SIZE = 100, 15, 1024

# event types and wait results
EVENT_SIGNAL, EVENT_HW_EXCEPTION, EVENT_MEMORY = 0, 3, 8
WAIT_COMPLETE, WAIT_TIMEOUT, WAIT_FAIL = 0, 1, 2
SIGNAL_EVENT_LIMIT = 4096

# kfd_ioctl_alloc_memory_of_gpu_args.flags
ALLOC_VRAM, ALLOC_GTT, ALLOC_USERPTR, ALLOC_DOORBELL, ALLOC_MMIO_REMAP = 1 << 0, 1 << 1, 1 << 2, 1 << 3, 1 << 4
ALLOC_WRITABLE, ALLOC_EXECUTABLE, ALLOC_PUBLIC, ALLOC_NO_SUBSTITUTE = 1 << 31, 1 << 30, 1 << 29, 1 << 28
ALLOC_AQL_QUEUE_MEM, ALLOC_COHERENT, ALLOC_UNCACHED = 1 << 27, 1 << 26, 1 << 25
ALLOC_KINDS = ALLOC_VRAM | ALLOC_GTT | ALLOC_USERPTR | ALLOC_DOORBELL | ALLOC_MMIO_REMAP

# kfd_ioctl_runtime_enable_args.mode_mask
RUNTIME_ENABLE_MODE_ENABLE_MASK, RUNTIME_ENABLE_MODE_TTMP_SAVE_MASK = 1, 2

# struct kfd_context_save_area_header (kfd_ioctl.h, interface 1.14): the first 40 bytes of a compute queue's
# context-save area, which user mode fills before CREATE_QUEUE (libhsakmt queues.c fill_cwsr_header). amdkfd reads
# err_payload_addr and err_event_id from it when a queue error reaches the runtime (kfd_process.c
# send_exception_work_handler: *err_payload |= KFD_EC_MASK(code), then kfd_set_event(err_event_id)).
CSA_CONTROL_STACK_OFFSET, CSA_CONTROL_STACK_SIZE, CSA_WAVE_STATE_OFFSET, CSA_WAVE_STATE_SIZE = 0, 4, 8, 12
CSA_DEBUG_OFFSET, CSA_DEBUG_SIZE, CSA_ERR_PAYLOAD_ADDR, CSA_ERR_EVENT_ID = 16, 20, 24, 32
# enum kfd_dbg_trap_exception_code (kfd_ioctl.h); KFD_EC_MASK(code) = 1 << (code - 1)
EXCEPTION_CODES = {1: "EC_QUEUE_WAVE_ABORT", 2: "EC_QUEUE_WAVE_TRAP", 3: "EC_QUEUE_WAVE_MATH_ERROR",
                   4: "EC_QUEUE_WAVE_ILLEGAL_INSTRUCTION", 5: "EC_QUEUE_WAVE_MEMORY_VIOLATION",
                   6: "EC_QUEUE_WAVE_APERTURE_VIOLATION", 16: "EC_QUEUE_PACKET_DISPATCH_DIM_INVALID",
                   17: "EC_QUEUE_PACKET_DISPATCH_GROUP_SEGMENT_SIZE_INVALID", 18: "EC_QUEUE_PACKET_DISPATCH_CODE_INVALID",
                   19: "EC_QUEUE_PACKET_RESERVED", 20: "EC_QUEUE_PACKET_UNSUPPORTED",
                   21: "EC_QUEUE_PACKET_DISPATCH_WORK_GROUP_SIZE_INVALID", 22: "EC_QUEUE_PACKET_DISPATCH_REGISTER_INVALID",
                   23: "EC_QUEUE_PACKET_VENDOR_UNSUPPORTED", 30: "EC_QUEUE_PREEMPTION_ERROR", 31: "EC_QUEUE_NEW"}
EC = {name: code for code, name in EXCEPTION_CODES.items()}


def ec_mask(code: int) -> int: return 1 << (code - 1)


def exception_names(payload: int) -> list[str]:
  """The exception codes set in a queue's error payload (bits KFD_EC_MASK(code))."""
  return [EXCEPTION_CODES.get(b + 1, f"exception code {b + 1}") for b in range(64) if payload >> b & 1]


# mem_banks/<n>/properties heap_type (kfd_topology.h HSA_MEM_HEAP_TYPE_*): a dGPU's VRAM bank is FB_PUBLIC when the
# host can map all of it (a large / resizable BAR), FB_PRIVATE when only part is CPU-visible (kfd_crat.c
# kfd_create_vcrat_image_gpu: local_mem_size_private != 0). amdkfd refuses VRAM|PUBLIC allocations then
# (kfd_chardev.c kfd_ioctl_alloc_memory_of_gpu: "Alloc host visible vram on small bar is not allowed", -EINVAL).
HEAP_TYPE_SYSTEM, HEAP_TYPE_FB_PUBLIC, HEAP_TYPE_FB_PRIVATE = 0, 1, 2


def new_args(name: str, **fields):
  """A zeroed argument struct for ioctl `name`, with `fields` filled in."""
  args = ffi.new(f"struct {IOCTLS[name][2]} *")
  for k, v in fields.items(): setattr(args, k, v)
  return args


def fields(args) -> dict:
  """{field: value} of an argument struct's scalar fields (for the ioctl trace and error messages)."""
  struct = ffi.typeof(args).item
  return {fname: getattr(args, fname) for fname, field in struct.fields if field.type.kind == "primitive"}
