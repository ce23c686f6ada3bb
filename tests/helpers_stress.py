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


def run_threads(fn, args_list, timeout: float = 120) -> None:
  """fn(*args) on one thread per entry of args_list at once, the interpreter switching threads as often as it can
  (races show up within a few calls); returns once all are done."""
  import threading
  interval = sys.getswitchinterval()
  sys.setswitchinterval(1e-6)
  try:
    threads = [threading.Thread(target=fn, args=args) for args in args_list]
    for t in threads: t.start()
    for t in threads: t.join(timeout)
  finally:
    sys.setswitchinterval(interval)
