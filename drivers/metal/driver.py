"""The Metal driver: Apple GPUs through Metal.framework's Objective-C API, sent from Python via cffi (objc.py), with no
Swift, Objective-C or Metal-cpp compiled into the process. On macOS it opens the real frameworks; with EMU=1 the
emulated ones (framework.py is the seam; drivers/emu/metal_framework.py the emulation).

Memory: MTLBuffers in shared storage (unified memory): a buffer's `contents` is the address the host and hcq use.
Every address a command names is looked up in the table of buffers the driver made (or mapped with
newBufferWithBytesNoCopy), giving the (MTLBuffer, offset) pair Metal binds.

Programs: the MSL source is the binary; `load_program` builds a library from it (newLibraryWithSource:options:error:,
fast math off, as numpy's precision needs), the kernel's function, and a pipeline that indirect command buffers may
use (supportIndirectCommandBuffers).

Queues: two MTLCommandQueues ("compute" and "copy"). Each submission becomes command buffers: `exec` is a dispatch
in a compute encoder (buffers from the hcq kernel arguments, variables by setBytes), `copy` a blit (or a byte-copy
kernel where a blit's offsets and size are not multiples of 4), `barrier` ends the encoder. hcq's signals are 64-bit
values in memory, which Metal cannot write or wait on from a command buffer; the driver bridges them:
- `signal`: encodeSignalEvent on the queue's `progress` MTLSharedEvent with the next token; the completion thread
  writes the value into the signal's memory once the event reached that token.
- `wait`: encodeWaitForEvent on the queue's `gate` event with the next token; the completion thread raises the gate
  to that token once the signal's memory holds the value (whoever wrote it: the host, another queue, a device).
- `timestamp`: a command buffer boundary. Metal times whole command buffers (GPUStartTime/GPUEndTime, host seconds):
  the timestamp is the end of the command buffer before it, or the start of the one after it when none precedes.
The completion thread handles each queue's records in order, so a timestamp is in memory before a later signal.
A command buffer that ends in error is reported by `check_faults` (its signals are dropped: `queues_reset`).

JIT graphs (`bind`): the kernel launches become one MTLIndirectCommandBuffer (a concurrent-dispatch command with a
barrier per launch, variables in a buffer of their own, as ICB commands have no setBytes). A replay re-binds only the
kernel buffers whose address changed and executes each run of launches with executeCommandsInBuffer:withRange:,
after useResources:count:usage: for every buffer they touch (an ICB does not track its resources). On GPU families
before Apple9 (M1, M2) each pipeline of the run is first dispatched once with no threadgroups on the same encoder
(`zero_size_dispatch`): without it those GPUs crash in the ICB.
"""
from __future__ import annotations
import bisect, collections, re, struct, threading, time, weakref
from dataclasses import dataclass, field
import cffi
from .. import settings
from ..encoded import Encoded
from . import commands, framework
from .objc import ObjC, NULL, addr as objc_addr, ffi as objc_ffi
from .selectors import (STATUS, STATUS_COMPLETED, STATUS_ERROR, INDIRECT_COMMAND_CONCURRENT_DISPATCH, MAX_BUFFER_BINDINGS,
                        RESOURCE_STORAGE_MODE_SHARED, RESOURCE_USAGE_READ, RESOURCE_USAGE_WRITE, GPU_FAMILY)
from ..hostcopy import HostMemoryCopies

_ffi = cffi.FFI()
KINDS = ("compute", "copy")
# a constant-address-space buffer is bound at a multiple of 256 bytes on macOS (setBuffer:offset:atIndex:); the
# variables of ICB launches (`constant long&`) each get a slot that long
CONSTANT_ALIGN = 256
COPY_KERNEL = "bg_copy_bytes"
# the driver's own kernel: a copy whose offsets or size a blit does not take (not multiples of 4 on macOS)
BUILTIN_MSL = """#include <metal_stdlib>
using namespace metal;
kernel void bg_copy_bytes(device uchar* dst [[buffer(0)]], const device uchar* src [[buffer(1)]],
                          constant ulong& n [[buffer(2)]], uint3 gid [[thread_position_in_grid]]) {
  if (gid.x < n) dst[gid.x] = src[gid.x];
}
"""


class MetalError(RuntimeError):
  pass


class MetalCompileError(MetalError):
  pass


