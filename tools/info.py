"""`baregrad info`: every device baregrad knows, its versions and properties, or why it is unavailable.

Availability comes from `hcq.device.probe` (the driver class's `probe()`); the host facts
here (device nodes, kernel driver versions, CPU features) explain what the machine offers."""
from __future__ import annotations
import os, platform, re, sys
from pathlib import Path
from baregrad.drivers import settings

# the NVIDIA kernel driver series the NV driver is written against (TOOLCHAIN.md: 580.159.04)
NV_SUPPORTED_SERIES = ("580",)
ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
             "avx512_fp16", "amx_tile", "amx_bf16", "neon", "asimd", "sve")


def _read(path: str) -> str | None:
  try: return Path(path).read_text()
  except OSError: return None


def cpu_properties() -> dict:
  props: dict = {"machine": platform.machine(), "os": f"{platform.system()} {platform.release()}"}
  info = _read("/proc/cpuinfo") or ""
  if (m := re.search(r"^model name\s*:\s*(.+)$", info, re.M)): props["model"] = m.group(1).strip()
  flags = set()
  if (m := re.search(r"^(flags|Features)\s*:\s*(.+)$", info, re.M)): flags = set(m.group(2).split())
  props["isa_flags"] = " ".join(f for f in ISA_FLAGS if f in flags) or "(none of the listed)"
  props["cores"] = os.cpu_count()
  try: props["cores_usable"] = len(os.sched_getaffinity(0))
  except AttributeError: pass
  mem = _read("/proc/meminfo") or ""
  if (m := re.search(r"^MemTotal:\s*(\d+) kB", mem, re.M)): props["memory"] = f"{int(m.group(1)) / 2**20:.1f} GiB"
  try:
    from baregrad.drivers.cpu import cc
    path = cc.find_compiler()
    props["compiler"] = f"{path} ({cc.compiler_version(path)})"
    from baregrad.drivers.cpu.driver import KERNEL_FLAGS
    props["kernel_flags"] = " ".join(KERNEL_FLAGS)
  except Exception as e:
    props["compiler"] = f"unavailable: {e}"
  props["queue"] = "ring of 64-bit command packets run by a C command processor thread (drivers/cpu/worker.c)"
  return props


def amd_host() -> tuple[str | None, dict]:
  """(why not, properties) from /dev/kfd and the KFD topology in sysfs."""
  props = {}
  if not os.path.exists("/dev/kfd"): return "no /dev/kfd (the amdgpu kernel driver is not loaded, or there is no AMD GPU)", props
  if not os.access("/dev/kfd", os.R_OK | os.W_OK): return "/dev/kfd exists but is not readable and writable (add the user to the render group)", props
  version = _read("/sys/class/kfd/kfd/topology/system_properties") or ""
  gpus = []
  for node in sorted(Path("/sys/class/kfd/kfd/topology/nodes").glob("*")):
    text = _read(str(node / "properties")) or ""
    fields = dict(line.split(" ", 1) for line in text.splitlines() if " " in line)
    ver = int(fields.get("gfx_target_version", "0"))
    if ver == 0: continue
    gfx = f"gfx{ver // 10000}{(ver // 100) % 100:x}{ver % 100:x}"
    mem = 0
    for bank in node.glob("mem_banks/*/properties"):
      bank_fields = dict(line.split(" ", 1) for line in (_read(str(bank)) or "").splitlines() if " " in line)
      mem += int(bank_fields.get("size_in_bytes", "0"))
    cus = int(fields.get("simd_count", 0)) // max(1, int(fields.get("simd_per_cu", 1)))
    gpus.append(f"node {node.name}: {gfx}, {cus} CUs, {mem / 2**30:.1f} GiB")
  props["kfd"] = version.splitlines()[0] if version else "present"
  props["gpus"] = "; ".join(gpus) or "none found in the KFD topology"
  return None, props


