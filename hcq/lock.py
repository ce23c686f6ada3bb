"""The runtime lock: one process-wide re-entrant lock that serializes taking timeline values, submitting, scheduling
and capturing, so threads may realize tensors and call jitted functions at the same time (one at a time).

Its holder may lend it to a helper thread that it waits for: the compiler builds schedules on a thread with a deep
stack (compiler/deepstack.py) while the realizing thread waits, and what that thread does (BEAM's timed runs copy
into buffers) takes the lock again. A borrowing thread enters the lock without acquiring it; that is sound only
because the lender holds it and does nothing until the borrower is done.

    with runtime_lock: ...                    # any thread
    with runtime_lock.borrowed(): ...         # on a helper thread whose creator holds the lock and waits for it
"""
from __future__ import annotations
import contextlib, threading

_get_ident = threading.get_ident


class RuntimeLock:
  def __init__(self):
    self._lock = threading.RLock()
    self._owner: int | None = None     # ident of the thread holding it
    self._depth = 0
    self._borrow = threading.local()
    self._lent = 0                     # borrowed() blocks open now: while 0, no thread needs `_borrow` looked at
    self._lent_lock = threading.Lock()

  def held_by_current_thread(self) -> bool:
    return self._owner == threading.get_ident() or getattr(self._borrow, "lock", None) is self

  def acquire(self):
    if self._lent and getattr(self._borrow, "lock", None) is self: return
    self._lock.acquire()
    self._owner = _get_ident()
    self._depth += 1

  def release(self):
    if self._lent and getattr(self._borrow, "lock", None) is self: return
    self._depth -= 1
    if self._depth == 0: self._owner = None
    self._lock.release()

  def __enter__(self):
    self.acquire()
    return self

  def __exit__(self, *exc): self.release()

  @contextlib.contextmanager
  def borrowed(self):
    """On a helper thread: enter the lock freely inside the block (the creator holds it and waits)."""
    self._borrow.lock = self
    with self._lent_lock: self._lent += 1
    try: yield
    finally:
      with self._lent_lock: self._lent -= 1
      self._borrow.lock = None
