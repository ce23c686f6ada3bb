"""Rules of the real amdgpu/amdkfd stack, each enforced by the emulated KFD + gfx1100 (drivers/emu/kfd_*.py) and
kept by the driver (drivers/amd/driver.py). Each driver-level test here fails with the driver's earlier behaviour.

  10. SDMA FENCE with MTYPE UC (sdma_v6_0_ring_emit_fence, amdgpu/sdma_v6_0.c: SDMA_PKT_FENCE_HEADER_MTYPE(0x3)):
      another MTYPE leaves the value in the GPU L2, which the host does not see until a GL2 write-back.
  11. HDP flush before a queue reads what the host wrote to VRAM (gfx_v11_0_ring_emit_hdp_flush, amdgpu/gfx_v11_0.c;
      sdma_v6_0_ring_emit_hdp_flush; registers of nbio_v4_3_get_hdp_flush_req/done_offset, amdgpu/nbio_v4_3.c).
  12. The event's slot is written before the interrupt: kfd_signal_event_interrupt (amdkfd/kfd_events.c) ignores an
      interrupt whose event slot still reads UNSIGNALED_EVENT_SLOT; the event page is a GTT BO user mode hands over with
      the first CREATE_EVENT (kfd_kmap_event_page).
  13. COMPUTE_PGM_RSRC1.PRIV is set by the CP (AMDGPUUsage compute_pgm_rsrc1: "CP is responsible for filling in
      COMPUTE_PGM_RSRC1.PRIV"; gfx11 context save/restore).
  14. WAIT_REG_MEM64 (no Linux code emits it for gfx11; IREE's AMDGPU HAL waits with it on gfx1100, validated on that
      hardware: iree-org/iree hal/drivers/amdgpu/physical_device_capabilities.c): no 32-bit WAIT_REG_MEM sequence is
      correct for 64-bit signals that grow by any step, so the driver keeps WAIT_REG_MEM64 in one form and the
      emulator accepts only that.
  A1. The PM4 engine writes its read pointer back as a 32-bit dword offset that wraps at the ring size (kfdtest
      PM4Queue.cpp RptrWhenConsumed; amdkfd kfd_kernel_queue.c kq_acquire_packet_buffer); SDMA as a 64-bit byte count.
  A7. A ring holds at most size - 1 dwords: rptr == wptr means empty (kfd_kernel_queue.c; kfdtest BaseQueue).
  A2. Without a large BAR amdkfd refuses host-visible (PUBLIC) VRAM (kfd_ioctl_alloc_memory_of_gpu) and the host
      cannot map other VRAM (NO_CPU_ACCESS, amdgpu_gem_object_mmap): the EOP buffer is device-only VRAM, the
      context-save area system memory, and on a small-BAR GPU what the host touches lives in GTT.
  A3. One kfd_process per process, alive until the process ends (kfd_process.c create_process; kfd_release only
      unrefs): a second ACQUIRE_VM with another render-node file is EBUSY, a second event page EINVAL, a second
      RUNTIME_ENABLE EBUSY; a device closed and opened again reuses them.
  A4. A user SDMA queue flushes the HDP with ROCr's firmware packet SDMA_PKT_HDP_FLUSH (sdma_registers.h); the register
      form of sdma_v6_0_ring_emit_hdp_flush is for amdgpu's privileged rings.
  A5. SDMA INDIRECT ends on an 8-dword ring boundary, its IB 32-byte aligned and padded to 8 dwords
      (sdma_v6_0_ring_emit_ib, sdma_v6_0_ring_pad_ib).
  A6. A compute queue's errors reach the process through the context-save-area header user mode fills
      (err_event_id, err_payload_addr: kfd_process.c send_exception_work_handler; libhsakmt fill_cwsr_header).
  A8. The GPU node is picked by gfx target: KFD lists GPU nodes in PCI probe order, an APU's iGPU among them.
  AR2. Ring and indirect buffers are allocated executable, as every reference does (kfdtest, ROCr, libhsakmt).
"""
import errno, re, time, types
import numpy as np
import pytest

from baregrad.drivers import settings
from baregrad.drivers.amd import kfd, pm4, sdma
from baregrad.drivers.amd.codeobj import RSRC1_PRIV

UNSIGNALED = 2**64 - 1                 # kfd_events.h UNSIGNALED_EVENT_SLOT


@pytest.fixture
def drv(monkeypatch):
  monkeypatch.setattr(settings, "EMU", True)   # what EMU=1 selects
  from baregrad.drivers.amd.driver import AMDDriver
  d = AMDDriver(timeout=10)
  yield d
  d.close()


def _sig(addr): return types.SimpleNamespace(addr=addr, timestamp_addr=addr + 8)


def _u64(drv, addr): return int(np.frombuffer(drv.view(addr, 8), np.uint64)[0])


def _set_u64(drv, addr, value): np.frombuffer(drv.view(addr, 8), np.uint64)[0] = value


def _engine(drv, ring): return drv.kernel.queues[ring.queue_id]


def _poll(done, timeout: float = 5.0) -> bool:
  deadline = time.monotonic() + timeout
  while not done() and time.monotonic() < deadline: time.sleep(0.001)
  return done()


def _wait_event(drv, event_id: int, timeout_ms: int) -> int:
  events = kfd.ffi.new("struct kfd_event_data[1]")
  events[0].event_id = event_id
  return drv._ioctl("WAIT_EVENTS", events_ptr=int(kfd.ffi.cast("uintptr_t", events)), num_events=1, wait_for_all=1,
                    timeout=timeout_ms).wait_result


def _stops(drv, kind: str, words: list, message: str):
  """Raw packets straight into the ring (no submit, so no HDP flush ahead of them): the queue must stop on them."""
  drv.ring_of(kind).write([words])
  assert _poll(lambda: drv.kernel.fault() is not None), f"the {kind} queue ran {words} without complaint"
  assert re.search(message, drv.kernel.fault()), drv.kernel.fault()


