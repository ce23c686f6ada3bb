"""KFD topology discovery through sysfs: which nodes are GPUs, their gfx target, CU/SIMD counts, LDS size, render node.

Layout (Linux drivers/gpu/drm/amd/amdkfd/kfd_topology.c): /sys/devices/virtual/kfd/kfd/topology/nodes/<n>/ holds
`gpu_id` (0 for CPU nodes) and `properties`, one `name value` pair per line (simd_count, lds_size_in_kb,
gfx_target_version = major*10000 + minor*100 + stepping, drm_render_minor, ...). Node sizes for the queues'
context-save area follow amdkfd/kfd_queue.c (kfd_queue_ctx_save_restore_size).
"""
from __future__ import annotations
from dataclasses import dataclass, field

TOPOLOGY = "/sys/devices/virtual/kfd/kfd/topology"
PAGE = 4096

# kfd_queue.c
SGPR_SIZE_PER_CU, LDS_SIZE_PER_CU, HWREG_SIZE_PER_CU = 0x4000, 0x10000, 0x1000
DEBUGGER_BYTES_ALIGN, DEBUGGER_BYTES_PER_WAVE, CONTEXT_SAVE_AREA_HEADER = 64, 32, 40


def _align(x: int, a: int) -> int: return (x + a - 1) // a * a


def parse_properties(text: str) -> dict[str, int]:
  props = {}
  for line in text.splitlines():
    parts = line.split()
    if len(parts) == 2:
      try: props[parts[0]] = int(parts[1])
      except ValueError: pass
  return props


@dataclass
class GPUNode:
  index: int
  gpu_id: int
  props: dict = field(default_factory=dict)
  heap_types: tuple = ()       # heap_type of each mem_banks/<n> (kfd.HEAP_TYPE_*: 1 FB_PUBLIC, 2 FB_PRIVATE)

  @property
  def large_bar(self) -> bool:
    """The host can map all of the VRAM (a large / resizable BAR): the VRAM bank is FB_PUBLIC, not FB_PRIVATE
    (kfd_crat.c kfd_create_vcrat_image_gpu). Without one, amdkfd refuses VRAM the host maps (PUBLIC)."""
    return 2 not in self.heap_types

  @property
  def gfx_version(self) -> int: return self.props["gfx_target_version"]
  @property
  def target(self) -> str:
    v = self.gfx_version
    return f"gfx{v // 10000}{(v // 100) % 100:x}{v % 100:x}"
  @property
  def render_node(self) -> str: return f"/dev/dri/renderD{self.props['drm_render_minor']}"
  @property
  def cu_count(self) -> int: return self.props["simd_count"] // self.props["simd_per_cu"] // max(self.props.get("num_xcc", 1), 1)
  @property
  def lds_bytes(self) -> int: return self.props["lds_size_in_kb"] * 1024

  # ---- context-save area (kfd_queue_ctx_save_restore_size) ----
  def _vgpr_size_per_cu(self) -> int:
    v = self.gfx_version
    if v in (90402, 90010, 90008, 90500): return 0x80000
    if v in (110000, 110001, 120000, 120001): return 0x60000
    return 0x40000

  def _wave_num(self) -> int:
    cu = self.cu_count
    if self.gfx_version < 100100:
      return min(cu * 40, self.props["array_count"] // self.props["simd_arrays_per_engine"] * 512)
    return cu * 32

  @property
  def ctl_stack_size(self) -> int:
    per_wave = 12 if self.gfx_version >= 100100 else 8
    size = _align(CONTEXT_SAVE_AREA_HEADER + self._wave_num() * per_wave + 8, PAGE)
    return min(size, 0x7000) if self.gfx_version // 10000 == 10 else size

  @property
  def cwsr_size(self) -> int:
    per_cu = self._vgpr_size_per_cu() + SGPR_SIZE_PER_CU + LDS_SIZE_PER_CU + HWREG_SIZE_PER_CU
    return self.ctl_stack_size + _align(self.cu_count * per_cu, PAGE)

  @property
  def debug_memory_size(self) -> int: return _align(self._wave_num() * DEBUGGER_BYTES_PER_WAVE, DEBUGGER_BYTES_ALIGN)

  @property
  def cwsr_total(self) -> int:
    """Bytes of the context-save BO a compute queue must map exactly (cwsr + debugger area, per XCC)."""
    return _align((self.cwsr_size + self.debug_memory_size) * max(self.props.get("num_xcc", 1), 1), PAGE)

  @property
  def eop_buffer_size(self) -> int: return 0x8000 if self.gfx_version == 80002 else 4096


def gpu_nodes(kernel) -> list[GPUNode]:
  """Every topology node with a nonzero gpu_id, read through the kernel interface (`exists`, `read_text`)."""
  nodes, i = [], 0
  while kernel.exists(f"{TOPOLOGY}/nodes/{i}"):
    base = f"{TOPOLOGY}/nodes/{i}"
    gpu_id = int(kernel.read_text(f"{base}/gpu_id").strip() or 0)
    if gpu_id:
      heaps, b = [], 0
      while kernel.exists(f"{base}/mem_banks/{b}/properties"):
        heaps.append(parse_properties(kernel.read_text(f"{base}/mem_banks/{b}/properties")).get("heap_type", 1))
        b += 1
      nodes.append(GPUNode(i, gpu_id, parse_properties(kernel.read_text(f"{base}/properties")), tuple(heaps)))
    i += 1
  return nodes


def pick_node(nodes: list[GPUNode], targets: tuple[str, ...]) -> GPUNode:
  """The first node whose gfx target is one of `targets`. KFD lists GPU nodes in PCI probe order and an APU's
  integrated GPU (a Ryzen 7000's gfx1036) is a node too, so the first node is not necessarily the one the programs
  are assembled for. ValueError naming every node when none fits."""
  for node in nodes:
    if node.props.get("gfx_target_version") and node.target in targets: return node
  have = ", ".join(f"node {n.index} {n.target if n.props.get('gfx_target_version') else '(no gfx target)'}" for n in nodes)
  raise ValueError(f"no KFD GPU node is a {' or '.join(targets)} (the targets baregrad assembles for); the topology "
                   f"has {have or 'no GPU node'}")