class CommandBufferError(MetalError):
  """A command buffer ended in error; later ones still run, this one's signals never come (hcq moves past them)."""
  queues_reset = True


class MetalTimeout(TimeoutError):
  pass


@dataclass(eq=False)
class MetalMemory:
  addr: int
  nbytes: int
  buffer: object           # the MTLBuffer (owned: +1)
  host_mapped: bool = False


@dataclass(eq=False)
class MetalProgram:
  name: str
  pipeline: object         # MTLComputePipelineState (owned)
  max_threads: int


@dataclass(eq=False)
class BoundQueue:
  words: list[int]
  icb: object = None                                  # MTLIndirectCommandBuffer (owned)
  variables: MetalMemory | None = None                # the launches' variables, CONSTANT_ALIGN bytes each
  var_offsets: list[int] = field(default_factory=list)
  bound: list[list] = field(default_factory=list)     # per launch: the (buffer address, offset) set at each index
  grids: list[tuple] = field(default_factory=list)    # per launch: the threadgroups its ICB command dispatches


class MetalDriver(HostMemoryCopies):     # copyin/copyout: plain copies (drivers/hostcopy.py)
  name = "METAL"
  target = "msl"                  # programs are MSL source; Metal compiles them for the GPU when they are loaded
  timestamp_hz = 1_000_000_000    # command buffer GPU times (seconds) written as nanoseconds
  has_copy_queue = True           # a second MTLCommandQueue for copies
  word_log = None                 # CAPTURE: a drivers/decode.py WordLog of the submitted command words

  def __init__(self, frameworks=None):
    self.fw = frameworks if frameworks is not None else framework.frameworks()
    self.rt = ObjC(self.fw)
    self._starts: list[int] = []
    self._memory: dict[int, MetalMemory] = {}
    self._programs: dict[int, MetalProgram] = {}
    self._bound = weakref.WeakSet()
    self._graveyard: list = []                                # bound queues' objects to release (_bury)
    self._lock = threading.Lock()
    self._records = {k: collections.deque() for k in KINDS}   # what the completion thread writes, in queue order
    self._gates = {k: collections.deque() for k in KINDS}     # (token, address, value) per queue
    # for dump_queues: per queue, command buffers committed and completed so far, and the submissions not known to be
    # complete: (the committed count at their end, their command words); a queue completes its buffers in order
    self._committed = {k: 0 for k in KINDS}
    self._completed = {k: 0 for k in KINDS}
    self._inflight = {k: collections.deque() for k in KINDS}
    self._tokens = {k: 0 for k in KINDS}
    self._gate_tokens = {k: 0 for k in KINDS}
    self._fault: str | None = None
    self._stalled = None
    self._closed = False
    with self.rt.pool():
      self.device = self.rt.call("MTLCreateSystemDefaultDevice")
      if self.device == NULL: raise MetalError("MTLCreateSystemDefaultDevice returned nil: this Mac has no Metal device")
      self.device_name = self.rt.string(self.rt.send(self.device, "name"))
      self.families = [f for f, v in GPU_FAMILY.items() if self.rt.send(self.device, "supportsFamily:", v)]
      # GPU families before Apple9 need each pipeline dispatched once on the encoder before an ICB runs it
      self.icb_pipeline_fix = "Apple9" not in self.families
      self.queues = {k: self.rt.send(self.device, "newCommandQueue") for k in KINDS}
      self.progress = {k: self.rt.send(self.device, "newSharedEvent") for k in KINDS}
      self.gate = {k: self.rt.send(self.device, "newSharedEvent") for k in KINDS}
    _, self.copy_kernel = self.load_program(BUILTIN_MSL.encode(), COPY_KERNEL)
    self._stop, self._wake = False, threading.Event()
    self._thread = threading.Thread(target=self._completions, name="METAL completions", daemon=True)
    self._thread.start()

  @classmethod
  def probe(cls) -> dict:
    ok, why = framework.available()
    if not ok: return {"available": False, "reason": why}
    found = {"available": True, "emulated": settings.EMU}
    if settings.EMU:
      found["runtime"] = "GCC libobjc4 + emulated Foundation and Metal classes (drivers/emu/metal_framework.py)"
      found["kernels"] = "MSL compiled as C++ against drivers/emu/metal_shim/metal_stdlib, run on the host"
    return found

  # ---- memory ----
  def alloc(self, nbytes: int) -> MetalMemory:
    buf = self.rt.send(self.device, "newBufferWithLength:options:", max(nbytes, 1), RESOURCE_STORAGE_MODE_SHARED)
    if buf == NULL: raise MemoryError(f"METAL: newBufferWithLength:{nbytes} returned nil (out of device memory)")
    return self._track(MetalMemory(objc_addr(self.rt.send(buf, "contents")), nbytes, buf))

  def _track(self, mem: MetalMemory) -> MetalMemory:
    bisect.insort(self._starts, mem.addr)
    self._memory[mem.addr] = mem
    return mem

  @property
  def emulated(self) -> bool:
    """Whether the frameworks are the emulated ones (EMU=1)."""
    return bool(self.fw.emulated)

  def alloc_args(self, nbytes: int):
    """Kernel arguments: memory like any other (hcq/driver.py)."""
    return self.alloc(nbytes)

  def alloc_polled(self, nbytes: int):
    """Memory the host polls (signals): see hcq/driver.py."""
    return self.alloc(nbytes)                 # shared storage: unified memory

  def free(self, mem: MetalMemory):
    if self._closed: return          # close() released every buffer
    self._starts.remove(mem.addr)
    del self._memory[mem.addr]
    self.rt.release(mem.buffer)      # command buffers still using it retain it until they complete

  def view(self, addr: int, nbytes: int):
    return _ffi.buffer(_ffi.cast("char *", addr), nbytes)


  def map_host(self, addr: int, nbytes: int):
    """Host pages as an MTLBuffer (newBufferWithBytesNoCopy: page-aligned memory, no copy)."""
    buf = self.rt.send(self.device, "newBufferWithBytesNoCopy:length:options:deallocator:", objc_ffi.cast("void *", addr),
                       nbytes, RESOURCE_STORAGE_MODE_SHARED, None)
    if buf == NULL: raise MetalError(f"METAL: newBufferWithBytesNoCopy of {nbytes} bytes at {addr:#x} returned nil")
    self._track(MetalMemory(addr, nbytes, buf, host_mapped=True))

  def _lookup(self, addr: int, nbytes: int = 0) -> tuple[MetalMemory, int]:
    i = bisect.bisect_right(self._starts, addr) - 1
    if i >= 0:
      mem = self._memory[self._starts[i]]
      if addr + nbytes <= mem.addr + max(mem.nbytes, 1): return mem, addr - mem.addr
    raise MetalError(f"METAL: {nbytes} bytes at {addr:#x} are not inside a buffer this driver allocated or mapped")

  def _u64(self, addr: int) -> int: return struct.unpack_from("<Q", self.view(addr, 8))[0]
  def _put_u64(self, addr: int, v: int): struct.pack_into("<Q", self.view(addr, 8), 0, v & (2**64 - 1))

  # ---- programs ----
  def compile(self, src: str) -> bytes:
    """The MSL source itself: Metal compiles it when the library is made (load_program)."""
    return src.encode()

  def load_program(self, binary: bytes, name: str) -> tuple[int, MetalProgram]:
    rt = self.rt
    with rt.pool():
      options = rt.new("MTLCompileOptions")
      rt.send(options, "setFastMathEnabled:", 0)
      error = rt.out()
      library = rt.send(self.device, "newLibraryWithSource:options:error:", rt.nsstring(binary.decode()), options, error)
      rt.release(options)
      if library == NULL: raise MetalCompileError(f"METAL: the Metal compiler rejected kernel {name}: {rt.error_text(error[0])}")
      function = rt.send(library, "newFunctionWithName:", rt.nsstring(name))
      if function == NULL:
        rt.release(library)
        raise MetalCompileError(f"METAL: the library has no kernel function named {name}")
      descriptor = rt.new("MTLComputePipelineDescriptor")
      rt.send(descriptor, "setComputeFunction:", function)
      rt.send(descriptor, "setSupportIndirectCommandBuffers:", 1)
      pipeline = rt.send(self.device, "newComputePipelineStateWithDescriptor:options:reflection:error:", descriptor, 0,
                         None, error)
      for obj in (descriptor, function, library): rt.release(obj)
      if pipeline == NULL: raise MetalCompileError(f"METAL: no pipeline for kernel {name}: {rt.error_text(error[0])}")
      program = MetalProgram(name, pipeline, rt.send(pipeline, "maxTotalThreadsPerThreadgroup"))
    self._programs[objc_addr(pipeline)] = program
    return objc_addr(pipeline), program

  def unload_program(self, handle: MetalProgram) -> None:
    """Release the pipeline (command buffers that use it retain it until they complete)."""
    if self._programs.pop(objc_addr(handle.pipeline), None) is not None and not self._closed: self.rt.release(handle.pipeline)

  def _program(self, entry: int) -> MetalProgram:
    found = self._programs.get(entry)
    if found is None: raise MetalError(f"METAL: exec of a program at {entry:#x} that is not loaded on this device")
    return found

  # ---- queues ----
  def encode(self, kind: str, cmds: list[tuple]) -> Encoded:
    """The command words (commands.py); no side effects."""
    if kind not in KINDS: raise ValueError(f"METAL: no {kind!r} queue (have {', '.join(KINDS)})")
    return commands.encode(cmds)

  def submit(self, kind: str, encoded: Encoded) -> None:
    if encoded.patches: raise MetalError(f"METAL {kind} queue: submit of commands with unresolved symbolic values")
    self._bury()
    if self.word_log is not None: self.word_log.add(kind, "metal", encoded.words, None)
    _Submission(self, kind, encoded.words).run(commands.decode(encoded.words), None)

  def bind(self, kind: str, encoded: Encoded) -> BoundQueue:
    """Keep the words for replays and build the indirect command buffer of their launches."""
    bound = BoundQueue(list(encoded.words))
    launches = [op for name, op in commands.decode(encoded.words) if name == "exec"]
    if not launches: return bound
    rt = self.rt
    bound.variables = self.alloc(CONSTANT_ALIGN * max(1, sum(op["variables"] for op in launches)))
    with rt.pool():
      descriptor = rt.new("MTLIndirectCommandBufferDescriptor")
      rt.send(descriptor, "setCommandTypes:", INDIRECT_COMMAND_CONCURRENT_DISPATCH)
      rt.send(descriptor, "setInheritBuffers:", 0)
      rt.send(descriptor, "setInheritPipelineState:", 0)
      rt.send(descriptor, "setMaxKernelBufferBindCount:", MAX_BUFFER_BINDINGS)
      bound.icb = rt.send(self.device, "newIndirectCommandBufferWithDescriptor:maxCommandCount:options:", descriptor,
                          len(launches), 0)
      rt.release(descriptor)
      offset = 0
      for i, op in enumerate(launches):
        program, grid, block = self._launch(op)
        command = rt.send(bound.icb, "indirectComputeCommandAtIndex:", i)
        rt.send(command, "setComputePipelineState:", program.pipeline)
        for j in range(op["variables"]):
          rt.send(command, "setKernelBuffer:offset:atIndex:", bound.variables.buffer, offset + CONSTANT_ALIGN * j,
                  op["buffers"] + j)
        grid = tuple(max(g, 1) for g in grid)    # (a symbolic width is 0 until a replay patches it: `indirect`)
        rt.send(command, "concurrentDispatchThreadgroups:threadsPerThreadgroup:", grid, block)
        rt.send(command, "setBarrier")
        bound.grids.append(grid)
        bound.var_offsets.append(offset)
        bound.bound.append([None] * op["buffers"])
        offset += CONSTANT_ALIGN * op["variables"]
    self._bound.add(bound)
    weakref.finalize(bound, self._release_bound, bound.icb, bound.variables)
    return bound

  def _release_bound(self, icb, variables: MetalMemory):
    """A graph's bound queue was collected (on whatever thread the collector ran): released by the next submit."""
    if not self._closed: self._graveyard.append((icb, variables))

  def _bury(self):
    while self._graveyard:
      icb, variables = self._graveyard.pop()
      self.rt.release(icb)
      self.free(variables)

  def submit_bound(self, kind: str, bound: BoundQueue, patch: list[tuple[int, int]]) -> None:
    for i, v in patch: bound.words[i] = v
    if self.word_log is not None: self.word_log.add(kind, "metal", bound.words, None)
    _Submission(self, kind, bound.words).run(commands.decode(bound.words), bound)

  def _launch(self, op: dict) -> tuple[MetalProgram, tuple, tuple]:
    program = self._program(op["pipeline"])
    grid = (op["grid_x"], op["grid_y"], op["grid_z"])
    block = (op["block_x"], op["block_y"], op["block_z"])
    if block[0] * block[1] * block[2] > program.max_threads:
      raise MetalError(f"METAL: kernel {program.name} launched with {block} threads per threadgroup; its pipeline takes "
                       f"at most {program.max_threads} (maxTotalThreadsPerThreadgroup)")
    if op["buffers"] + op["variables"] > MAX_BUFFER_BINDINGS:
      raise MetalError(f"METAL: kernel {program.name} takes {op['buffers']} buffers and {op['variables']} variables; "
                       f"a Metal kernel binds at most {MAX_BUFFER_BINDINGS} (split the kernel)")
    return program, grid, block

  def _arguments(self, op: dict) -> list[int]:
    n = op["buffers"] + op["variables"]
    return list(struct.unpack_from(f"<{n}Q", self.view(op["args"], 8 * n))) if n else []

  def wait_value(self, addr: int, value: int, timeout: float) -> bool:
    deadline, sleep = time.monotonic() + timeout, 1e-5
    while self._u64(addr) < value:
      if self._fault is not None: return False
      if time.monotonic() > deadline:
        self._stalled = (addr, value, timeout)
        return False
      time.sleep(sleep)
      sleep = min(sleep * 2, 5e-4)
    return True

  def check_faults(self, device_name: str) -> None:
    if self._fault is not None:
      fault, self._fault = self._fault, None
      raise CommandBufferError(f"{device_name}: {fault}")
    if self._stalled is not None:
      (addr, value, timeout), self._stalled = self._stalled, None
      with self._lock:
        gates = [f"{k} queue waits for [{a:#x}] >= {v} (memory holds {self._u64(a)})" for k in KINDS
                 for _, a, v in list(self._gates[k])[:1]]
      if gates: raise MetalTimeout(f"{device_name}: waited {timeout:.3g} s for [{addr:#x}] >= {value}; " + "; ".join(gates))

  def dump_queues(self) -> str:
    """Each queue's submissions whose command buffers have not all completed, their commands decoded (Metal has no
    ring the driver writes: a submission's words are turned into command buffers when it is submitted)."""
    from ..decode import decode as decode_words    # (only here: the decoder's tables stay out of import time)
    out = []
    with self._lock:
      state = {k: (self._committed[k], self._completed[k], list(self._inflight[k]), list(self._gates[k])) for k in KINDS}
    for kind, (committed, completed, inflight, gates) in state.items():
      pending = [(end, words) for end, words in inflight if end > completed]
      out.append(f"{kind} queue: {completed} of {committed} command buffers completed"
                 + "".join(f"; waits for [{a:#x}] >= {v} (memory holds {self._u64(a)})" for _, a, v in gates[:1])
                 + ("" if pending else ", nothing pending"))
      for end, words in pending:
        out.append(f"  a submission ending with command buffer {end}:")
        for line in decode_words("metal", words, None, None, "    "):     # a launch's pipeline by its kernel's name
          m = re.search(r"exec pipeline=(0x[0-9a-f]+)", line)
          program = self._programs.get(int(m.group(1), 16)) if m else None
          out.append(line.replace(" pipeline=", f" kernel {program.name}, pipeline=", 1) if program else line)
    return "\n".join(out)

  # ---- the completion thread: hcq signal and timestamp memory from Metal's events and command buffer times ----
  def _completions(self):
    sleep = 1e-5
    while not self._stop:
      with self._lock: busy = any(self._records.values()) or any(self._gates.values())
      if not busy:
        self._wake.wait(0.05)
        self._wake.clear()
        continue
      try:
        with self.rt.pool(): progressed, blocked_on = self._service()
      except Exception as e:          # a broken driver invariant: report it rather than hang the waiters
        self._fault, progressed, blocked_on = f"the completion thread stopped: {type(e).__name__}: {e}", False, None
        return
      if progressed: sleep = 1e-5; continue
      if blocked_on is not None and not any(self._gates.values()):
        with self.rt.pool(): self.rt.send(self.progress[blocked_on[0]], "waitUntilSignaledValue:timeoutMS:", blocked_on[1], 2)
      else:
        time.sleep(sleep)
        sleep = min(sleep * 2, 1e-3)

  def _service(self) -> tuple[bool, tuple | None]:
    rt, progressed, blocked_on = self.rt, False, None
    for kind in KINDS:
      with self._lock: gates, records = self._gates[kind], self._records[kind]
      while gates and self._u64(gates[0][1]) >= gates[0][2]:
        rt.send(self.gate[kind], "setSignaledValue:", gates.popleft()[0])
        progressed = True
      reached = None
      while records:
        record, cb = records[0][0], records[0][1]
        if record == "signal":
          if reached is None: reached = rt.send(self.progress[kind], "signaledValue")
          if reached < records[0][2]:
            if rt.send(cb, "status") == STATUS_ERROR: self._failed(kind, cb); progressed = True; continue
            blocked_on = blocked_on or (kind, records[0][2])
            break
          if records[0][3] is not None: self._put_u64(records[0][3], records[0][4])
        else:
          status = rt.send(cb, "status")
          if status < STATUS_COMPLETED: break
          if status == STATUS_ERROR: self._failed(kind, cb); progressed = True; continue
          if record == "time":
            seconds = rt.send(cb, "GPUStartTime" if records[0][2] == "start" else "GPUEndTime")
            self._put_u64(records[0][3], int(seconds * 1e9))
          else:                   # "done": the driver's reference since the submit
            rt.release(cb)
            self._completed[kind] += 1
        records.popleft()
        progressed = True
    return progressed, blocked_on

  def _failed(self, kind: str, cb):
    """A command buffer ended in error: remember why, drop its records (its signals never come), release it."""
    error = self.rt.send(cb, "error")
    text = self.rt.error_text(error)
    # a fault address in the error (the emulated GPU's account gives one; Metal's own errors do not): which buffer
    where = re.search(r"at address (0x[0-9a-f]+)", text)
    if where:
      try:
        mem, offset = self._lookup(int(where.group(1), 16))
        text += f" (in a buffer of {mem.nbytes} bytes at {mem.addr:#x}, offset {offset:#x})"
      except MetalError: text += " (in no buffer of this device)"
    self._fault = f"{kind} queue: a command buffer ended with status {STATUS[STATUS_ERROR]}: {text}"
    records = self._records[kind]
    while records and records[0][1] is cb: records.popleft()
    self.rt.release(cb)
    self._completed[kind] += 1

  # ---- lifetime ----
  def after_fork_in_child(self) -> bool:
    """False: Metal objects and the completion thread do not survive fork(); the child opens a new device."""
    return False

  def close(self) -> None:
    self._stop = True
    self._wake.set()
    self._thread.join(timeout=5)
    rt = self.rt
    with rt.pool():
      for kind in KINDS:
        for record in self._records[kind]:
          if record[0] == "done": rt.release(record[1])
        self._records[kind].clear()
      self._bury()
      for bound in list(self._bound):
        rt.release(bound.icb)
        self.free(bound.variables)
      for program in list(self._programs.values()): self.unload_program(program)
      for mem in list(self._memory.values()): self.free(mem)
      for obj in [*self.queues.values(), *self.progress.values(), *self.gate.values(), self.device]: rt.release(obj)
    self._closed = True


