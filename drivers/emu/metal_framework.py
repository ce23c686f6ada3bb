"""An emulated Metal.framework on the emulated Objective-C runtime (objc_runtime.py): the classes the Metal driver
sends messages to, whose command buffers run on a thread per command queue, kernels being the MSL source compiled as
C++ against the metal_stdlib shim (metal_shim.py). ../../shared/METAL.md section 4 is the design.

Classes: the public ones code creates itself (MTLCompileOptions, MTLComputePipelineDescriptor,
MTLIndirectCommandBufferDescriptor) keep Apple's names; the device's objects get private names, as Apple's do (AGX*):
MTLEmuDevice, ...CommandQueue, ...CommandBuffer, ...ComputeCommandEncoder, ...BlitCommandEncoder, ...Buffer,
...Library, ...Function, ...ComputePipelineState, ...SharedEvent, ...IndirectCommandBuffer, ...IndirectComputeCommand.

What Metal's API validation (MTL_DEBUG_LAYER) rejects is rejected here, at the call, as an exception the bridge
raises at the sender (objc_runtime.check); each rule names its Apple documentation page:
- encoders: one open at a time per command buffer, none after commit, ended before commit or an event;
  a buffer index below 31 (Metal feature set tables: 31 buffer arguments), setBytes up to 4 KiB (setBytes:length:
  atIndex: "Use this method for single-use data smaller than 4 KB"), an offset inside the buffer, every buffer the
  kernel declares bound at dispatch, threads per threadgroup at most maxTotalThreadsPerThreadgroup (1024).
- pipelines: a kernel's threadgroup memory at most maxThreadgroupMemoryLength (32 KiB: Metal feature set tables).
- blit copies: offsets and size multiples of 4 on macOS and inside both buffers
  (copyFromBuffer:sourceOffset:toBuffer:destinationOffset:size:).
- indirect command buffers: a pipeline made with supportIndirectCommandBuffers (MTLComputePipelineDescriptor),
  kernel buffer indices below maxKernelBufferBindCount, compute commands only with MTLIndirectCommandTypeConcurrent
  Dispatch, and every buffer an executed command uses made resident with useResource(s) (useResources:count:usage:
  "resources that you access indirectly"); on an emulated device of a GPU family before Apple9 (EmulatedMetal(
  apple_family=7 or 8)), an ICB command whose pipeline the encoder did not dispatch first fails the command buffer,
  standing for the GPU crash of M1/M2 that the driver's zero-size dispatches avoid.
- shared events only increase (MTLSharedEvent.signaledValue; a smaller host value is ignored, a GPU signal to a
  smaller value fails the command buffer).
Command buffers retain what they use until they complete (retainedReferences), the queue holds a committed one until
it is done, `commandBuffer` and encoders come back autoreleased: a driver that breaks Cocoa's rules leaks, crashes
into a zombie, or over-releases, and the runtime says which.
"""
from __future__ import annotations
import queue as queue_mod, re, threading, time
import cffi
from .objc_runtime import NSObject, NSString, NSError, ObjCError, objc, runtime, ffi
from . import metal_shim

MAX_THREADS_PER_THREADGROUP = 1024     # Apple7+ (Metal feature set tables: maximum threads per threadgroup)
MAX_THREADGROUP_MEMORY = 32768         # Apple4+ (Metal feature set tables: maximum total threadgroup memory allocation)
MAX_BUFFER_ARGUMENTS = 31
MAX_SET_BYTES = 4096
CONCURRENT_DISPATCH = 32               # MTLIndirectCommandTypeConcurrentDispatch
STORAGE_MODES = {0: "Shared", 16: "Managed", 32: "Private", 48: "Memoryless"}   # MTLResourceOptions bits 4-7
FAMILIES = {1001, 1002, 1003, 1004, 1005, 1006, 1007, 1008, 1009, 2002, 3001, 3002, 3003, 5001}   # up to Apple9, Metal3
APPLE9 = 1009                          # MTLGPUFamilyApple9 (M3); an emulated device may report an older Apple family
ELEMENT_SIZES = {"char": 1, "uchar": 1, "bool": 1, "short": 2, "ushort": 2, "half": 2, "int": 4, "uint": 4, "float": 4,
                 "long": 8, "ulong": 8}
