"""Every C prototype the Metal driver casts objc_msgSend to (drivers/metal/selectors.py), sent at least once with a
checked result. On a Mac this is the check of the calling convention per signature that only the real thing gives
(arm64: struct results through x8 with no _stret, an MTLSize argument by reference, BOOL a bool; drivers/metal/
README.md): `python -m pytest -q tests/metal/test_metal_prototypes.py` there runs it on macOS's own frameworks. Here it
runs on the emulated framework (x86-64 SysV, objc_msgSend_stret), which keeps the test itself honest; either way a
prototype added to the table without a send here fails it."""
import mmap, struct, sys
import numpy as np
import pytest
from baregrad.drivers import settings
from baregrad.drivers.metal import framework, selectors

ON_MAC = sys.platform == "darwin"
with settings.override(EMU=0 if ON_MAC else 1): AVAILABLE, WHY = framework.available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=WHY)

SRC = """#include <metal_stdlib>
using namespace metal;
kernel void axpb(device float* out [[buffer(0)]], const device float* a [[buffer(1)]], constant long& k [[buffer(2)]],
                 uint3 gid [[thread_position_in_grid]]) {
  out[gid.x] = a[gid.x] * 2.0f + (float)k;
}
"""


def _shape(selector: str) -> tuple:
  sig = selectors.SELECTORS[selector]
  return sig.restype, sig.argtypes