HAND_KERNEL = """
s_load_b64 s[4:5], s[0:1], 0x0
s_waitcnt lgkmcnt(0)
s_lshl_b32 s6, s2, 6
v_add_nc_u32 v3, s6, v0
v_mad_u32_u24 v2, v3, 3, 7
v_lshlrev_b32 v1, 2, v3
global_store_b32 v1, v2, s[4:5]
s_endpgm
"""


def _hand_program(drv, **kd_fields):
  from baregrad.compiler.amd.asm import assemble
  from baregrad.drivers.amd.codeobj import KernelDescriptor, write_code_object
  kd = KernelDescriptor.for_kernel(8, kernarg_size=8, workgroup_ids=1, workitem_dims=1, **kd_fields)
  co = write_code_object("hand", assemble(HAND_KERNEL), kd, 8)
  _, prog = drv.load_program(co, "hand")
  return types.SimpleNamespace(handle=prog, meta={}, name="hand", n_params=0)    # (as hcq.program.Program)


def _run_hand_kernel(drv):
  """Code, kernel arguments and output in VRAM, the arguments written by the host: (signal, output) memories."""
  p = _hand_program(drv)
  out, args, sig = drv.alloc(4 * 256), drv.alloc(64), drv.alloc(4096)
  assert all(m.domain == "vram" for m in (p.handle.memory, out, args))
  _set_u64(drv, args.addr, out.addr)
  drv.submit("compute", drv.encode("compute", [("exec", p, args.addr, (4, 1, 1), (64, 1, 1)), ("signal", _sig(sig.addr), 1)]))
  return sig, out


# ==== 10. SDMA FENCE MTYPE UC ========================================================================================

def test_copy_queue_signal_reaches_the_host(drv):
  """sdma_v6_0_ring_emit_fence writes fences uncached (MTYPE 3); the emulator keeps other MTYPEs in the GPU L2."""
  sig = drv.alloc(4096, "gtt")
  enc = drv.encode("copy", [("signal", _sig(sig.addr), 2**33 + 7)])
  drv.submit("copy", enc)
  assert drv.wait_value(sig.addr, 2**33 + 7, 3), f"the copy queue's signal never reached memory: {_u64(drv, sig.addr):#x}"
  fences = [sdma.decode(w, 0)[1] for w in enc.packet_words() if sdma.decode(w, 0)[0] == "FENCE"]
  assert fences and all(f["mtype"] == 3 for f in fences)


def test_emulated_l2_holds_a_cached_fence_until_written_back(drv):
  sig, flag = drv.alloc(4096, "gtt"), drv.alloc(4096, "gtt")
  fence = lambda addr, value, mtype: sdma.packet("FENCE", mtype=mtype, addr_lo=addr & 0xFFFFFFFF, addr_hi=addr >> 32, data=value)
  poll = sdma.packet("POLL_REGMEM", mem_poll=1, func=sdma.FUNC["=="], addr_lo=sig.addr & 0xFFFFFFFF, addr_hi=sig.addr >> 32,
                     value=5, mask=0xFFFFFFFF, interval=10, retry_count=0xFFF)
  # a NC (0) fence: the host does not see it, the SDMA engine's own poll does (it reads through the L2)
  drv.copy.write([fence(sig.addr, 5, 0), poll, fence(flag.addr, 1, 3)])
  assert _poll(lambda: _u64(drv, flag.addr) == 1) and drv.kernel.fault() is None
  time.sleep(0.05)
  assert _u64(drv, sig.addr) == 0
  # a GL2 write-back (the compute queue's barrier: ACQUIRE_MEM GCR_CNTL GL2_WB) writes the line to memory
  drv.submit("compute", drv.encode("compute", [("barrier",)]))
  assert _poll(lambda: _u64(drv, sig.addr) == 5)
  # an uncached fence is in memory at once
  drv.copy.write([fence(sig.addr, 9, 3)])
  assert _poll(lambda: _u64(drv, sig.addr) == 9)


# ==== 11. HDP flush ==================================================================================================

def test_dispatch_reading_host_written_vram_runs(drv):
  """Kernel arguments and code are host writes to VRAM; the submission's HDP flush makes them the GPU's."""
  sig, out = _run_hand_kernel(drv)
  ok = drv.wait_value(sig.addr, 1, 5)
  assert ok and drv.kernel.fault() is None, drv.kernel.fault()
  assert (np.frombuffer(drv.view(out.addr, 1024), np.uint32) == np.arange(256) * 3 + 7).all()
  assert _engine(drv, drv.compute).history[0] == "WAIT_REG_MEM"          # the HDP flush came first


def test_copy_from_host_written_vram_runs(drv):
  src, dst, sig = drv.alloc(4096), drv.alloc(4096, "gtt"), drv.alloc(4096, "gtt")
  np.frombuffer(drv.view(src.addr, 4096), np.uint8)[:] = 0x5A
  drv.submit("copy", drv.encode("copy", [("copy", dst.addr, src.addr, 4096), ("signal", _sig(sig.addr), 1)]))
  assert drv.wait_value(sig.addr, 1, 5) and drv.kernel.fault() is None, drv.kernel.fault()
  assert (np.frombuffer(drv.view(dst.addr, 4096), np.uint8) == 0x5A).all()


def test_emulator_refuses_a_vram_read_without_hdp_flush(drv):
  src, dst = drv.alloc(4096), drv.alloc(4096, "gtt")
  copy = sdma.copy_linear_packets(dst.addr, src.addr, 64)[0]
  _stops(drv, "copy", copy, rf"COPY_LINEAR's source reads VRAM at {src.addr:#x} .*with no HDP flush since the doorbell")


