"""A progress bar for long work (BEAM search, compiling many kernels, replays): drawn on stderr only when
stderr is a terminal, and only once the work has run for `delay` seconds, so short work and logs stay clean.

    for item in progress(items, "compile"): ...
    with Progress(total=n, desc="replay") as bar: ...; bar.update(1, note="best 12.3 us")
"""
from __future__ import annotations
import sys, time


class Progress:
  def __init__(self, total: int | None = None, desc: str = "", delay: float = 0.5, file=None, enabled: bool | None = None,
               width: int = 30):
    self.total, self.desc, self.delay, self.width = total, desc, delay, width
    self.file = file if file is not None else sys.stderr
    self.enabled = _isatty(self.file) if enabled is None else enabled
    self.n, self.note = 0, ""
    self.start = self._last = time.perf_counter()
    self.drawn = False

  def update(self, n: int = 1, note: str | None = None) -> None:
    self.n += n
    if note is not None: self.note = note
    if not self.enabled: return
    now = time.perf_counter()
    if now - self.start < self.delay or (now - self._last < 0.1 and self.n != self.total): return
    self._last = now
    self.draw(now)

  def text(self, now: float | None = None) -> str:
    elapsed = (now or time.perf_counter()) - self.start
    if self.total:
      frac = min(1.0, self.n / self.total)
      fill = int(frac * self.width)
      eta = elapsed / self.n * (self.total - self.n) if self.n else 0.0
      body = f"[{'#' * fill}{'.' * (self.width - fill)}] {self.n}/{self.total} {elapsed:.1f}s eta {eta:.1f}s"
    else:
      body = f"{self.n} done {elapsed:.1f}s"
    return f"{self.desc + ' ' if self.desc else ''}{body}{' ' + self.note if self.note else ''}"

  def draw(self, now: float | None = None) -> None:
    self.file.write("\r\033[K" + self.text(now))
    self.file.flush()
    self.drawn = True

  def close(self) -> None:
    if self.drawn:
      self.draw()
      self.file.write("\n")
      self.file.flush()
      self.drawn = False

  def __enter__(self): return self
  def __exit__(self, *exc): self.close()


def progress(iterable, desc: str = "", total: int | None = None, **kw):
  """Iterate with a bar; when stderr is not a terminal this yields straight from the iterable."""
  if total is None:
    try: total = len(iterable)
    except TypeError: total = None
  bar = Progress(total, desc, **kw)
  if not bar.enabled:
    yield from iterable
    return
  try:
    for x in iterable:
      yield x
      bar.update(1)
  finally:
    bar.close()


def _isatty(f) -> bool:
  try: return f.isatty()
  except (AttributeError, ValueError): return False