PAGE = 16384                           # Apple silicon page size: newBufferWithBytesNoCopy needs page-aligned memory

_mem_ffi = cffi.FFI()
_mem_ffi.cdef("void *mmap(void *addr, size_t length, int prot, int flags, int fd, long offset);"
              "int munmap(void *addr, size_t length);")
_libc = _mem_ffi.dlopen(None)


class ValidationError(ObjCError):
  """What Metal's API validation layer reports."""


def _check(ok: bool, message: str):
  if not ok: raise ValidationError(message)


def _time() -> float:
  """CFTimeInterval host time in seconds (the clock of GPUStartTime/GPUEndTime: CACurrentMediaTime)."""
  return time.monotonic()


# ---------------------------------------------------------------- descriptors (public classes)

class MTLCompileOptions(NSObject):
  def __init__(self):
    super().__init__()
    self.fast_math = True        # Apple: fastMathEnabled defaults to YES

  @objc("setFastMathEnabled:", "void", "BOOL")
  def setFastMathEnabled_(self, v): self.fast_math = bool(v)


class MTLComputePipelineDescriptor(NSObject):
  def __init__(self):
    super().__init__()
    self.function, self.supports_icb = None, False

  @objc("setComputeFunction:", "void", "id")
  def setComputeFunction_(self, fn):
    if fn is not None: fn.retain()
    if self.function is not None: self.function.release()
    self.function = fn

  @objc("setSupportIndirectCommandBuffers:", "void", "BOOL")
  def setSupportIndirectCommandBuffers_(self, v): self.supports_icb = bool(v)

  def dealloc(self):
    if self.function is not None: self.function.release()


class MTLIndirectCommandBufferDescriptor(NSObject):
  def __init__(self):
    super().__init__()
    self.command_types, self.inherit_buffers, self.inherit_pipeline, self.max_bind = 0, True, True, 0

  @objc("setCommandTypes:", "void", "unsigned long")
  def setCommandTypes_(self, v): self.command_types = v

  @objc("setInheritBuffers:", "void", "BOOL")
  def setInheritBuffers_(self, v): self.inherit_buffers = bool(v)

  @objc("setInheritPipelineState:", "void", "BOOL")
  def setInheritPipelineState_(self, v): self.inherit_pipeline = bool(v)

  @objc("setMaxKernelBufferBindCount:", "void", "unsigned long")
  def setMaxKernelBufferBindCount_(self, v): self.max_bind = v


# ---------------------------------------------------------------- device objects

class MTLEmuBuffer(NSObject):
  def __init__(self):
    super().__init__()
    self.ptr, self.nbytes, self.mapped, self.owns = 0, 0, 0, True

  @objc("contents", "void*")
  def contents(self): return self.ptr

  @objc("length", "unsigned long")
  def length(self): return self.nbytes

  def dealloc(self):
    if self.owns: _libc.munmap(_mem_ffi.cast("void *", self.ptr), self.mapped)


class MTLEmuLibrary(NSObject):
  def __init__(self):
    super().__init__()
    self.compiled = None

  @objc("newFunctionWithName:", "id", "id")
  def newFunctionWithName_(self, name):
    _check(name is not None, "newFunctionWithName: nil name")
    if name.text not in self.compiled.kernels: return None
    return MTLEmuFunction.make(library=self.retain(), fn_name=name.text, signature=self.compiled.kernels[name.text])

  def dealloc(self): self.compiled.close()


class MTLEmuFunction(NSObject):
  @objc("name", "id")
  def name(self): return NSString.make(text=self.fn_name).autorelease()

  def dealloc(self): self.library.release()