def test_emulator_takes_the_flush_then_the_read(drv):
  src, dst = drv.alloc(4096), drv.alloc(4096, "gtt")
  np.frombuffer(drv.view(src.addr, 64), np.uint8)[:] = 7
  drv.copy.write([drv.hdp_flush("copy"), sdma.copy_linear_packets(dst.addr, src.addr, 64)[0]])
  assert _poll(lambda: drv.copy.idle()) and drv.kernel.fault() is None, drv.kernel.fault()
  assert (np.frombuffer(drv.view(dst.addr, 64), np.uint8) == 7).all()
  # a GTT source needs no flush (system memory, no HDP): straight after a new doorbell
  drv.copy.write([sdma.copy_linear_packets(src.addr, dst.addr, 64)[0]])
  assert _poll(lambda: drv.copy.idle()) and drv.kernel.fault() is None, drv.kernel.fault()


def test_emulator_checks_the_hdp_flush_handshake(drv):
  bad = list(drv.hdp_flush("compute"))
  bad[5] = 0x3                                  # mask != reference: DONE & mask never equals the reference
  _stops(drv, "compute", bad, r"HDP flush with function 3, reference 0x3fc, mask 0x3")


def test_emulator_refuses_wait_reg_mem_on_other_registers(drv):
  words = list(drv.hdp_flush("compute"))
  words[2] = 0x1234
  _stops(drv, "compute", words, r"only the HDP flush \(GPU_HDP_FLUSH_REQ 0xe26, GPU_HDP_FLUSH_DONE 0xe27\) is emulated")


# ==== 12. event slot before the interrupt ============================================================================

@pytest.mark.parametrize("kind", ["compute", "copy"])
def test_signal_interrupt_sets_the_event(drv, kind):
  """The queue writes the event's slot, then interrupts: amdkfd sets the event (WAIT_EVENTS returns at once) and resets
  the slot to UNSIGNALED (acknowledge_signal)."""
  sig = drv.alloc(4096, "gtt")
  drv.submit(kind, drv.encode(kind, [("signal", _sig(sig.addr), 3)]))
  assert _poll(lambda: _u64(drv, sig.addr) == 3)
  assert _wait_event(drv, drv.queue_event, 2000) == kfd.WAIT_COMPLETE
  assert _u64(drv, drv.queue_event_slot) == UNSIGNALED


def test_event_page_is_the_drivers_gtt_bo(drv):
  k = drv.kernel
  assert k.signal_handle == drv.event_page.handle and drv.event_page.domain == "gtt"
  assert drv.event_page.size >= kfd.SIGNAL_EVENT_LIMIT * 8
  assert 1 <= k.events[drv.queue_event].slot < kfd.SIGNAL_EVENT_LIMIT        # id 0 is kfd_event_init_process's
  # kfd_ioctl_free_memory_of_gpu: "Free signal BO is not allowed" (-EPERM)
  with pytest.raises(OSError) as e: drv._ioctl("FREE_MEMORY_OF_GPU", handle=drv.event_page.handle)
  assert e.value.errno == errno.EPERM
  # kfd_kmap_event_page: "Event page is already set" (-EINVAL)
  other = drv.alloc(kfd.SIGNAL_EVENT_LIMIT * 8, "gtt")
  with pytest.raises(OSError) as e:
    drv._ioctl("CREATE_EVENT", event_type=kfd.EVENT_SIGNAL, auto_reset=1, event_page_offset=other.handle)
  assert e.value.errno == errno.EINVAL


def test_emulated_kfd_ignores_an_interrupt_whose_slot_is_unsignaled(drv):
  k = drv.kernel
  k.signal_interrupt(drv.queue_event, 32)                                    # slot still UNSIGNALED: ignored
  assert _wait_event(drv, drv.queue_event, 0) == kfd.WAIT_TIMEOUT
  _set_u64(drv, drv.queue_event_slot, 1)
  k.signal_interrupt(drv.queue_event, 32)
  assert _wait_event(drv, drv.queue_event, 0) == kfd.WAIT_COMPLETE
  assert _u64(drv, drv.queue_event_slot) == UNSIGNALED
  # a wrong id falls back to the exhaustive search over written slots (kfd_signal_event_interrupt)
  _set_u64(drv, drv.queue_event_slot, 1)
  k.signal_interrupt(0x0FFF_FFFF, 28)
  assert _wait_event(drv, drv.queue_event, 0) == kfd.WAIT_COMPLETE


def test_kernel_allocated_event_page_is_not_gpu_memory(monkeypatch):
  """Without a user event page amdkfd allocates one the GPU cannot write (a dGPU maps only user BOs)."""
  monkeypatch.setattr(settings, "EMU", True)
  from baregrad.drivers.emu.kfd_kernel import EmulatedKFD, GPU_ID, RENDER_MINOR
  k = EmulatedKFD()
  fd, drm = k.open("/dev/kfd"), k.open(f"/dev/dri/renderD{RENDER_MINOR}")
  try:
    args = kfd.new_args("ACQUIRE_VM", drm_fd=drm, gpu_id=GPU_ID)
    k.ioctl(fd, kfd.REQUEST["ACQUIRE_VM"], args)
    ev = kfd.new_args("CREATE_EVENT", event_type=kfd.EVENT_SIGNAL, auto_reset=1)
    k.ioctl(fd, kfd.REQUEST["CREATE_EVENT"], ev)
    assert ev.event_slot_index == ev.event_id == 1 and k.mapping_of(int(k.event_page.ctypes.data)) is None
    assert k.signal_mapped_size == 256 * 8                   # "Oldest user mode expects 256 event slots"
  finally:
    k.close(drm); k.close(fd)


# ==== 13. COMPUTE_PGM_RSRC1.PRIV =====================================================================================

