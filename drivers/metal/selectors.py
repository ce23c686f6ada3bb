"""Every Objective-C message the Metal driver sends, as data: selector -> (return type, argument types after
(id self, SEL _cmd), ownership of an object result). drivers/metal/objc.py casts objc_msgSend to exactly that
prototype (on arm64 a variadic call would pass the arguments on the stack, where the method does not look).

Types are C spellings: NSUInteger is `unsigned long` (64-bit on every macOS target), NSInteger `long`, CFTimeInterval
`double`, BOOL stays `BOOL` (signed char on x86-64, bool on arm64: objc.py picks). MTLSize is {NSUInteger width,
height, depth}, NSRange {NSUInteger location, length}.

Ownership (Apple, "Advanced Memory Management Programming Guide", Memory Management Policy): a method whose name
begins with alloc, new, copy or mutableCopy returns an object the caller owns ("+1") and must release; every other
object result is "+0": valid until the innermost autorelease pool is drained, retained by whoever keeps it longer.
MTLCreateSystemDefaultDevice is a C function under the Create Rule: +1.

Sources (Apple Developer Documentation, framework Metal unless noted; the page named after each group):
"""
from __future__ import annotations
from typing import NamedTuple


class Signature(NamedTuple):
  restype: str
  argtypes: tuple[str, ...]
  owned: bool | None = None      # object results: True +1 (release it), False +0; None: not an object


def _s(restype: str, *argtypes: str) -> Signature:
  return Signature(restype, argtypes, None if restype != "id" else False)


def _new(*argtypes: str) -> Signature: return Signature("id", argtypes, True)