class MTLEmuComputePipelineState(NSObject):
  @objc("maxTotalThreadsPerThreadgroup", "unsigned long")
  def maxTotalThreadsPerThreadgroup(self): return MAX_THREADS_PER_THREADGROUP

  @objc("threadExecutionWidth", "unsigned long")
  def threadExecutionWidth(self): return 32

  @objc("staticThreadgroupMemoryLength", "unsigned long")
  def staticThreadgroupMemoryLength(self): return self.threadgroup_memory

  def run(self, bindings: dict, grid: tuple, block: tuple):
    """Run the kernel on this (GPU) thread: `bindings` index -> ("buffer", MTLEmuBuffer, offset) | ("bytes", data)."""
    sig, keep, pointers = self.function.signature, [], []
    for index in range(max(sig.buffers, default=-1) + 1):
      b = bindings.get(index)
      if b is None: pointers.append(0)
      elif b[0] == "buffer": pointers.append(b[1].ptr + b[2])
      else:
        keep.append(ffi.from_buffer(b[1]))
        pointers.append(int(ffi.cast("uintptr_t", keep[-1])))
    self.function.library.compiled.run(sig.name, pointers, grid, block)

  def dealloc(self): self.function.release()


def _check_dispatch(pipeline, bindings: dict, grid: tuple, block: tuple, where: str):
  _check(pipeline is not None, f"{where}: no compute pipeline state set")
  name = pipeline.function.fn_name
  total = block[0] * block[1] * block[2]
  _check(total <= MAX_THREADS_PER_THREADGROUP and min(block) >= 1,
         f"{where} of {name}: threadsPerThreadgroup {block} ({total} threads) must be 1 ..{MAX_THREADS_PER_THREADGROUP} "
         "(maxTotalThreadsPerThreadgroup)")
  for index, p in pipeline.function.signature.buffers.items():
    _check(index in bindings, f"{where} of {name}: no buffer bound at index {index} ({p.ctype} {p.name})")
    if bindings[index][0] != "buffer": continue
    # setBuffer:offset:atIndex: "For buffers in the device address space, align the offset to the data type consumed
    # by the compute function ... For buffers in the constant address space, align the offset to 256 bytes in macOS."
    offset, constant = bindings[index][2], p.ctype.startswith("constant")
    align = 256 if constant else next((n for t, n in ELEMENT_SIZES.items() if re.search(rf"\b{t}\b", p.ctype)), 1)
    _check(offset % align == 0, f"{where} of {name}: buffer {index} ({p.ctype} {p.name}) is bound at offset {offset}, "
           f"which is not a multiple of {align}")


class MTLEmuSharedEvent(NSObject):
  def __init__(self):
    super().__init__()
    self.value, self.cond = 0, threading.Condition()

  @objc("signaledValue", "uint64_t")
  def signaledValue(self): return self.value

  @objc("setSignaledValue:", "void", "uint64_t")
  def setSignaledValue_(self, v):
    with self.cond:
      if v > self.value:          # only a larger value takes effect
        self.value = v
        self.cond.notify_all()

  @objc("waitUntilSignaledValue:timeoutMS:", "BOOL", "uint64_t", "uint64_t")
  def waitUntilSignaledValue_timeoutMS_(self, v, ms):
    with self.cond: return int(self.cond.wait_for(lambda: self.value >= v, ms / 1000))

  def gpu_signal(self, v):
    with self.cond:
      if v < self.value: raise RuntimeError(f"encodeSignalEvent: value {v} is below the event's {self.value} (events only increase)")
      self.value = v
      self.cond.notify_all()