def test_dispatch_sets_priv(drv):
  sig, out = _run_hand_kernel(drv)
  assert drv.wait_value(sig.addr, 1, 5) and drv.kernel.fault() is None, drv.kernel.fault()
  p = _hand_program(drv)
  assert not p.handle.rsrc1 & RSRC1_PRIV                      # the descriptor's PRIV is 0, as AMDGPUUsage requires
  words = drv.encode("compute", [("exec", p, 0x1000, (1, 1, 1), (32, 1, 1))]).packet_words()
  rsrc1 = [pm4.decode(w, 0)[1]["values"][0] for w in words if pm4.decode(w, 0)[0] == "SET_SH_REG"
           and pm4.decode(w, 0)[1]["register"] == pm4.REGISTERS["COMPUTE_PGM_RSRC1"]]
  assert rsrc1 == [p.handle.rsrc1 | RSRC1_PRIV]


def test_descriptor_with_priv_is_refused(drv):
  from baregrad.drivers.amd.driver import AMDError
  with pytest.raises(AMDError, match=r"COMPUTE_PGM_RSRC1.PRIV set in its descriptor, which AMDGPUUsage says must be 0"):
    _hand_program(drv, priv=1)


def test_emulator_refuses_a_dispatch_without_priv(drv):
  p = _hand_program(drv).handle
  words = [drv.hdp_flush("compute"), pm4.set_sh_reg("COMPUTE_PGM_LO", (p.pgm_addr >> 8) & 0xFFFFFFFF, p.pgm_addr >> 40),
           pm4.set_sh_reg("COMPUTE_PGM_RSRC1", p.rsrc1, p.rsrc2), pm4.set_sh_reg("COMPUTE_NUM_THREAD_X", 32, 1, 1),
           pm4.packet("DISPATCH_DIRECT", dim_x=1, dim_y=1, dim_z=1, compute_shader_en=1, cs_w32_en=1)]
  _stops(drv, "compute", [w for p in words for w in p], r"DISPATCH_DIRECT with COMPUTE_PGM_RSRC1 0x[0-9a-f]+ without PRIV")


# ==== 14. WAIT_REG_MEM64: the fallback, in one form ===================================================================

def test_compute_wait_is_the_one_wait_reg_mem64_form(drv):
  drv.markers = False
  words = drv.encode("compute", [("wait", _sig(0x7F00_0000_0000), 2**32 + 3)]).packet_words()
  assert [pm4.decode(w, 0)[0] for w in words] == ["WAIT_REG_MEM64"]
  f = pm4.decode(words[0], 0)[1]
  assert (f["function"], f["mem_space"], f["operation"], f["cache_policy"]) == (pm4.FUNC[">="], 1, 0, 0)
  assert pm4.wait64_operands(f) == (0x7F00_0000_0000, 2**64 - 1, 2**32 + 3)


@pytest.mark.parametrize("start,target", [(2**32 - 2, 2**32 + 3),          # below, low words above the target's
                                          (0x4_FFFF_FFFB, 0x3_FFFF_FFFC)])  # an epoch ahead, smaller low word
def test_compute_wait_across_2_pow_32(drv, start, target):
  """A 64-bit >=: blocked below the target whatever the low word, through at or above it in any epoch."""
  gate, done = drv.alloc(4096), drv.alloc(4096, "gtt")
  _set_u64(drv, gate.addr, start)
  drv.submit("compute", drv.encode("compute", [("wait", _sig(gate.addr), target), ("signal", _sig(done.addr), 1)]))
  for value in (v for v in (start, 2**32 - 1, 2**32 + 2) if start <= v < target):
    _set_u64(drv, gate.addr, value)
    time.sleep(0.03)
    assert _u64(drv, done.addr) == 0 and drv.kernel.fault() is None, (hex(value), drv.kernel.fault())
  _set_u64(drv, gate.addr, max(start, target))
  assert drv.wait_value(done.addr, 1, 5), drv.kernel.fault()


def test_two_32_bit_waits_stall_an_epoch_ahead(drv):
  """Why the driver keeps WAIT_REG_MEM64: 'high word >=, then low word >=' (the best 32-bit WAIT_REG_MEM sequence) never
  completes once the signal is an epoch past the value with a smaller low word."""
  gate, done = drv.alloc(4096, "gtt"), drv.alloc(4096, "gtt")
  _set_u64(drv, gate.addr, 0x4_FFFF_FFFB)                   # >= 0x3_FFFF_FFFC
  wait = lambda a, v: pm4.packet("WAIT_REG_MEM", function=pm4.FUNC[">="], mem_space=1, addr_lo=a & 0xFFFFFFFF,
                                 addr_hi=a >> 32, reference=v, mask=0xFFFFFFFF, poll_interval=4)
  signal = pm4.packet("RELEASE_MEM", event_type=pm4.BOTTOM_OF_PIPE_TS, event_index=5, data_sel=pm4.DATA_SEL_32,
                      addr_lo=done.addr & 0xFFFFFFFF, addr_hi=done.addr >> 32, data_lo=1)
  drv.compute.write([wait(gate.addr + 4, 3), wait(gate.addr, 0xFFFF_FFFC), signal])
  time.sleep(0.1)
  assert _u64(drv, done.addr) == 0 and drv.kernel.fault() is None
  _set_u64(drv, gate.addr, 0x4_FFFF_FFFC)                   # release the queue
  assert _poll(lambda: _u64(drv, done.addr) == 1)


@pytest.mark.parametrize("fields,what", [(dict(function=3), "function 3"), (dict(mask_hi=0), r"mask 0xffffffff\b"),
                                         (dict(mem_space=0), "mem_space 0"), (dict(addr_lo=4), r"address 0x[0-9a-f]*4\b")])
