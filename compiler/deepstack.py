"""Run the compiler's recursive passes where deep graphs fit: a thread with a large stack.

The rewrite engine, rangeify and the linearizer recurse over the graph, and a kernel of decomposed transcendentals
or a long elementwise chain nests thousands of levels deep. Raising the interpreter's recursion limit for the
whole process would let any deep recursion (ours, json's, pickle's, the user's) overflow the C stack of a thread
with a small stack: a segfault instead of a RecursionError. So the limit stays as it is, and compiling runs on a
thread with a DEEP_STACK_BYTES stack (virtual memory, touched only as deep as it goes), with the limit raised only
while it runs (the limit is per process: another thread recursing past the usual limit at that very moment is not
stopped by it). Up to IDLE_KEPT such threads wait for the next call instead of one being started per call: a thread
start costs 0.1-5 ms on a busy machine, a handoff ~0.05 ms; the stack pages a deep compile touched stay with an idle
thread (a few MiB for a graph thousands of levels deep).

    plan = on_deep_stack(build_plan, sink)
"""
from __future__ import annotations
import contextlib, os, sys, threading

DEEP_STACK_BYTES = 256 << 20      # pages are committed only as deep as the recursion goes
DEEP_RECURSION_LIMIT = 100_000    # a level of the passes' recursion takes ~1-2 KB of C stack: this fits


class GraphTooDeep(RecursionError):
  """An expression graph deeper than the compiler's passes can walk, even on the deep stack."""


_local = threading.local()
_limit_lock = threading.Lock()
_deep_threads = 0                 # how many deep-stack threads run a job now (the limit is raised while any does)
_saved_limit = 0
_idle: list["_DeepThread"] = []   # deep-stack threads waiting for a job (a caller takes one, or starts one)
_idle_lock = threading.Lock()
IDLE_KEPT = 2                     # idle deep-stack threads kept for later calls (more concurrent callers: started anew)


class _DeepThread:
  """A thread with a DEEP_STACK_BYTES stack that runs one caller's job at a time and then waits for the next: a call
  hands it the job and waits (two lock handoffs, not a thread start of ~0.2-5 ms on a busy machine)."""

  def __init__(self):
    self.job = None
    self.ready = threading.Semaphore(0)      # a job was handed over
    self.done = threading.Semaphore(0)       # the job finished (its result is in self.result)
    self.result = None
    old_size = threading.stack_size(DEEP_STACK_BYTES)    # for the threads started from here on: set back below
    try:
      self.thread = threading.Thread(target=self._loop, name="baregrad-compile", daemon=True)
      self.thread.start()
    except RuntimeError as e:     # no memory for its stack
      raise GraphTooDeep(f"cannot start a compiler thread with a {DEEP_STACK_BYTES >> 20} MiB stack ({e})") from e
    finally:
      threading.stack_size(old_size)

  def _loop(self):
    _local.deep = True
    while True:
      self.ready.acquire()
      fn, args, lender = self.job
      self.job = None
      if fn is None: return         # not kept idle: this thread ends
      with lender.borrowed() if lender is not None else contextlib.nullcontext(): self.result = _run(fn, args)
      self.done.release()

  def call(self, fn, args, lender):
    self.job = (fn, args, lender)
    self.ready.release()
    self.done.acquire()
    result, self.result = self.result, None
    return result


def _run(fn, args):
  global _deep_threads, _saved_limit
  with _limit_lock:
    if _deep_threads == 0:
      _saved_limit = sys.getrecursionlimit()
      sys.setrecursionlimit(max(_saved_limit, DEEP_RECURSION_LIMIT))
    _deep_threads += 1
  try: return (True, fn(*args))
  except BaseException as e: return (False, e)
  finally:
    with _limit_lock:
      _deep_threads -= 1
      if _deep_threads == 0: sys.setrecursionlimit(_saved_limit)


def _after_fork_in_child():
  """A forked child has none of the parent's threads: no idle deep-stack thread is its own."""
  global _idle_lock, _limit_lock, _deep_threads
  _idle.clear()
  _idle_lock, _limit_lock, _deep_threads = threading.Lock(), threading.Lock(), 0


if hasattr(os, "register_at_fork"): os.register_at_fork(after_in_child=_after_fork_in_child)


def on_deep_stack(fn, *args):
  """fn(*args) on a deep-stack thread (inline when already on one); the caller waits for it. A caller holding the
  runtime lock (hcq/lock.py) lends it to the thread for the call."""
  if getattr(_local, "deep", False): return fn(*args)
  from baregrad.hcq.device import Device
  lender = Device.lock if Device.lock.held_by_current_thread() else None
  with _idle_lock: worker = _idle.pop() if _idle else None
  if worker is None: worker = _DeepThread()
  ok, value = worker.call(fn, args, lender)
  with _idle_lock:
    if len(_idle) < IDLE_KEPT: _idle.append(worker); worker = None
  if worker is not None: worker.job = (None, (), None); worker.ready.release()    # not kept: it ends
  if ok: return value
  if isinstance(value, RecursionError) and not isinstance(value, GraphTooDeep):
    raise GraphTooDeep("the expression graph is too deep to compile (a chain of very many ops): realize() an "
                       "intermediate result now and then, e.g. every 10000 steps of a loop") from value
  raise value