def test_every_prototype_is_sent_with_a_checked_result():
  from baregrad.drivers.metal.objc import ObjC, NULL, addr, ffi
  with settings.override(EMU=0 if ON_MAC else 1): rt = ObjC(framework.frameworks())
  if not ON_MAC:
    from baregrad.drivers.emu.objc_runtime import runtime
    before = {o.addr for o in runtime().live()}
  sent: set[str] = set()
  def send(obj, selector, *args):
    sent.add(selector)
    return rt.send(obj, selector, *args)

  with rt.pool():
    dev = rt.call("MTLCreateSystemDefaultDevice")
    assert dev != NULL
    name = send(dev, "name")
    text = ffi.string(send(name, "UTF8String")).decode()                                 # const char* result
    assert text.startswith(("Apple", "AMD", "Intel", "Emulated")) and send(name, "length") == len(text)
    assert send(rt.cls("NSString"), "stringWithUTF8String:", "bare\u00e9".encode()) != NULL  # const char* argument
    assert send(dev, "hasUnifiedMemory") in (0, 1, True, False)
    assert send(dev, "supportsFamily:", selectors.GPU_FAMILY["Apple7"]) and not send(dev, "supportsFamily:", 424242)
    size = send(dev, "maxThreadsPerThreadgroup")                                        # MTLSize result (24 bytes)
    assert 1 <= size.depth <= size.height <= size.width <= 4096, (size.width, size.height, size.depth)
    assert send(dev, "maxBufferLength") >= 1 << 28

    # buffers: with a length, and over host pages (no copy)
    a, out = (send(dev, "newBufferWithLength:options:", 1024, selectors.RESOURCE_STORAGE_MODE_SHARED) for _ in range(2))
    assert send(a, "length") == 1024
    host = ffi.cast("float *", send(a, "contents"))
    for i in range(256): host[i] = i
    pages = mmap.mmap(-1, 16384)
    mapped = send(dev, "newBufferWithBytesNoCopy:length:options:deallocator:",
                  ffi.cast("void *", addr(ffi.from_buffer(pages))), 16384, 0, None)
    assert mapped != NULL and addr(send(mapped, "contents")) == addr(ffi.from_buffer(pages))

    # a library (an error out-parameter first), a function, a pipeline that ICBs may use
    options = rt.new("MTLCompileOptions")
    send(options, "setFastMathEnabled:", 0)
    error = rt.out()
    assert send(dev, "newLibraryWithSource:options:error:", rt.nsstring("kernel void broken("), options, error) == NULL
    assert error[0] != NULL and rt.string(send(error[0], "localizedDescription")) and isinstance(send(error[0], "code"), int)
    library = send(dev, "newLibraryWithSource:options:error:", rt.nsstring(SRC), options, error)
    assert library != NULL, rt.error_text(error[0])
    function = send(library, "newFunctionWithName:", rt.nsstring("axpb"))
    descriptor = rt.new("MTLComputePipelineDescriptor")
    send(descriptor, "setComputeFunction:", function)
    send(descriptor, "setSupportIndirectCommandBuffers:", 1)
    pipeline = send(dev, "newComputePipelineStateWithDescriptor:options:reflection:error:", descriptor, 0, None, error)
    assert pipeline != NULL, rt.error_text(error[0])
    assert send(pipeline, "maxTotalThreadsPerThreadgroup") >= 64 and send(pipeline, "threadExecutionWidth") >= 1

    # a direct dispatch with setBytes, then an ICB replay with a buffer of variables, a blit, events, GPU times
    queue, event = send(dev, "newCommandQueue"), send(dev, "newSharedEvent")
    send(event, "setSignaledValue:", 5)
    assert send(event, "signaledValue") == 5
    assert send(event, "waitUntilSignaledValue:timeoutMS:", 5, 10) and not send(event, "waitUntilSignaledValue:timeoutMS:", 6, 10)
    cb = send(queue, "commandBuffer")
    send(cb, "setLabel:", rt.nsstring("prototypes"))
    enc = send(cb, "computeCommandEncoder")
    send(enc, "setComputePipelineState:", pipeline)
    send(enc, "setBuffer:offset:atIndex:", out, 0, 0)
    send(enc, "setBuffer:offset:atIndex:", a, 0, 1)
    send(enc, "setBytes:length:atIndex:", ffi.new("long long *", 3), 8, 2)
    send(enc, "dispatchThreadgroups:threadsPerThreadgroup:", (4, 1, 1), (64, 1, 1))     # two MTLSize arguments
    send(enc, "endEncoding")
    send(cb, "encodeSignalEvent:value:", event, 7)
    cb2 = send(queue, "commandBuffer")
    send(cb2, "encodeWaitForEvent:value:", event, 7)
    icb_desc = rt.new("MTLIndirectCommandBufferDescriptor")
    send(icb_desc, "setCommandTypes:", selectors.INDIRECT_COMMAND_CONCURRENT_DISPATCH)
    send(icb_desc, "setInheritBuffers:", 0)
    send(icb_desc, "setInheritPipelineState:", 0)
    send(icb_desc, "setMaxKernelBufferBindCount:", 3)
    icb = send(dev, "newIndirectCommandBufferWithDescriptor:maxCommandCount:options:", icb_desc, 1, 0)
    assert send(icb, "size") == 1
    command = send(icb, "indirectComputeCommandAtIndex:", 0)
    variables = send(dev, "newBufferWithLength:options:", 256, 0)
    struct.pack_into("<q", ffi.buffer(ffi.cast("char *", send(variables, "contents")), 8), 0, 10)
    send(command, "setComputePipelineState:", pipeline)
    for i, buf in enumerate((out, out, variables)): send(command, "setKernelBuffer:offset:atIndex:", buf, 0, i)
    send(command, "concurrentDispatchThreadgroups:threadsPerThreadgroup:", (4, 1, 1), (64, 1, 1))
    send(command, "setBarrier")
    enc = send(cb2, "computeCommandEncoder")
    send(enc, "useResources:count:usage:", ffi.new("id[]", [out, variables]), 2,
         selectors.RESOURCE_USAGE_READ | selectors.RESOURCE_USAGE_WRITE)
    send(enc, "executeCommandsInBuffer:withRange:", icb, (0, 1))                         # NSRange by value
    send(enc, "endEncoding")
    blit = send(cb2, "blitCommandEncoder")
    send(blit, "copyFromBuffer:sourceOffset:toBuffer:destinationOffset:size:", out, 0, mapped, 64, 1024)
    send(blit, "endEncoding")
    for c in (cb, cb2): send(c, "commit")
    send(cb2, "waitUntilCompleted")
    assert send(cb, "status") == send(cb2, "status") == selectors.STATUS_COMPLETED, rt.error_text(send(cb2, "error"))
    assert send(cb2, "error") == NULL
    start, end = send(cb2, "GPUStartTime"), send(cb2, "GPUEndTime")                       # double results
    assert 0 < start <= end
    want = (np.arange(256, dtype=np.float32) * 2 + 3) * 2 + 10
    np.testing.assert_array_equal(np.frombuffer(pages, np.float32, 256, 64), want)

    # ownership: alloc/init/retain/autorelease/retainCount/release by Cocoa's rules
    obj = send(send(rt.cls("NSObject"), "alloc"), "init")
    assert send(send(obj, "retain"), "retainCount") >= 2
    send(obj, "autorelease")
    for o in (a, out, mapped, options, library, function, descriptor, pipeline, queue, event, icb_desc, icb, variables,
              obj, dev):
      send(o, "release")

  shapes = {_shape(s) for s in selectors.SELECTORS}
  missing = sorted(map(str, shapes - {_shape(s) for s in sent}))
  assert not missing, f"prototypes never sent here: {missing}"
  if not ON_MAC:   # and every object sent release was freed (the queue after its command buffers completed)
    assert not runtime().errors and not [o for o in runtime().live() if o.addr not in before], runtime().report()