def test_emulator_refuses_other_wait_reg_mem64_forms(drv, fields, what):
  sig = drv.alloc(4096, "gtt")
  args = dict(function=pm4.FUNC[">="], mem_space=1, addr_lo=sig.addr & 0xFFFFFFFF, addr_hi=sig.addr >> 32, reference=0,
              reference_hi=0, mask=0xFFFFFFFF, mask_hi=0xFFFFFFFF, poll_interval=4)
  if "addr_lo" in fields: fields = {"addr_lo": (sig.addr & 0xFFFFFFFF) + 4}
  _stops(drv, "compute", pm4.packet("WAIT_REG_MEM64", **{**args, **fields}),
         rf"WAIT_REG_MEM64 other than a 64-bit '>=' .*{what}.*only the driver's form is accepted")


# ==== the PM4 read pointer wraps (A1), a ring holds at most size - 1 dwords (A7) ====================================

def test_compute_ring_laps_many_times(drv):
  """The PM4 engine writes back a 32-bit dword offset that wraps at the ring size (kfdtest PM4Queue.cpp
  RptrWhenConsumed; amdkfd kfd_kernel_queue.c), the SDMA engine a 64-bit byte count (SDMAQueue.cpp): on a 1024-dword
  compute ring, 400 submissions (about ten laps) all run, and the emulated engine wrote back offsets inside the ring.
  (A driver that reads the offset as a monotonic pointer sees a full ring after the first lap: RingFull.)"""
  old = drv.compute
  drv._ioctl("DESTROY_QUEUE", queue_id=old.queue_id)
  for mem in old.memories: drv.free(mem)
  drv.timeout = 3
  drv.compute = drv._create_queue("compute", kfd.QUEUE_TYPE_COMPUTE, 4096)
  sig = drv.alloc(4096)
  for i in range(1, 401): drv.submit("compute", drv.encode("compute", [("signal", _sig(sig.addr), i)]))
  assert drv.wait_value(sig.addr, 400, 10)
  ring = drv.compute
  assert ring.wptr > 8 * ring.dwords and ring.rptr == ring.wptr
  assert int(ring.ptrs[0]) < ring.dwords          # what the engine wrote: an offset into the ring
  # the copy ring's read pointer stays a growing byte count
  drv.submit("copy", drv.encode("copy", [("signal", _sig(sig.addr + 16), 1)]))
  assert drv.wait_value(sig.addr + 16, 1, 10)
  assert int(drv.copy.ptrs[0]) == drv.copy.wptr * 4


def test_a_ring_never_holds_a_whole_lap(drv):
  """The engine refuses a write pointer a whole ring ahead of its read pointer (rptr == wptr means empty), and the
  driver never writes that much: a packet of size - 1 dwords is the most that fits."""
  ring = drv.compute
  with pytest.raises(ValueError, match="does not fit"): ring.write([[0] * ring.dwords])
  engine = _engine(drv, ring)
  ring.ptrs[1] = ring.doorbell[0] = ring.wptr + ring.dwords         # a whole lap ahead, by hand
  assert _poll(lambda: drv.kernel.fault() is not None)
  assert "holds at most" in drv.kernel.fault(), drv.kernel.fault()
  assert engine.dead


# ==== A2. small BAR ==================================================================================================

@pytest.fixture
def small_bar(monkeypatch):
  monkeypatch.setattr(settings, "EMU", True)
  from baregrad.drivers.amd.driver import AMDDriver
  from baregrad.drivers.emu.kfd_kernel import EmulatedKFD
  d = AMDDriver(kernel=EmulatedKFD(small_bar=True), timeout=10)
  yield d
  d.close()


def test_small_bar_refuses_host_visible_vram(small_bar):
  d = small_bar
  assert not d.large_bar and not d.node.large_bar
  va = 1 << 44
  args = kfd.new_args("ALLOC_MEMORY_OF_GPU", va_addr=va, size=4096, gpu_id=d.gpu_id,
                      flags=kfd.ALLOC_VRAM | kfd.ALLOC_PUBLIC | kfd.ALLOC_WRITABLE)
  with pytest.raises(OSError) as e: d.kernel.ioctl(d.kfd_fd, kfd.REQUEST["ALLOC_MEMORY_OF_GPU"], args)
  assert e.value.errno == errno.EINVAL
  assert any("Alloc host visible vram on small bar is not allowed" in line for line in d.kernel.kmsg)


def test_host_cannot_map_device_only_vram(drv):
  """VRAM allocated without PUBLIC is NO_CPU_ACCESS: mmap of its offset is refused (EPERM)."""
  va = drv.kernel.mmap(0, 4096, 0, 0x22, -1, 0)
  args = drv._ioctl("ALLOC_MEMORY_OF_GPU", va_addr=va, size=4096, gpu_id=drv.gpu_id, flags=kfd.ALLOC_VRAM | kfd.ALLOC_WRITABLE)
  with pytest.raises(OSError) as e: drv.kernel.mmap(va, 4096, 3, 0x11, drv.drm_fd, args.mmap_offset)
  assert e.value.errno == errno.EPERM
  drv._ioctl("FREE_MEMORY_OF_GPU", handle=args.handle)
  drv.kernel.munmap(va, 4096)


def test_queue_buffers_are_where_the_references_put_them(drv):
  """EOP: device-only VRAM; context-save area: system memory the host fills and amdkfd reads with get_user."""
  eop, cwsr = drv.compute.memories[2:4]
  assert (eop.domain, cwsr.domain) == ("device", "gtt")