class MTLEmuIndirectComputeCommand(NSObject):
  def __init__(self):
    super().__init__()
    self.icb, self.pipeline, self.bindings, self.grid, self.block, self.barrier = None, None, {}, None, None, False

  @objc("setComputePipelineState:", "void", "id")
  def setComputePipelineState_(self, p):
    _check(not self.icb.descriptor_inherit_pipeline, "indirect command: the ICB's descriptor inherits the pipeline state")
    _check(p is not None and p.supports_icb, "indirect command: the pipeline state was not created with "
           "supportIndirectCommandBuffers = YES (MTLComputePipelineDescriptor)")
    p.retain()
    if self.pipeline is not None: self.pipeline.release()
    self.pipeline = p

  @objc("setKernelBuffer:offset:atIndex:", "void", "id", "unsigned long", "unsigned long")
  def setKernelBuffer_offset_atIndex_(self, buf, offset, index):
    _check(index < self.icb.max_bind, f"setKernelBuffer: index {index} >= the ICB's maxKernelBufferBindCount "
           f"{self.icb.max_bind}")
    _check(buf is not None and offset <= buf.nbytes, f"setKernelBuffer: offset {offset} past the buffer's length")
    buf.retain()
    old = self.bindings.get(index)
    if old is not None: old[1].release()
    self.bindings[index] = ("buffer", buf, offset)

  @objc("concurrentDispatchThreadgroups:threadsPerThreadgroup:", "void", "MTLSize", "MTLSize")
  def concurrentDispatchThreadgroups_threadsPerThreadgroup_(self, grid, block):
    _check(self.icb.command_types & CONCURRENT_DISPATCH, "concurrentDispatchThreadgroups: the ICB was not made for "
           "MTLIndirectCommandTypeConcurrentDispatch")
    _check(self.pipeline is not None, "concurrentDispatchThreadgroups: set the compute pipeline state first")
    _check(block[0] * block[1] * block[2] <= MAX_THREADS_PER_THREADGROUP, f"concurrentDispatchThreadgroups: "
           f"threadsPerThreadgroup {block} exceeds {MAX_THREADS_PER_THREADGROUP}")
    self.grid, self.block = grid, block

  @objc("setBarrier", "void")
  def setBarrier(self): self.barrier = True

  def dealloc(self):
    if self.pipeline is not None: self.pipeline.release()
    for b in self.bindings.values(): b[1].release()


class MTLEmuIndirectCommandBuffer(NSObject):
  @objc("indirectComputeCommandAtIndex:", "id", "unsigned long")
  def indirectComputeCommandAtIndex_(self, i):
    _check(i < len(self.commands), f"indirectComputeCommandAtIndex: {i} >= maxCommandCount {len(self.commands)}")
    return self.commands[i]

  @objc("size", "unsigned long")
  def size(self): return len(self.commands)

  def dealloc(self):
    for c in self.commands: c.release()


# ---------------------------------------------------------------- queues, command buffers, encoders

class MTLEmuCommandQueue(NSObject):
  def start(self):
    self.work = queue_mod.Queue()
    self.thread = threading.Thread(target=self._gpu, name="emulated Metal queue", daemon=True)
    self.thread.start()

  @objc("commandBuffer", "id")
  def commandBuffer(self):
    return MTLEmuCommandBuffer.make(queue=self.retain(), commands=[], status=0, encoder=None, failure=None,
                                    start=0.0, end=0.0, done=threading.Event()).autorelease()

  def _gpu(self):
    """The queue's GPU: runs committed command buffers in order. It sends no message; only Python state changes."""
    while (cb := self.work.get()) is not None:
      cb.status, cb.start = 3, _time()
      try:
        for cmd in cb.commands: _execute(cmd)
        cb.status = 4
      except Exception as e:     # the command buffer fails; the queue goes on with the next one
        cb.failure, cb.status = f"{type(e).__name__}: {e}", 5
      cb.end = _time()
      cb.done.set()
      cb.release()                # the queue's hold since commit

  def dealloc(self):
    self.work.put(None)          # no command buffer holds the queue any more: nothing is pending
    if threading.current_thread() is not self.thread: self.thread.join()


