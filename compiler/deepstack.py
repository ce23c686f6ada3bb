"""Run the compiler's recursive passes where deep graphs fit: a thread with a large stack.

The rewrite engine, rangeify and the linearizer recurse over the graph, and a kernel of decomposed transcendentals
or a long elementwise chain nests thousands of levels deep. Raising the interpreter's recursion limit for the
whole process would let any deep recursion (ours, json's, pickle's, the user's) overflow the C stack of a thread
with a small stack: a segfault instead of a RecursionError. So the limit stays as it is, and compiling runs on a
thread of its own with a DEEP_STACK_BYTES stack (virtual memory, touched only as deep as it goes), with the limit
raised only while it runs (the limit is per process: another thread recursing past the usual limit at that very
moment is not stopped by it).

    plan = on_deep_stack(build_plan, sink)
"""
from __future__ import annotations
import contextlib, sys, threading

DEEP_STACK_BYTES = 256 << 20      # pages are committed only as deep as the recursion goes
DEEP_RECURSION_LIMIT = 100_000    # a level of the passes' recursion takes ~1-2 KB of C stack: this fits


class GraphTooDeep(RecursionError):
  """An expression graph deeper than the compiler's passes can walk, even on the deep stack."""


_local = threading.local()
_limit_lock = threading.Lock()
_deep_threads = 0                 # how many deep-stack threads run now (the limit is raised while any does)
_saved_limit = 0


def on_deep_stack(fn, *args):
  """fn(*args) on a deep-stack thread (inline when already on one); the caller waits for it. A caller holding the
  runtime lock (hcq/lock.py) lends it to the thread for the call."""
  if getattr(_local, "deep", False): return fn(*args)
  from baregrad.hcq.device import Device
  lender = Device.lock if Device.lock.held_by_current_thread() else None
  result: list = []

  def run():
    _local.deep = True
    with lender.borrowed() if lender is not None else contextlib.nullcontext(): _run()

  def _run():
    global _deep_threads, _saved_limit
    with _limit_lock:
      if _deep_threads == 0:
        _saved_limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(_saved_limit, DEEP_RECURSION_LIMIT))
      _deep_threads += 1
    try: result.append((True, fn(*args)))
    except BaseException as e: result.append((False, e))
    finally:
      with _limit_lock:
        _deep_threads -= 1
        if _deep_threads == 0: sys.setrecursionlimit(_saved_limit)

  old_size = threading.stack_size(DEEP_STACK_BYTES)    # for the threads started from here on: set back below
  try:
    thread = threading.Thread(target=run, name="baregrad-compile", daemon=True)
    thread.start()
  except RuntimeError as e:     # no memory for its stack
    raise GraphTooDeep(f"cannot start a compiler thread with a {DEEP_STACK_BYTES >> 20} MiB stack ({e})") from e
  finally:
    threading.stack_size(old_size)
  thread.join()
  ok, value = result[0]
  if ok: return value
  if isinstance(value, RecursionError) and not isinstance(value, GraphTooDeep):
    raise GraphTooDeep("the expression graph is too deep to compile (a chain of very many ops): realize() an "
                       "intermediate result now and then, e.g. every 10000 steps of a loop") from value
  raise value
