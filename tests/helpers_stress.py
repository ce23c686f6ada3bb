"""CPU contention for stress tests: races in helper threads and queues show up when every core is busy."""
import os, subprocess, sys


class busy_cores:
  """One process per core spinning for the duration of the block."""
  def __enter__(self):
    code = "import time\nend = time.time() + 300\nwhile time.time() < end: pass"
    self.procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(os.cpu_count() or 1)]
    return self

  def __exit__(self, *exc):
    for p in self.procs: p.kill()
    for p in self.procs: p.wait()