def test_small_bar_device_computes(small_bar, monkeypatch):
  """The device works on a small-BAR GPU: host-visible memory in GTT, the kernels' results right."""
  from baregrad.hcq.device import Device
  from baregrad.tensor import Tensor
  from baregrad.compiler import codegen, schedule
  dev = Device("AMD", small_bar)
  monkeypatch.setitem(Device._open, "AMD", dev)
  monkeypatch.setattr(codegen, "_programs", {})
  monkeypatch.setattr(schedule, "_plans", {})
  a, b = np.arange(12, dtype=np.float32).reshape(3, 4), np.arange(8, dtype=np.float32).reshape(4, 2)
  np.testing.assert_allclose((Tensor(a, device="AMD") @ Tensor(b, device="AMD") + 1).numpy(), a @ b + 1)
  assert {m.domain for m in small_bar.memory.values()} <= {"gtt", "device"}


def test_public_vram_refusal_names_resizable_bar(small_bar):
  small_bar.large_bar = True                    # as if the topology had claimed a large BAR
  from baregrad.drivers.amd.driver import AMDError
  with pytest.raises(AMDError, match="Enable Resizable BAR"): small_bar.alloc(4096)


# ==== A3. one KFD process per process ================================================================================

def test_device_reopens_in_the_same_process(monkeypatch):
  monkeypatch.setattr(settings, "EMU", True)
  from baregrad.drivers.amd.driver import AMDDriver
  first = AMDDriver(timeout=10)
  k = first.kernel
  first.close()
  second = AMDDriver(timeout=10)                # ACQUIRE_VM, the event page, RUNTIME_ENABLE are not repeated
  try:
    assert second.kernel is k and second.kfd_fd == first.kfd_fd and second.event_page is first.event_page
    sig = second.alloc(4096, "gtt")
    second.submit("compute", second.encode("compute", [("signal", _sig(sig.addr), 3)]))
    assert second.wait_value(sig.addr, 3, 5), second.kernel.fault()
  finally:
    second.close()


def test_kfd_process_outlives_its_files(drv):
  """What amdkfd refuses on a second try in one process (the old driver repeated all three on reopen)."""
  k = drv.kernel
  from baregrad.drivers.emu.kfd_kernel import RENDER_MINOR
  drm = k.open(f"/dev/dri/renderD{RENDER_MINOR}")
  try:
    def refused(name, **fields):
      with pytest.raises(OSError) as e: drv._ioctl(name, **fields)
      return e.value.errno
    assert refused("ACQUIRE_VM", drm_fd=drm, gpu_id=drv.gpu_id) == errno.EBUSY
    assert refused("RUNTIME_ENABLE", mode_mask=kfd.RUNTIME_ENABLE_MODE_ENABLE_MASK) == errno.EBUSY
    page = drv.alloc(kfd.SIGNAL_EVENT_LIMIT * 8, "gtt")
    assert refused("CREATE_EVENT", event_type=kfd.EVENT_SIGNAL, auto_reset=1, event_page_offset=page.handle) == errno.EINVAL
  finally:
    k.close(drm)


# ==== A4. SDMA HDP flush =============================================================================================

def test_emulator_refuses_the_privileged_sdma_hdp_flush(drv):
  """The register form of sdma_v6_0_ring_emit_hdp_flush, which the driver used before."""
  reg = sdma.packet("POLL_REGMEM", hdp_flush=1, func=sdma.FUNC["=="], addr_lo=pm4.HDP_FLUSH_DONE << 2,
                    addr_hi=pm4.HDP_FLUSH_REQ << 2, value=pm4.HDP_FLUSH_SDMA, mask=pm4.HDP_FLUSH_SDMA, interval=10,
                    retry_count=0xFFF)
  _stops(drv, "copy", reg, r"HDP_FLUSH set .* privileged .*SDMA_PKT_HDP_FLUSH")


def test_copy_queue_flushes_with_the_firmware_packet(drv):
  assert drv.hdp_flush("copy") == [0x8, 0x0, 0x80000000, 0x0, 0x0, 0x0]       # ROCr sdma_registers.h


# ==== A5. SDMA INDIRECT alignment ====================================================================================

def test_emulator_refuses_a_misaligned_sdma_indirect(drv):
  ib = drv.alloc(4096, "gtt")
  np.frombuffer(drv.view(ib.addr, 32), np.uint32)[:] = sdma.nop(8)
  drv.copy.write([sdma.nop(3)])                 # the INDIRECT then ends at dword 9
  _stops(drv, "copy", sdma.packet("INDIRECT", ib_base_lo=ib.addr & 0xFFFFFFFF, ib_base_hi=ib.addr >> 32, ib_size=8),
         r"INDIRECT .* must end on an 8-dword boundary")


def test_emulator_refuses_an_unpadded_sdma_ib(drv):
  ib = drv.alloc(4096, "gtt")
  np.frombuffer(drv.view(ib.addr, 12), np.uint32)[:] = sdma.nop(3)
  drv.copy.write([sdma.nop(2)])                 # aligned end, but a 3-dword IB
  _stops(drv, "copy", sdma.packet("INDIRECT", ib_base_lo=ib.addr & 0xFFFFFFFF, ib_base_hi=ib.addr >> 32, ib_size=3),
         r"size a multiple of 8 dwords")


def test_bound_copy_queue_replays_from_any_ring_position(drv):
  src, dst, sig = drv.alloc(4096, "gtt"), drv.alloc(4096, "gtt"), drv.alloc(4096, "gtt")
  np.frombuffer(drv.view(src.addr, 64), np.uint8)[:] = np.arange(64)
  bound = drv.bind("copy", drv.encode("copy", [("copy", dst.addr, src.addr, 64)]))
  assert bound.ndwords % 8 == 0
  for k in range(1, 20):
    drv.copy.write([sdma.nop(k % 7 + 1)])       # every ring offset mod 8
    drv.submit_bound("copy", bound, [])
    drv.submit("copy", drv.encode("copy", [("signal", _sig(sig.addr), k)]))
    assert drv.wait_value(sig.addr, k, 5), drv.kernel.fault()
  assert (np.frombuffer(drv.view(dst.addr, 64), np.uint8) == np.arange(64)).all()