def nv_host() -> tuple[str | None, dict]:
  props = {}
  if not os.path.exists("/dev/nvidiactl"): return "no /dev/nvidiactl (the NVIDIA kernel driver is not loaded, or there is no NVIDIA GPU)", props
  text = _read("/proc/driver/nvidia/version")
  if text is None: return "no /proc/driver/nvidia/version: cannot tell the NVIDIA driver version", props
  m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
  if m is None: return f"cannot read the driver version from /proc/driver/nvidia/version: {text.strip()[:80]!r}", props
  props["kernel_driver"] = m.group(0)
  if m.group(1) not in NV_SUPPORTED_SERIES:
    return (f"NVIDIA driver {m.group(0)} is unsupported: the RM ioctl structs are written for the "
            f"{', '.join(s + '.x' for s in NV_SUPPORTED_SERIES)} series"), props
  return None, props


def metal_host() -> tuple[str | None, dict]:
  if sys.platform != "darwin": return f"Metal needs macOS (this is {platform.system()})", {}
  return None, {"macos": platform.mac_ver()[0]}


HOST_CHECKS = {"AMD": amd_host, "NV": nv_host, "METAL": metal_host}


def emulated(kind: str) -> dict:
  """The emulated AMD/NV/METAL devices (EMU=1 DEV=AMD|NV|METAL): an emulated kernel driver registered in
  drivers/kernel.py's EMULATORS (METAL: the emulated framework in drivers/metal/framework.py's EMULATED), plus the
  hcq driver for that kind."""
  import importlib.util
  row = {"name": f"{kind} (emulated, EMU=1 DEV={kind})"}
  try: from baregrad.drivers.kernel import EMULATORS
  except Exception: EMULATORS = {}
  try: from baregrad.drivers.metal.framework import EMULATED    # METAL: an emulated framework, not a kernel driver
  except Exception: EMULATED = {}
  entry = EMULATORS.get(kind) or EMULATED.get(kind)
  if entry is None:
    return dict(row, available=False, reason=f"the emulated {kind} kernel driver is not part of this build yet")
  try: found = importlib.util.find_spec(entry[0]) is not None
  except (ImportError, ValueError): found = False
  if not found:
    return dict(row, available=False, reason=f"the emulated {kind} kernel driver ({entry[0]}) is not part of this build yet")
  from baregrad.hcq.device import probe
  with settings.override(EMU=1): driver = probe(kind)
  extra = {k: v for k, v in driver.items() if k not in ("name", "available", "reason")}
  if not driver["available"]:
    return dict(row, available=False, reason=f"emulator {entry[0]}.{entry[1]} present; {driver.get('reason', '')}", **extra)
  return dict(row, available=True, emulator=f"{entry[0]}.{entry[1]}", **extra)


def collect() -> list[dict]:
  from baregrad.hcq.device import DRIVERS, probe
  rows = []
  for name in DRIVERS:
    with settings.override(EMU=0): row = dict(probe(name))     # the real device; the emulated ones get rows below
    if name == "CPU":
      row.update(cpu_properties())
    elif name in HOST_CHECKS:
      why, props = HOST_CHECKS[name]()
      row.update(props)
      if why is not None:
        driver_reason = row.get("reason") if not row["available"] else None
        if not driver_reason: row["reason"] = why
        elif "not part of this build" in driver_reason: row["reason"] = f"{why}; {driver_reason}"
        # else: the driver's own probe() explains it best
        row["available"] = False
    rows.append(row)
  for kind in ("AMD", "NV", "METAL"): rows.append(emulated(kind))
  return rows


def render(rows: list[dict]) -> str:
  import numpy
  lines = [f"baregrad 0.1.0, Python {platform.python_version()}, numpy {numpy.__version__}, {platform.system()} "
           f"{platform.release()} {platform.machine()}", ""]
  for row in rows:
    state = "available" if row.get("available") else "unavailable"
    lines.append(f"{row['name']}: {state}")
    if not row.get("available"): lines.append(f"  reason: {row.get('reason', 'unknown')}")
    for k, v in row.items():
      if k in ("name", "available", "reason"): continue
      lines.append(f"  {k}: {v}")
    lines.append("")
  return "\n".join(lines).rstrip()