def _execute(cmd: tuple):
  op = cmd[0]
  if op == "dispatch":
    if min(cmd[3]) > 0: cmd[1].run(cmd[2], cmd[3], cmd[4])
  elif op == "copy":
    _, src, soff, dst, doff, n = cmd
    _mem_ffi.memmove(_mem_ffi.cast("char *", dst.ptr + doff), _mem_ffi.cast("char *", src.ptr + soff), n)
  elif op == "signal": cmd[1].gpu_signal(cmd[2])
  elif op == "wait":
    with cmd[1].cond: cmd[1].cond.wait_for(lambda: cmd[1].value >= cmd[2])
  elif op == "icb":
    _, icb, (start, count), resident, dispatched = cmd
    for c in icb.commands[start:start + count]:
      if c.pipeline is None or c.grid is None: continue
      # Apple GPUs before Apple9 (M1, M2) crash in an ICB command whose pipeline the encoder did not dispatch itself
      # before (../../shared/METAL.md section 1, tinygrad's FIX_METAL_ICB): modelled as a GPU fault
      if icb.family < APPLE9 and c.pipeline.addr not in dispatched:
        raise RuntimeError(f"GPU fault in indirect command {icb.commands.index(c)} ({c.pipeline.function.fn_name}): on "
                           f"an Apple{icb.family - 1000} GPU (before Apple9) each pipeline an ICB runs must be dispatched "
                           "by the encoder first (a zero-size dispatch)")
      for index, b in c.bindings.items():
        if b[1].addr not in resident:
          raise RuntimeError(f"indirect command {icb.commands.index(c)} ({c.pipeline.function.fn_name}) uses a buffer at "
                             f"index {index} that was not made resident with useResource(s) in this encoder")
      _check_dispatch(c.pipeline, c.bindings, c.grid, c.block, "executeCommandsInBuffer")
      c.pipeline.run(c.bindings, c.grid, c.block)


class MTLEmuCommandBuffer(NSObject):
  def _encodable(self, what: str):
    _check(self.status == 0, f"{what}: the command buffer was already committed")
    _check(self.encoder is None, f"{what}: a command encoder is still encoding (call endEncoding first)")

  def keep(self, *objs):
    """Retain what a command uses until the command buffer is released (retainedReferences)."""
    for o in objs: o.retain()
    self.held = getattr(self, "held", []) + list(objs)

  @objc("computeCommandEncoder", "id")
  def computeCommandEncoder(self):
    self._encodable("computeCommandEncoder")
    self.encoder = MTLEmuComputeCommandEncoder.make(cb=self, pipeline=None, bindings={}, resident=set(), dispatched=set(),
                                                    ended=False)
    return self.encoder.autorelease()

  @objc("blitCommandEncoder", "id")
  def blitCommandEncoder(self):
    self._encodable("blitCommandEncoder")
    self.encoder = MTLEmuBlitCommandEncoder.make(cb=self, ended=False)
    return self.encoder.autorelease()

  @objc("encodeSignalEvent:value:", "void", "id", "uint64_t")
  def encodeSignalEvent_value_(self, event, value):
    self._encodable("encodeSignalEvent:value:")
    self.keep(event)
    self.commands.append(("signal", event, value))

  @objc("encodeWaitForEvent:value:", "void", "id", "uint64_t")
  def encodeWaitForEvent_value_(self, event, value):
    self._encodable("encodeWaitForEvent:value:")
    self.keep(event)
    self.commands.append(("wait", event, value))

  @objc("commit", "void")
  def commit(self):
    self._encodable("commit")
    self.status = 2
    self.retain()                 # the queue holds it until it completes
    self.queue.work.put(self)

  @objc("waitUntilCompleted", "void")
  def waitUntilCompleted(self):
    _check(self.status >= 2, "waitUntilCompleted on a command buffer that was not committed (it would never return)")
    self.done.wait()

  @objc("status", "unsigned long")
  def status_(self): return self.status

  @objc("error", "id")
  def error(self):
    if self.failure is None: return None
    return NSError.autoreleased("MTLCommandBufferErrorDomain", 1, f"command buffer failed: {self.failure}")

  @objc("GPUStartTime", "double")
  def GPUStartTime(self): return self.start if self.status >= 4 else 0.0

  @objc("GPUEndTime", "double")
  def GPUEndTime(self): return self.end if self.status >= 4 else 0.0

  @objc("setLabel:", "void", "id")
  def setLabel_(self, label): self.label = label.text if label is not None else ""

  def dealloc(self):
    for o in getattr(self, "held", []): o.release()
    self.queue.release()