# ==== A6. queue errors through the context-save-area header ==========================================================

def test_queue_error_is_reported_at_once(drv):
  """A bad PM4 packet: amdkfd ORs EC_QUEUE_PACKET_UNSUPPORTED into the header's payload and sets its event."""
  from baregrad.drivers.amd.driver import QueueReset
  sig = drv.alloc(4096, "gtt")
  drv.compute.write([[pm4.header(0x99, 2), 0, 0]])
  start = time.monotonic()
  assert not drv.wait_value(sig.addr, 1, 20)
  assert time.monotonic() - start < 1.0                     # not the timeout
  assert kfd.exception_names(int(drv.compute.error_payload[0])) == ["EC_QUEUE_PACKET_UNSUPPORTED"]
  with pytest.raises(QueueReset, match=r"queue error \(compute queue: EC_QUEUE_PACKET_UNSUPPORTED\)"):
    drv.check_faults("AMD")


def test_empty_cwsr_header_reports_nothing(drv):
  """With the header left zero (as the driver had it) the queue only stops: no event, no payload."""
  cwsr = drv.compute.memories[3]
  np.frombuffer(drv.view(cwsr.addr, 40), np.uint8)[:] = 0
  drv.compute.write([[pm4.header(0x99, 2), 0, 0]])
  assert _poll(lambda: drv.kernel.fault() is not None)
  time.sleep(0.05)
  assert not drv._poll_exceptions() and int(drv.compute.error_payload[0]) == 0


def test_wave_error_code(drv):
  """An illegal instruction in a wave reports EC_QUEUE_WAVE_ILLEGAL_INSTRUCTION."""
  p = _hand_program(drv)
  drv.view(p.handle.pgm_addr, 4)[:] = b"\xff\xff\xff\xff"
  args, sig = drv.alloc(64), drv.alloc(4096, "gtt")
  drv.submit("compute", drv.encode("compute", [("exec", p, args.addr, (1, 1, 1), (64, 1, 1)), ("signal", _sig(sig.addr), 1)]))
  assert not drv.wait_value(sig.addr, 1, 5)
  assert kfd.exception_names(int(drv.compute.error_payload[0])) == ["EC_QUEUE_WAVE_ILLEGAL_INSTRUCTION"]


# ==== A8. node choice ================================================================================================

def test_driver_picks_the_gfx1100_node(drv):
  from baregrad.drivers.amd.topology import gpu_nodes
  nodes = gpu_nodes(drv.kernel)
  assert [n.target for n in nodes] == ["gfx1036", "gfx1100"]   # the iGPU is listed first
  assert drv.node.target == "gfx1100" and drv.node is not nodes[0] and drv.gpu_id == nodes[1].gpu_id


def test_no_matching_node_is_named():
  from baregrad.drivers.amd.topology import GPUNode, pick_node
  with pytest.raises(ValueError, match=r"no KFD GPU node is a gfx1100.*node 1 gfx1036"):
    pick_node([GPUNode(1, 5, {"gfx_target_version": 100306})], ("gfx1100",))


# ==== AR2. executable command buffers ================================================================================

def test_emulator_refuses_commands_from_non_executable_memory(drv):
  ib = drv.alloc(4096, "gtt", executable=False)
  np.frombuffer(drv.view(ib.addr, 16), np.uint32)[:] = pm4.nop(4)
  _stops(drv, "compute", drv.hdp_flush("compute") + pm4.packet("INDIRECT_BUFFER", ib_base_lo=ib.addr & 0xFFFFFFFC,
                                                               ib_base_hi=ib.addr >> 32, ib_size=4, valid=1),
         r"indirect buffer at .* without KFD_IOC_ALLOC_MEM_FLAGS_EXECUTABLE")


# ==== host <-> device copies of VRAM go through SDMA and GTT staging =================================================

def test_large_vram_copies_go_through_sdma(drv):
  """A 9 MiB round trip (three staging chunks, two buffers in turn) arrives intact, moved by SDMA COPY_LINEAR, not
  by host loads through the BAR; a GTT buffer and a small copy are copied by the CPU."""
  mem = drv.alloc(9 << 20)
  assert mem.domain == "vram"
  data = np.random.default_rng(0).integers(0, 256, 9 << 20, dtype=np.uint8)
  engine = _engine(drv, drv.copy)
  before = engine.packets_done
  drv.copyin(mem.addr, data)
  out = np.zeros_like(data)
  drv.copyout(out, mem.addr)
  np.testing.assert_array_equal(out, data)
  assert engine.history.count("COPY_LINEAR") >= 6 and engine.packets_done > before
  small, host = drv.alloc(4096), drv.alloc(1 << 20, "gtt")
  done = engine.packets_done
  drv.copyin(small.addr, data[:4096]); drv.copyin(host.addr, data[:1 << 20])
  back = np.zeros(1 << 20, np.uint8)
  drv.copyout(back, host.addr)
  np.testing.assert_array_equal(back, data[:1 << 20])
  assert engine.packets_done == done                     # no SDMA work for those