SELECTORS: dict[str, Signature] = {
  # Foundation, NSObject protocol: retain, release, autorelease; NSObject class: alloc, new, init
  "alloc": _new(), "new": _new(), "init": Signature("id", (), True),   # init consumes the alloc'ed receiver
  "retain": Signature("id", (), True), "release": _s("void"), "autorelease": _s("id"),
  "retainCount": _s("unsigned long"),
  # Foundation, NSString: stringWithUTF8String:, UTF8String, length; NSError: localizedDescription, code
  "stringWithUTF8String:": _s("id", "const char*"), "UTF8String": _s("const char*"), "length": _s("unsigned long"),
  "localizedDescription": _s("id"), "code": _s("long"),
  # MTLDevice
  "name": _s("id"), "newCommandQueue": _new(), "newSharedEvent": _new(),
  "newBufferWithLength:options:": _new("unsigned long", "unsigned long"),
  "newBufferWithBytesNoCopy:length:options:deallocator:": _new("void*", "unsigned long", "unsigned long", "id"),
  "newLibraryWithSource:options:error:": _new("id", "id", "id*"),
  "newComputePipelineStateWithDescriptor:options:reflection:error:": _new("id", "unsigned long", "id*", "id*"),
  "newIndirectCommandBufferWithDescriptor:maxCommandCount:options:": _new("id", "unsigned long", "unsigned long"),
  "maxThreadsPerThreadgroup": _s("MTLSize"), "maxBufferLength": _s("unsigned long"),
  "supportsFamily:": _s("BOOL", "long"), "hasUnifiedMemory": _s("BOOL"),
  # MTLBuffer (contents, length: MTLResource)
  "contents": _s("void*"),
  # MTLCompileOptions: fastMathEnabled
  "setFastMathEnabled:": _s("void", "BOOL"),
  # MTLLibrary: newFunctionWithName:
  "newFunctionWithName:": _new("id"),
  # MTLComputePipelineDescriptor: computeFunction, supportIndirectCommandBuffers
  "setComputeFunction:": _s("void", "id"), "setSupportIndirectCommandBuffers:": _s("void", "BOOL"),
  # MTLComputePipelineState
  "maxTotalThreadsPerThreadgroup": _s("unsigned long"), "threadExecutionWidth": _s("unsigned long"),
  # MTLCommandQueue: commandBuffer
  "commandBuffer": _s("id"),
  # MTLCommandBuffer: computeCommandEncoder, blitCommandEncoder, encodeSignalEvent:value:, encodeWaitForEvent:value:,
  # commit, waitUntilCompleted, status (MTLCommandBufferStatus), error, GPUStartTime, GPUEndTime, label
  "computeCommandEncoder": _s("id"), "blitCommandEncoder": _s("id"),
  "encodeSignalEvent:value:": _s("void", "id", "uint64_t"), "encodeWaitForEvent:value:": _s("void", "id", "uint64_t"),
  "commit": _s("void"), "waitUntilCompleted": _s("void"), "status": _s("unsigned long"), "error": _s("id"),
  "GPUStartTime": _s("double"), "GPUEndTime": _s("double"), "setLabel:": _s("void", "id"),
  # MTLCommandEncoder: endEncoding; MTLComputeCommandEncoder: setComputePipelineState:, setBuffer:offset:atIndex:,
  # setBytes:length:atIndex:, dispatchThreadgroups:threadsPerThreadgroup:, useResources:count:usage:,
  # executeCommandsInBuffer:withRange:
  "endEncoding": _s("void"), "setComputePipelineState:": _s("void", "id"),
  "setBuffer:offset:atIndex:": _s("void", "id", "unsigned long", "unsigned long"),
  "setBytes:length:atIndex:": _s("void", "const void*", "unsigned long", "unsigned long"),
  "dispatchThreadgroups:threadsPerThreadgroup:": _s("void", "MTLSize", "MTLSize"),
  "useResources:count:usage:": _s("void", "const id*", "unsigned long", "unsigned long"),
  "executeCommandsInBuffer:withRange:": _s("void", "id", "NSRange"),
  # MTLBlitCommandEncoder: copyFromBuffer:sourceOffset:toBuffer:destinationOffset:size:
  "copyFromBuffer:sourceOffset:toBuffer:destinationOffset:size:":
    _s("void", "id", "unsigned long", "id", "unsigned long", "unsigned long"),
  # MTLSharedEvent: signaledValue (MTLEvent), waitUntilSignaledValue:timeoutMS: (macOS 12)
  "signaledValue": _s("uint64_t"), "setSignaledValue:": _s("void", "uint64_t"),
  "waitUntilSignaledValue:timeoutMS:": _s("BOOL", "uint64_t", "uint64_t"),
  # MTLIndirectCommandBufferDescriptor: commandTypes, inheritBuffers, inheritPipelineState, maxKernelBufferBindCount
  "setCommandTypes:": _s("void", "unsigned long"), "setInheritBuffers:": _s("void", "BOOL"),
  "setInheritPipelineState:": _s("void", "BOOL"), "setMaxKernelBufferBindCount:": _s("void", "unsigned long"),
  # MTLIndirectCommandBuffer: indirectComputeCommandAtIndex: (owned by the buffer), size
  "indirectComputeCommandAtIndex:": _s("id", "unsigned long"), "size": _s("unsigned long"),
  # MTLIndirectComputeCommand: setKernelBuffer:offset:atIndex:, concurrentDispatchThreadgroups:threadsPerThreadgroup:,
  # setBarrier (setComputePipelineState: as above)
  "setKernelBuffer:offset:atIndex:": _s("void", "id", "unsigned long", "unsigned long"),
  "concurrentDispatchThreadgroups:threadsPerThreadgroup:": _s("void", "MTLSize", "MTLSize"),
  "setBarrier": _s("void"),
}

# Enumerations (Metal: MTLResourceOptions, MTLCommandBufferStatus, MTLIndirectCommandType, MTLResourceUsage, MTLGPUFamily)
RESOURCE_STORAGE_MODE_SHARED = 0 << 4        # MTLResourceStorageModeShared (storage mode at bit 4)
RESOURCE_HAZARD_TRACKING_DEFAULT = 0 << 8
STATUS = {0: "not enqueued", 1: "enqueued", 2: "committed", 3: "scheduled", 4: "completed", 5: "error"}
STATUS_COMPLETED, STATUS_ERROR = 4, 5
INDIRECT_COMMAND_CONCURRENT_DISPATCH = 1 << 5     # MTLIndirectCommandTypeConcurrentDispatch = 32
RESOURCE_USAGE_READ, RESOURCE_USAGE_WRITE = 1, 2
MAX_BUFFER_BINDINGS = 31                          # buffer argument table entries per compute function
GPU_FAMILY = {"Apple7": 1007, "Apple8": 1008, "Apple9": 1009, "Mac2": 2002, "Metal3": 5001}