class MTLEmuComputeCommandEncoder(NSObject):
  def _open(self, what: str): _check(not self.ended, f"{what}: the encoder's encoding has ended")

  @objc("setComputePipelineState:", "void", "id")
  def setComputePipelineState_(self, p):
    self._open("setComputePipelineState:")
    _check(p is not None, "setComputePipelineState: nil")
    self.pipeline = p

  @objc("setBuffer:offset:atIndex:", "void", "id", "unsigned long", "unsigned long")
  def setBuffer_offset_atIndex_(self, buf, offset, index):
    self._open("setBuffer:offset:atIndex:")
    _check(index < MAX_BUFFER_ARGUMENTS, f"setBuffer: index {index} >= {MAX_BUFFER_ARGUMENTS} buffer arguments")
    _check(buf is not None and offset <= buf.nbytes, f"setBuffer: offset {offset} past the end of the buffer "
           f"({buf.nbytes if buf is not None else 0} bytes)")
    self.bindings[index] = ("buffer", buf, offset)

  @objc("setBytes:length:atIndex:", "void", "const void*", "unsigned long", "unsigned long")
  def setBytes_length_atIndex_(self, ptr, n, index):
    self._open("setBytes:length:atIndex:")
    _check(index < MAX_BUFFER_ARGUMENTS, f"setBytes: index {index} >= {MAX_BUFFER_ARGUMENTS} buffer arguments")
    _check(n <= MAX_SET_BYTES, f"setBytes: {n} bytes; use a buffer for more than {MAX_SET_BYTES}")
    self.bindings[index] = ("bytes", bytes(ffi.buffer(ffi.cast("char *", ptr), n)))

  @objc("dispatchThreadgroups:threadsPerThreadgroup:", "void", "MTLSize", "MTLSize")
  def dispatchThreadgroups_threadsPerThreadgroup_(self, grid, block):
    self._open("dispatchThreadgroups:threadsPerThreadgroup:")
    _check_dispatch(self.pipeline, self.bindings, grid, block, "dispatchThreadgroups")
    bindings = dict(self.bindings)
    self.cb.keep(self.pipeline, *[b[1] for b in bindings.values() if b[0] == "buffer"])
    self.cb.commands.append(("dispatch", self.pipeline, bindings, grid, block))
    self.dispatched.add(self.pipeline.addr)

  @objc("useResources:count:usage:", "void", "const id*", "unsigned long", "unsigned long")
  def useResources_count_usage_(self, ptr, count, usage):
    self._open("useResources:count:usage:")
    ids = ffi.cast("id *", ptr)
    for i in range(count):
      buf = runtime().obj(ids[i], "useResources:count:usage:")
      self.resident.add(buf.addr)
      self.cb.keep(buf)

  @objc("executeCommandsInBuffer:withRange:", "void", "id", "NSRange")
  def executeCommandsInBuffer_withRange_(self, icb, rng):
    self._open("executeCommandsInBuffer:withRange:")
    _check(icb is not None and rng[0] + rng[1] <= len(icb.commands),
           f"executeCommandsInBuffer: range {rng} outside the ICB of {len(icb.commands) if icb else 0} commands")
    self.cb.keep(icb)
    self.cb.commands.append(("icb", icb, rng, frozenset(self.resident), frozenset(self.dispatched)))

  @objc("endEncoding", "void")
  def endEncoding(self):
    self._open("endEncoding")
    self.ended, self.cb.encoder = True, None


class MTLEmuBlitCommandEncoder(NSObject):
  @objc("copyFromBuffer:sourceOffset:toBuffer:destinationOffset:size:", "void", "id", "unsigned long", "id",
        "unsigned long", "unsigned long")
  def copy_(self, src, soff, dst, doff, n):
    _check(not self.ended, "copyFromBuffer: the encoder's encoding has ended")
    _check(src is not None and dst is not None, "copyFromBuffer: nil buffer")
    _check(soff % 4 == 0 and doff % 4 == 0 and n % 4 == 0, f"copyFromBuffer: on macOS the offsets ({soff}, {doff}) "
           f"and size ({n}) must be multiples of 4")
    _check(soff + n <= src.nbytes and doff + n <= dst.nbytes, f"copyFromBuffer: {n} bytes at {soff} -> {doff} exceed "
           f"the buffers ({src.nbytes}, {dst.nbytes} bytes)")
    self.cb.keep(src, dst)
    self.cb.commands.append(("copy", src, soff, dst, doff, n))

  @objc("endEncoding", "void")
  def endEncoding(self):
    _check(not self.ended, "endEncoding: the encoder's encoding has ended")
    self.ended, self.cb.encoder = True, None