def test_kernel_traffic_is_counted_by_where_it_lives(small_bar, monkeypatch):
  """The emulated GPU counts a kernel's global bytes in system memory apart (drivers/emu/memory.py): none for tensors
  in VRAM, all of them on a small-BAR GPU, whose host-visible memory is GTT."""
  from baregrad.hcq.device import Device
  from baregrad.tensor import Tensor
  from baregrad.compiler import codegen, schedule
  from baregrad.drivers.emu import counters
  monkeypatch.setattr(settings, "EMU", True)
  from baregrad.drivers.amd.driver import AMDDriver
  from baregrad.drivers.emu.kfd_kernel import EmulatedKFD
  x = np.arange(4096, dtype=np.float32)
  for drv, system in ((AMDDriver(kernel=EmulatedKFD(), timeout=10), False), (small_bar, True)):
    monkeypatch.setattr(codegen, "_programs", {})      # programs loaded on the other device stay there
    monkeypatch.setattr(schedule, "_plans", {})
    dev = Device("AMD", drv)
    monkeypatch.setitem(Device._open, "AMD", dev)
    t = Tensor(x, device="AMD").realize()
    dev.synchronize()
    drv.kernel.counters.reset()
    np.testing.assert_array_equal((t * 2).numpy(), x * 2)
    run = drv.kernel.counters.total()
    assert run.kernels == 1 and run.global_bytes >= 2 * x.nbytes
    assert run.global_system_bytes == (run.global_bytes if system else 0)
    if not system: drv.close()



# ==== trace markers: a stopped or hung queue's report names the commands =============================================

def test_hang_report_names_the_last_command_done_and_the_first_not(drv):
  """Each command writes its sequence number when done (settings.QUEUE_MARKERS); a wait that never passes is reported
  with the command before it (done) and itself (not done)."""
  from baregrad.drivers.amd.driver import QueueTimeout
  gate, done = drv.alloc(4096, "gtt"), drv.alloc(4096, "gtt")
  gate_sig = types.SimpleNamespace(addr=gate.addr, timestamp_addr=gate.addr + 8, name="gate")
  done_sig = types.SimpleNamespace(addr=done.addr, timestamp_addr=done.addr + 8, name="done")
  drv.submit("compute", drv.encode("compute", [("signal", done_sig, 1), ("barrier",), ("wait", gate_sig, 7),
                                               ("signal", done_sig, 2)]))
  assert drv.wait_value(done.addr, 1, 5) and not drv.wait_value(done.addr, 2, 0.3)
  with pytest.raises(QueueTimeout) as e: drv.check_faults("AMD")
  msg = str(e.value)
  assert re.search(r"last command done #\d+ \(barrier\), first not done #\d+ \(wait for gate 7\)", msg), msg
  _set_u64(drv, gate.addr, 7)
  assert drv.wait_value(done.addr, 2, 5)
  assert "every command done" in drv.marker_report("compute")


def test_fault_report_names_the_kernel_command(drv):
  from baregrad.drivers.amd.driver import GPUFault
  p = _hand_program(drv)
  args, sig = drv.alloc(64), drv.alloc(4096, "gtt")
  _set_u64(drv, args.addr, 0xDEAD0000)                 # the kernel stores to unmapped memory
  drv.submit("compute", drv.encode("compute", [("exec", p, args.addr, (1, 1, 1), (32, 1, 1)), ("signal", _sig(sig.addr), 1)]))
  assert not drv.wait_value(sig.addr, 1, 2)
  with pytest.raises(GPUFault, match=r"first not done #\d+ \(kernel hand \(1, 1, 1\)x\(32, 1, 1\)\)"):
    drv.check_faults("AMD")


def test_fault_addresses_are_named_by_the_allocation_history(drv):
  live = drv.alloc(100)
  assert re.search(rf"live vram allocation of 100 bytes at {live.addr:#x}, offset 0x10$", drv.describe_address(live.addr + 16))
  assert "past the bytes asked for" in drv.describe_address(live.addr + 200)
  gone = drv.alloc(4096, "gtt")
  drv.free(gone)
  assert re.search(r"gtt allocation of 4096 bytes .* freed [\d.]+ s ago: a use after free", drv.describe_address(gone.addr + 8))
  assert "never mapped" in drv.describe_address(0xDEAD0000)


def test_memory_fault_report_names_the_freed_allocation(drv):
  from baregrad.drivers.amd.driver import GPUFault
  p = _hand_program(drv)
  args, sig, out = drv.alloc(64), drv.alloc(4096, "gtt"), drv.alloc(1024)
  _set_u64(drv, args.addr, out.addr)
  drv.free(out)                                        # the kernel then stores into freed memory
  drv.submit("compute", drv.encode("compute", [("exec", p, args.addr, (1, 1, 1), (32, 1, 1)), ("signal", _sig(sig.addr), 1)]))
  assert not drv.wait_value(sig.addr, 1, 2)
  with pytest.raises(GPUFault) as e: drv.check_faults("AMD")
  assert re.search(r"a use after free.*\n  compute queue \d+, packets around its read pointer:.*\n    => 0x[0-9a-f]+ "
                   r"DISPATCH_DIRECT", str(e.value), re.S), str(e.value)


def test_a_peer_mapping_goes_with_the_host_memory_it_maps(monkeypatch):
  """A device that maps another's allocation (map_peer: a KFD userptr BO at the allocation's address) drops the
  mapping when the owner frees it, also when it is not the device registered under its name (a private one): a BO
  left there would make the GPU refuse the next allocation the host places at that address (EINVAL, VA taken)."""
  monkeypatch.setattr(settings, "EMU", True)
  from baregrad.drivers.amd.driver import AMDDriver
  from baregrad.drivers.emu.kfd_kernel import EmulatedKFD
  from baregrad.hcq.device import Device
  cpu = Device.get("CPU")
  amd = Device("AMD", AMDDriver(kernel=EmulatedKFD(), timeout=10))      # not in Device._open
  try:
    mem = cpu.driver.alloc(1 << 16)
    amd.map_peer(cpu, mem, 1 << 16)
    bos = lambda: [bo for bo in amd.driver.kernel.bos.values() if bo.va == mem.addr]
    assert len(bos()) == 1
    cpu.free_memory(mem)
    assert not bos() and mem.addr not in amd.driver.memory
  finally:
    amd.close()
