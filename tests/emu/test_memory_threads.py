"""The emulated GPUs' memory table under a host thread that maps and unmaps while a GPU thread reads (drivers/emu/
memory.py): every access sees one consistent table. Before, a GPU thread's mapping index could name the next
mapping's bytes once the host inserted a mapping below it (wrong values in a kernel, or an IndexError)."""
import sys, threading
import numpy as np
from baregrad.drivers.emu.memory import Memory


def test_reads_stay_right_while_the_host_maps_and_unmaps():
  mem = Memory()
  base = 0x10_0000_0000
  target = base + 0x100_0000
  mem.map_array(target, np.full(4096, 7, np.uint8))
  mem.map_array(target + 0x10000, np.full(4096, 9, np.uint8))     # a neighbour a stale index would land on
  addrs = np.arange(0, 4096, 4, dtype=np.uint64) + np.uint64(target)
  stop, errors = threading.Event(), []

  def reader():
    while not stop.is_set():
      got = mem.gather(addrs, 4)
      if not (got == 7).all(): errors.append(np.unique(got)); return
      if mem.read(target + 100, 4) != b"\x07" * 4: errors.append("read"); return

  t = threading.Thread(target=reader)
  interval = sys.getswitchinterval()
  sys.setswitchinterval(1e-6)          # switch threads often: inside an access, not only between them
  t.start()
  try:
    for i in range(3000):       # mappings below the target: each shifts its index in the table
      a = base + 0x1000 * (i % 64)
      mem.map_array(a, np.zeros(16, np.uint8))
      mem.unmap(a)
  finally:
    stop.set(); t.join()
    sys.setswitchinterval(interval)
  assert not errors, errors
  assert mem.mappings == 2