class MTLEmuDevice(NSObject):
  def __init__(self):
    super().__init__()
    self.family = APPLE9         # the newest MTLGPUFamilyApple* it supports

  @objc("name", "id")
  def name(self): return NSString.make(text=f"Emulated Apple GPU (baregrad, Apple{self.family - 1000} family)").autorelease()

  @objc("newCommandQueue", "id")
  def newCommandQueue(self):
    q = MTLEmuCommandQueue.make()
    q.start()
    return q

  @objc("newSharedEvent", "id")
  def newSharedEvent(self): return MTLEmuSharedEvent.make()

  @objc("newBufferWithLength:options:", "id", "unsigned long", "unsigned long")
  def newBufferWithLength_options_(self, n, options):
    mode = options & 0xF0
    _check(mode == 0, f"newBufferWithLength: storage mode {STORAGE_MODES.get(mode, mode)}: the emulated device "
           "has unified memory and emulates MTLStorageModeShared only")
    mapped = (max(n, 1) + PAGE - 1) // PAGE * PAGE
    p = _libc.mmap(_mem_ffi.NULL, mapped, 3, 0x22, -1, 0)      # PROT_READ|WRITE, MAP_PRIVATE|ANONYMOUS
    if int(_mem_ffi.cast("intptr_t", p)) == -1: return None    # nil: no memory
    return MTLEmuBuffer.make(ptr=int(_mem_ffi.cast("uintptr_t", p)), nbytes=n, mapped=mapped)

  @objc("newBufferWithBytesNoCopy:length:options:deallocator:", "id", "void*", "unsigned long", "unsigned long", "id")
  def newBufferWithBytesNoCopy_(self, ptr, n, options, deallocator):
    _check(ptr % 4096 == 0 and n % 4096 == 0 and n > 0, f"newBufferWithBytesNoCopy: memory at 0x{ptr:x} of {n} bytes "
           "must be page-aligned and a whole number of pages")
    return MTLEmuBuffer.make(ptr=ptr, nbytes=n, mapped=n, owns=False)

  @objc("newLibraryWithSource:options:error:", "id", "id", "id", "id*")
  def newLibraryWithSource_options_error_(self, source, options, error_out):
    _check(source is not None, "newLibraryWithSource: nil source")
    fast = options.fast_math if options is not None else True
    try: compiled = metal_shim.Library(source.text, fast_math=fast)
    except metal_shim.ShimCompileError as e:
      if error_out: ffi.cast("id *", error_out)[0] = ffi.cast("id", NSError.autoreleased("MTLLibraryErrorDomain", 3, str(e)).addr)
      return None
    return MTLEmuLibrary.make(compiled=compiled)

  @objc("newComputePipelineStateWithDescriptor:options:reflection:error:", "id", "id", "unsigned long", "id*", "id*")
  def newComputePipelineStateWithDescriptor_(self, desc, options, reflection, error_out):
    if desc is None or desc.function is None:
      if error_out: ffi.cast("id *", error_out)[0] = ffi.cast("id", NSError.autoreleased(
        "CompilerError", 1, "the pipeline descriptor has no compute function").addr)
      return None
    fn = desc.function
    used = fn.library.compiled.threadgroup_memory[fn.fn_name]
    if used > MAX_THREADGROUP_MEMORY:   # the kernel's threadgroup declarations do not fit the threadgroup's memory
      if error_out: ffi.cast("id *", error_out)[0] = ffi.cast("id", NSError.autoreleased("CompilerError", 1,
        f"kernel {fn.fn_name} declares {used} bytes of threadgroup memory; the device has {MAX_THREADGROUP_MEMORY} "
        "(maxThreadgroupMemoryLength): use smaller threadgroup arrays").addr)
      return None
    return MTLEmuComputePipelineState.make(function=fn.retain(), supports_icb=desc.supports_icb, threadgroup_memory=used)

  @objc("newIndirectCommandBufferWithDescriptor:maxCommandCount:options:", "id", "id", "unsigned long", "unsigned long")
  def newIndirectCommandBufferWithDescriptor_(self, desc, count, options):
    _check(desc is not None and desc.command_types & CONCURRENT_DISPATCH, "newIndirectCommandBuffer: a compute ICB needs "
           "commandTypes MTLIndirectCommandTypeConcurrentDispatch")
    _check(desc.inherit_buffers or 1 <= desc.max_bind <= MAX_BUFFER_ARGUMENTS, "newIndirectCommandBuffer: "
           f"maxKernelBufferBindCount {desc.max_bind} must be 1 ..{MAX_BUFFER_ARGUMENTS}")
    icb = MTLEmuIndirectCommandBuffer.make(command_types=desc.command_types, max_bind=desc.max_bind,
                                           descriptor_inherit_pipeline=desc.inherit_pipeline, commands=[], family=self.family)
    icb.commands = [MTLEmuIndirectComputeCommand.make(icb=icb) for _ in range(count)]
    return icb

  @objc("maxThreadsPerThreadgroup", "MTLSize")
  def maxThreadsPerThreadgroup(self): return (1024, 1024, 1024)

  @objc("maxThreadgroupMemoryLength", "unsigned long")
  def maxThreadgroupMemoryLength(self): return MAX_THREADGROUP_MEMORY

  @objc("maxBufferLength", "unsigned long")
  def maxBufferLength(self): return 1 << 36

  @objc("supportsFamily:", "BOOL", "long")
  def supportsFamily_(self, family): return int(family in FAMILIES and not self.family < family <= APPLE9)

  @objc("hasUnifiedMemory", "BOOL")
  def hasUnifiedMemory(self): return 1