class _Submission:
  """Turns one submission's commands into command buffers on the queue of `kind` (see the module docstring)."""

  def __init__(self, driver: MetalDriver, kind: str, words: list):
    self.d, self.rt, self.kind, self.words = driver, driver.rt, kind, list(words)
    self.committed = 0          # command buffers this submission committed
    self.cb = None              # the open command buffer and whether anything was encoded in it
    self.work = False
    self.encoder, self.encoder_kind = None, None
    self.last = None            # the last command buffer committed by this submission
    self.starts: list[int] = [] # timestamps that take the next command buffer's start time
    self.records: list[tuple] = []
    self.gates: list[tuple] = []
    self.run_start, self.run_count, self.resources = 0, 0, {}
    self.pipelines: dict[int, tuple] = {}   # the run's pipelines: address -> (MetalProgram, arguments)

  def run(self, cmds: list[tuple[str, dict]], bound: BoundQueue | None):
    try:
      with self.rt.pool():
        # abandoned inside the pool: the encoder is autoreleased (+0), and draining the pool on the way out would
        # free it before abandon() ends it (a message to a deallocated instance, hiding the error being raised)
        try:
          launch = 0
          for name, op in cmds:
            if name == "exec" and bound is not None:
              self.indirect(bound, launch, op)
              launch += 1
              continue
            self.flush_indirect(bound)
            {"exec": self.exec, "copy": self.copy, "signal": self.signal, "wait": self.wait, "timestamp": self.timestamp,
             "barrier": self.barrier}[name](op)
          self.flush_indirect(bound)
          if self.starts and self.cb is None: self.open()
          if self.cb is not None:
            if not self.work: self.marker()
            self.close()
        except BaseException:
          self.abandon()
          raise
    finally:
      d = self.d
      with d._lock:
        d._gates[self.kind].extend(self.gates)
        d._records[self.kind].extend(self.records)
        if self.committed:
          d._committed[self.kind] += self.committed
          d._inflight[self.kind].append((d._committed[self.kind], self.words))
        inflight = d._inflight[self.kind]
        while inflight and inflight[0][0] <= d._completed[self.kind]: inflight.popleft()
      d._wake.set()

  def abandon(self):
    """A command failed to encode (a launch over Metal's limits): the command buffer being built is dropped,
    uncommitted, with what it recorded; the ones committed before it run and complete as usual."""
    if self.cb is None: return
    with self.rt.pool():
      if self.encoder is not None: self.rt.send(self.encoder, "endEncoding")
      self.rt.release(self.cb)
    self.records = [r for r in self.records if r[1] is not self.cb]
    self.encoder, self.encoder_kind, self.cb = None, None, None

  # ---- command buffers and encoders ----
  def open(self):
    self.cb = self.rt.retain(self.rt.send(self.d.queues[self.kind], "commandBuffer"))   # +0: kept until completion
    self.work = False
    self.records += [("time", self.cb, "start", a) for a in self.starts]
    self.starts = []

  def close(self):
    self.end_encoder()
    self.rt.send(self.cb, "commit")
    self.committed += 1
    self.records.append(("done", self.cb))
    self.last, self.cb = self.cb, None

  def encode(self, kind: str | None = None):
    """The open encoder of `kind` ("compute" or "blit"), or with None: no encoder open (events go between them)."""
    if self.cb is None: self.open()
    if self.encoder_kind == kind: return self.encoder
    self.end_encoder()
    if kind is not None:
      self.encoder = self.rt.send(self.cb, "computeCommandEncoder" if kind == "compute" else "blitCommandEncoder")
      self.encoder_kind, self.work = kind, True
    return self.encoder

  def end_encoder(self):
    if self.encoder is not None: self.rt.send(self.encoder, "endEncoding")
    self.encoder, self.encoder_kind = None, None

  def marker(self):
    """A progress token with no memory to write: a command buffer that holds nothing else still completes."""
    self.signal({"addr": None, "value": 0})

  # ---- commands ----
  def exec(self, op: dict):
    d, rt = self.d, self.rt
    program, grid, block = d._launch(op)
    args = d._arguments(op)
    enc = self.encode("compute")
    rt.send(enc, "setComputePipelineState:", program.pipeline)
    for i in range(op["buffers"]):
      mem, offset = d._lookup(args[i])
      rt.send(enc, "setBuffer:offset:atIndex:", mem.buffer, offset, i)
    for j in range(op["variables"]):
      rt.send(enc, "setBytes:length:atIndex:", objc_ffi.new("unsigned long long *", args[op["buffers"] + j]), 8,
              op["buffers"] + j)
    rt.send(enc, "dispatchThreadgroups:threadsPerThreadgroup:", grid, block)

  def copy(self, op: dict):
    n, d, rt = op["nbytes"], self.d, self.rt
    if n == 0: return
    (dst, doff), (src, soff) = d._lookup(op["dst"], n), d._lookup(op["src"], n)
    if (doff | soff | n) % 4 == 0:
      rt.send(self.encode("blit"), "copyFromBuffer:sourceOffset:toBuffer:destinationOffset:size:", src.buffer, soff,
              dst.buffer, doff, n)
      return
    enc = self.encode("compute")
    rt.send(enc, "setComputePipelineState:", d.copy_kernel.pipeline)
    rt.send(enc, "setBuffer:offset:atIndex:", dst.buffer, doff, 0)
    rt.send(enc, "setBuffer:offset:atIndex:", src.buffer, soff, 1)
    rt.send(enc, "setBytes:length:atIndex:", objc_ffi.new("unsigned long long *", n), 8, 2)
    rt.send(enc, "dispatchThreadgroups:threadsPerThreadgroup:", ((n + 255) // 256, 1, 1), (256, 1, 1))

  def signal(self, op: dict):
    self.encode(None)
    self.d._tokens[self.kind] += 1
    token = self.d._tokens[self.kind]
    self.rt.send(self.cb, "encodeSignalEvent:value:", self.d.progress[self.kind], token)
    self.work = True
    self.records.append(("signal", self.cb, token, op["addr"], op["value"]))

  def wait(self, op: dict):
    self.encode(None)
    self.d._gate_tokens[self.kind] += 1
    token = self.d._gate_tokens[self.kind]
    self.gates.append((token, op["addr"], op["value"]))
    self.rt.send(self.cb, "encodeWaitForEvent:value:", self.d.gate[self.kind], token)
    self.work = True

  def timestamp(self, op: dict):
    if self.cb is not None and self.work: self.close()
    if self.last is not None:     # the end of the command buffer before it (recorded before that one's "done")
      done = next(k for k, r in enumerate(self.records) if r[0] == "done" and r[1] is self.last)
      self.records.insert(done, ("time", self.last, "end", op["addr"]))
    else:
      self.starts.append(op["addr"])
      if self.cb is not None: self.records.append(("time", self.cb, "start", self.starts.pop()))

  def barrier(self, op: dict):
    self.end_encoder()    # encoders run one after the other; the resources they share are tracked

  # ---- JIT replays: runs of launches from the indirect command buffer ----
  def indirect(self, bound: BoundQueue, i: int, op: dict):
    d, rt = self.d, self.rt
    if self.run_count and self.run_start + self.run_count != i: self.flush_indirect(bound)
    args = d._arguments(op)
    nbuf = op["buffers"]
    self.pipelines.setdefault(op["pipeline"], (d._program(op["pipeline"]), nbuf + op["variables"]))
    for k in range(nbuf):
      mem, offset = d._lookup(args[k])
      self.resources[mem.addr] = mem
      if bound.bound[i][k] != (mem.addr, offset):
        command = rt.send(bound.icb, "indirectComputeCommandAtIndex:", i)
        rt.send(command, "setKernelBuffer:offset:atIndex:", mem.buffer, offset, k)
        bound.bound[i][k] = (mem.addr, offset)
    for j in range(op["variables"]): d._put_u64(bound.variables.addr + bound.var_offsets[i] + CONSTANT_ALIGN * j, args[nbuf + j])
    grid = (op["grid_x"], op["grid_y"], op["grid_z"])
    if grid != bound.grids[i]:     # a grid that depends on a Variable (hcq patched its word): the command is encoded again
      command = rt.send(bound.icb, "indirectComputeCommandAtIndex:", i)
      rt.send(command, "concurrentDispatchThreadgroups:threadsPerThreadgroup:", grid,
              (op["block_x"], op["block_y"], op["block_z"]))
      bound.grids[i] = grid
    if not self.run_count: self.run_start = i
    self.run_count += 1

  def flush_indirect(self, bound: BoundQueue | None):
    if bound is None or not self.run_count: return
    rt = self.rt
    enc = self.encode("compute")
    used = [m.buffer for m in self.resources.values()] + [bound.variables.buffer]
    rt.send(enc, "useResources:count:usage:", objc_ffi.new("id[]", used), len(used), RESOURCE_USAGE_READ | RESOURCE_USAGE_WRITE)
    if self.d.icb_pipeline_fix:
      for program, nargs in self.pipelines.values(): self.zero_size_dispatch(enc, program, nargs, bound.variables.buffer)
    rt.send(enc, "executeCommandsInBuffer:withRange:", bound.icb, (self.run_start, self.run_count))
    self.run_count, self.resources, self.pipelines = 0, {}, {}

  def zero_size_dispatch(self, enc, program: MetalProgram, nargs: int, any_buffer):
    """Before Apple9 (M1/M2) the GPU crashes running an ICB command whose pipeline the encoder has not used itself
    (../../shared/METAL.md section 1: tinygrad dispatches each pipeline once, with no threadgroups, first). Every
    argument index gets a buffer, as API validation wants for any dispatch; no thread reads it."""
    rt = self.rt
    rt.send(enc, "setComputePipelineState:", program.pipeline)
    for index in range(nargs): rt.send(enc, "setBuffer:offset:atIndex:", any_buffer, 0, index)
    rt.send(enc, "dispatchThreadgroups:threadsPerThreadgroup:", (0, 0, 0), (1, 1, 1))