CLASSES = (MTLCompileOptions, MTLComputePipelineDescriptor, MTLIndirectCommandBufferDescriptor, MTLEmuBuffer,
           MTLEmuLibrary, MTLEmuFunction, MTLEmuComputePipelineState, MTLEmuSharedEvent, MTLEmuIndirectComputeCommand,
           MTLEmuIndirectCommandBuffer, MTLEmuCommandQueue, MTLEmuCommandBuffer, MTLEmuComputeCommandEncoder,
           MTLEmuBlitCommandEncoder, MTLEmuDevice)
_installed = threading.Lock()


class EmulatedMetal:
  """The emulated frameworks (drivers/metal/framework.py's seam): the runtime's symbols plus
  MTLCreateSystemDefaultDevice, which returns a new emulated device (+1: the Create Rule) of GPU family
  `apple_family` (7: M1 .. 9: M3; the default, 9, has no ICB crash to work around)."""
  emulated = True

  def __init__(self, apple_family: int = APPLE9 - 1000):
    if not 7 <= apple_family <= APPLE9 - 1000:
      raise ValueError(f"EmulatedMetal: apple_family {apple_family} is not emulated; use 7 (M1), 8 (M2) or 9 (M3)")
    self.family = 1000 + apple_family
    self.runtime = runtime()
    with _installed:
      for c in CLASSES: self.runtime.register(c)
    self._create = ffi.callback("id (*)(void)", self._create_device)

  def _create_device(self):
    return ffi.cast("id", MTLEmuDevice.make(family=self.family).addr)

  def symbol(self, name: str) -> int:
    if name == "MTLCreateSystemDefaultDevice": return int(ffi.cast("uintptr_t", self._create))
    return self.runtime.symbols()[name]

  def check(self) -> None: self.runtime.check()

  def report(self) -> str: return self.runtime.report()
