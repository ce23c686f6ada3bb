"""The CPU device's toolchain: C compiler front end (cc), ELF loader (elf), command processor.

References are independent of the code under test: numpy for values, the kernel's
/proc/self/maps for page protections, objdump for what the compiler emitted, hand-patched
ELF bytes for the error paths.
"""
import gc, io, os, shutil, struct, subprocess, threading, time
import cffi
import numpy as np
import pytest
from elftools.elf.elffile import ELFFile

from baregrad.drivers import settings
from baregrad.drivers.cpu import cc, elf
from baregrad.drivers.cpu.elf import ElfError, load_elf
from baregrad.drivers.cpu.processor import (CommandProcessor, Op, ProcessorFault, futex_wait, futex_wake, header, packet,
                                           wait_value)

ffi = cffi.FFI()


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory):
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(settings, "BAREGRAD_CACHE", str(tmp_path_factory.mktemp("cache")))
    mp.setattr(settings, "CACHE", True)
    yield


def addr(a: np.ndarray) -> int: return a.ctypes.data


def fptr(ctype: str, image, name: str): return ffi.cast(ctype, image.symbol(name))


def mapping_perms(address: int) -> str:
  """Permissions the kernel reports for the page holding `address` (from /proc/self/maps)."""
  with open("/proc/self/maps") as f:
    for line in f:
      span, perms = line.split()[:2]
      lo, hi = (int(x, 16) for x in span.split("-"))
      if lo <= address < hi: return perms[:3]
  return "unmapped"


# ---------------------------------------------------------------------------------------------------- cc

def test_cc_missing_compiler_in_CC(monkeypatch):
  monkeypatch.setattr(settings, "CC", "/nonexistent/bin/gcc-404")
  with pytest.raises(cc.CompilerNotFound, match="/nonexistent/bin/gcc-404"):
    cc.find_compiler()


def test_cc_no_compiler_on_path(monkeypatch, tmp_path):
  monkeypatch.setattr(settings, "CC", None)
  monkeypatch.setenv("PATH", str(tmp_path))
  with pytest.raises(cc.CompilerNotFound, match="apt-get install gcc") as e:
    cc.find_compiler()
  assert isinstance(e.value, RuntimeError)


def test_cc_CC_and_version(monkeypatch):
  gcc = shutil.which("gcc") or pytest.skip("no gcc")
  monkeypatch.setattr(settings, "CC", "gcc")
  assert cc.find_compiler() == gcc
  expected = subprocess.run([gcc, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
  assert cc.compiler_version(gcc) == expected


def test_cc_compile_error_shows_stderr_and_numbered_source():
  with pytest.raises(cc.CompileError) as e:
    cc.compile_c("int ok(void) { return 1; }\nint broken(void) { return undeclared_thing; }\n")
  msg = str(e.value)
  assert "undeclared_thing" in msg and "error" in msg       # the compiler's stderr
  assert "2 | int broken(void)" in msg                        # the numbered source


def test_cc_drops_flags_the_compiler_rejects():
  with pytest.warns(UserWarning, match="-fbaregrad-no-such-flag"):
    obj = cc.compile_c("int eight(void) { return 8; }\n", cc.DEFAULT_FLAGS + ("-fbaregrad-no-such-flag",))
  image = load_elf(obj)
  assert fptr("int(*)(void)", image, "eight")() == 8
  image.close()


def test_cc_object_is_relocatable_elf():
  obj = cc.compile_c("int seven(void) { return 7; }\n")
  header = ELFFile(io.BytesIO(obj)).header
  assert header["e_type"] == "ET_REL" and header["e_ident"]["EI_CLASS"] == "ELFCLASS64"


def test_cc_disk_cache(monkeypatch, tmp_path):
  monkeypatch.setattr(settings, "BAREGRAD_CACHE", str(tmp_path))
  src = f"int cached_{os.getpid()}(int x) {{ return x * 3; }}\n"
  before = dict(cc.stats)
  first = cc.compile_c(src)
  assert cc.stats["compiles"] == before["compiles"] + 1 and cc.stats["cache_hits"] == before["cache_hits"]
  files = list((tmp_path / "cc").iterdir())
  assert len(files) == 1 and len(files[0].stem) == 64                   # named by sha256
  assert files[0].read_bytes().endswith(first)   # after diskcache's header (checked in tests/drivers/test_diskcache.py)
  second = cc.compile_c(src)
  assert second == first and cc.stats["cache_hits"] == before["cache_hits"] + 1
  assert cc.stats["compiles"] == before["compiles"] + 1
  cc.compile_c(src, cc.DEFAULT_FLAGS + ("-O1",))  # other flags: another object
  assert cc.stats["compiles"] == before["compiles"] + 2 and len(list((tmp_path / "cc").iterdir())) == 2
  monkeypatch.setattr(settings, "CACHE", False)
  assert cc.compile_c(src) == first and cc.stats["compiles"] == before["compiles"] + 3
  assert not [p for p in (tmp_path / "cc").iterdir() if p.suffix != ".o"]  # no temp files left behind


# ---------------------------------------------------------------------------------------------------- elf

DATA_SRC = r"""
static float weights[8] = {0.5f, 1.5f, -2.0f, 3.25f, 4.0f, -0.75f, 6.0f, 8.5f};   /* .data (written below) */
static float history[64];                                                          /* .bss */
int calls = 0;                                    /* global: reached through the GOT under -fPIC */
static __attribute__((noinline)) float scaled(float x, int i) { return x * weights[i & 7]; }
static __attribute__((noinline)) int fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
float poly(float x) { return 1.5f * x * x + 0.25f * x - 3.0f; }                  /* constants in .rodata */
float accumulate(const float *x, int n) {
  calls++;
  for (int i = 0; i < n; i++) history[i & 63] += scaled(x[i], i);
  float s = 0.0f;
  for (int i = 0; i < 64; i++) s += history[i];
  return s;
}
void set_weight(int i, float w) { weights[i & 7] = w; }
float history_at(int i) { return history[i & 63]; }
int fib_of(int n) { return fib(n); }
"""


@pytest.fixture(scope="module")
def data_image():
  image = load_elf(cc.compile_c(DATA_SRC))
  yield image
  image.close()


def test_elf_rodata_float_constants(data_image):
  poly = fptr("float(*)(float)", data_image, "poly")
  xs = np.linspace(-10, 10, 41, dtype=np.float32)
  got = np.array([poly(float(x)) for x in xs], dtype=np.float32)
  np.testing.assert_allclose(got, np.float32(1.5) * xs * xs + np.float32(0.25) * xs - np.float32(3.0), rtol=1e-6, atol=1e-5)


def test_elf_data_bss_and_static_calls(data_image):
  accumulate = fptr("float(*)(const float *, int)", data_image, "accumulate")
  history_at = fptr("float(*)(int)", data_image, "history_at")
  set_weight = fptr("void(*)(int, float)", data_image, "set_weight")
  assert [history_at(i) for i in range(64)] == [0.0] * 64      # .bss starts zeroed
  weights = np.array([0.5, 1.5, -2.0, 3.25, 4.0, -0.75, 6.0, 8.5], dtype=np.float32)
  history = np.zeros(64, dtype=np.float32)
  x = np.arange(1, 101, dtype=np.float32)                       # small integers: every sum is exact
  for _ in range(2):
    for i in range(len(x)): history[i & 63] += x[i] * weights[i & 7]
    assert accumulate(ffi.cast("float *", addr(x)), len(x)) == history.sum()
  set_weight(3, 10.0)                                           # .data is writable and holds the initializers
  weights[3] = 10.0
  for i in range(len(x)): history[i & 63] += x[i] * weights[i & 7]
  assert accumulate(ffi.cast("float *", addr(x)), len(x)) == history.sum()
  assert [history_at(i) for i in range(64)] == history.tolist()
  calls = ffi.cast("int *", data_image.symbol("calls"))         # global through a GOT slot
  assert calls[0] == 3
  assert fptr("int(*)(int)", data_image, "fib_of")(20) == 6765  # recursive static helper


def test_elf_layout_and_page_protections(data_image):
  image = data_image
  assert {".text", ".data", ".bss"} <= set(image.sections)
  for name, a in image.symbols.items(): assert image.base <= a < image.base + image.size, name
  assert mapping_perms(image.symbol("poly")) == "r-x"
  assert mapping_perms(image.symbol("calls")) == "rw-"
  assert mapping_perms(image.symbol("history_at")) == "r-x"
  rodata = [a for n, a in image.sections.items() if n.startswith(".rodata")]
  assert rodata and all(mapping_perms(a) == "r--" for a in rodata)


MATH_SRC = r"""
void *memcpy(void *dst, const void *src, unsigned long n);
float sinf(float);
float cosf(float);
static float (*pointer_to_cosf)(float) = cosf;     /* an absolute address of a libm function in data */
void sines(float *out, const float *in, int n) { for (int i = 0; i < n; i++) out[i] = sinf(in[i]); }
void cosines(float *out, const float *in, int n) { for (int i = 0; i < n; i++) out[i] = pointer_to_cosf(in[i]); }
void copy(void *dst, const void *src, unsigned long n) { memcpy(dst, src, n); }
"""


def test_elf_external_calls_through_resolver():
  asked = []
  def resolve(name):
    asked.append(name)
    return elf.resolve_libc(name)
  image = load_elf(cc.compile_c(MATH_SRC), resolve=resolve)
  assert {"memcpy", "sinf", "cosf"} <= set(asked)
  x = np.linspace(-7, 7, 101, dtype=np.float32)
  out = np.zeros_like(x)
  fptr("void(*)(float *, const float *, int)", image, "sines")(ffi.cast("float *", addr(out)), ffi.cast("float *", addr(x)), len(x))
  np.testing.assert_allclose(out, np.sin(x.astype(np.float64)), atol=2e-7)
  fptr("void(*)(float *, const float *, int)", image, "cosines")(ffi.cast("float *", addr(out)), ffi.cast("float *", addr(x)), len(x))
  np.testing.assert_allclose(out, np.cos(x.astype(np.float64)), atol=2e-7)
  src, dst = np.random.default_rng(0).integers(0, 255, 1000, dtype=np.uint8), np.zeros(1000, np.uint8)
  fptr("void(*)(void *, const void *, unsigned long)", image, "copy")(ffi.cast("void *", addr(dst)), ffi.cast("void *", addr(src)), 1000)
  np.testing.assert_array_equal(dst, src)
  image.close()


def test_elf_unresolvable_symbol():
  obj = cc.compile_c("void baregrad_no_such_function(void);\nvoid f(void) { baregrad_no_such_function(); }\n")
  with pytest.raises(ElfError, match="undefined symbol 'baregrad_no_such_function'"):
    load_elf(obj)
  with pytest.raises(ElfError, match="undefined symbol 'baregrad_no_such_function'"):
    load_elf(obj, resolve=lambda name: 0)


SAXPY_SRC = r"""
void saxpy(float *restrict y, const float *restrict x, float a, int n) { for (int i = 0; i < n; i++) y[i] += a * x[i]; }
"""


def test_elf_vectorized_loop(tmp_path):
  obj = cc.compile_c(SAXPY_SRC)
  if shutil.which("objdump"):  # make sure this really runs packed SIMD code
    with open(tmp_path / "saxpy.o", "wb") as f: f.write(obj)
    asm = subprocess.run(["objdump", "-d", f.name], capture_output=True, text=True).stdout
    assert any(op in asm for op in ("mulps", "addps", "fmadd132ps", "fmadd213ps", "fmadd231ps")), asm
  image = load_elf(obj)
  saxpy = fptr("void(*)(float *, const float *, float, int)", image, "saxpy")
  rng = np.random.default_rng(1)
  for n, offset in ((1, 0), (7, 1), (64, 0), (1003, 3)):  # tails and unaligned starts
    x, y = rng.standard_normal(n + offset).astype(np.float32), rng.standard_normal(n + offset).astype(np.float32)
    expected = y.copy()
    expected[offset:] += np.float32(0.75) * x[offset:]
    saxpy(ffi.cast("float *", addr(y)) + offset, ffi.cast("float *", addr(x)) + offset, 0.75, n)
    np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-6)
  image.close()


def test_elf_symbol_lookup_and_close():
  image = load_elf(cc.compile_c("int one(void) { return 1; }\nint two(void) { return 2; }\n"))
  assert fptr("int(*)(void)", image, "two")() == 2
  with pytest.raises(KeyError, match="'three'.*one, two"):
    image.symbol("three")
  text = image.symbol("one")
  assert mapping_perms(text) == "r-x"
  image.close()
  image.close()  # idempotent
  assert mapping_perms(text) == "unmapped"
  with pytest.raises(ValueError, match="closed"):
    image.symbol("one")


def test_elf_unmapped_when_garbage_collected():
  image = load_elf(cc.compile_c("int one(void) { return 1; }\n"))
  text = image.symbol("one")
  del image
  gc.collect()
  assert mapping_perms(text) == "unmapped"


@pytest.fixture(scope="module")
def small_obj():
  return cc.compile_c("static int counter;\nint next(void) { return ++counter; }\n")


def test_elf_rejects_bad_bytes(small_obj):
  obj = small_obj
  with pytest.raises(ElfError, match="not an ELF file"):
    load_elf(b"#!/bin/sh\necho hello\n")
  with pytest.raises(ElfError, match="truncated ELF"):
    load_elf(obj[:40])
  with pytest.raises(ElfError, match="truncated ELF"):
    load_elf(obj[:len(obj) // 2])
  as32 = bytearray(obj); as32[4] = 1      # EI_CLASS = ELFCLASS32
  with pytest.raises(ElfError, match="ELFCLASS32"):
    load_elf(bytes(as32))
  arm = bytearray(obj); struct.pack_into("<H", arm, 18, 40)   # e_machine = EM_ARM
  with pytest.raises(ElfError, match="EM_ARM is not supported on this host"):
    load_elf(bytes(arm))
  dyn = bytearray(obj); struct.pack_into("<H", dyn, 16, 3)    # e_type = ET_DYN
  with pytest.raises(ElfError, match="ET_DYN.*ET_REL"):
    load_elf(bytes(dyn))


def test_elf_rejects_section_past_end(small_obj):
  elf_file = ELFFile(io.BytesIO(small_obj))
  index = next(i for i, s in enumerate(elf_file.iter_sections()) if s.name == ".text")
  h = elf_file.header
  bad = bytearray(small_obj)
  struct.pack_into("<Q", bad, h["e_shoff"] + index * h["e_shentsize"] + 32, len(small_obj))  # sh_size
  with pytest.raises(ElfError, match=r"truncated ELF: section \.text extends past end of file"):
    load_elf(bytes(bad))


def test_elf_rejects_unsupported_relocation(small_obj):
  elf_file = ELFFile(io.BytesIO(small_obj))
  rela = next(s for s in elf_file.iter_sections() if s.name == ".rela.text")
  bad = bytearray(small_obj)
  struct.pack_into("<I", bad, rela["sh_offset"] + 8, 3)  # r_info type of the first entry: R_X86_64_GOT32
  with pytest.raises(ElfError, match=r"R_X86_64_GOT32 \(3\)"):
    load_elf(bytes(bad))


def test_elf_rejects_tls():
  obj = cc.compile_c("__thread int per_thread;\nint get(void) { return per_thread; }\n")
  with pytest.raises(ElfError, match="TLS"):
    load_elf(obj)


def test_elf_relocation_overflow():
  # non-PIC code takes the address as a 32-bit immediate (R_X86_64_32): the image lives far above 4 GiB
  flags = tuple(f for f in cc.DEFAULT_FLAGS if f != "-fPIC") + ("-fno-pic", "-mcmodel=small")
  obj = cc.compile_c("int global_value;\nint *where(void) { return &global_value; }\n", flags)
  with pytest.raises(ElfError, match=r"relocation overflow: R_X86_64_32S? "):
    load_elf(obj)


# ---------------------------------------------------------------------------------------------------- processor

ADD_SRC = r"""
#include <stdint.h>
void add(const uint64_t *args) {
  float *out = (float *)args[0];
  const float *a = (const float *)args[1], *b = (const float *)args[2];
  for (uint64_t i = 0; i < args[3]; i++) out[i] = a[i] + b[i];
}
void empty(const uint64_t *args) { (void)args; }
struct timespec { long tv_sec, tv_nsec; };
int clock_gettime(int clock, struct timespec *ts);
void busy(const uint64_t *args) {  /* spin args[0] ns on CLOCK_MONOTONIC (1) */
  struct timespec ts;
  clock_gettime(1, &ts);
  long end = ts.tv_sec * 1000000000L + ts.tv_nsec + (long)args[0];
  do clock_gettime(1, &ts); while (ts.tv_sec * 1000000000L + ts.tv_nsec < end);
}
"""


@pytest.fixture(scope="module")
def kernels():
  image = load_elf(cc.compile_c(ADD_SRC))
  yield image
  image.close()


@pytest.fixture
def proc():
  p = CommandProcessor()
  yield p
  p.stop()


def test_processor_exec_kernel(proc, kernels):
  rng = np.random.default_rng(2)
  a, b = rng.standard_normal(1000).astype(np.float32), rng.standard_normal(1000).astype(np.float32)
  out = np.zeros(1000, np.float32)
  args = np.array([addr(out), addr(a), addr(b), 1000], dtype=np.uint64)
  signal = np.zeros(1, np.uint64)
  proc.write(packet(Op.EXEC, kernels.symbol("add"), addr(args)) + packet(Op.SIGNAL, addr(signal), 1))
  assert proc.wait_value(addr(signal), 1, timeout=5)
  np.testing.assert_array_equal(out, a + b)


def test_processor_copy(proc):
  src = np.random.default_rng(3).integers(0, 2**63, 513, dtype=np.uint64)
  dst = np.zeros_like(src)
  proc.write(packet(Op.COPY, addr(dst) + 8, addr(src), 512 * 8))
  proc.wait_idle(timeout=5)
  np.testing.assert_array_equal(dst[1:], src[:512])
  assert dst[0] == 0


def test_processor_signal_and_timestamp(proc):
  mem = np.zeros(3, np.uint64)
  before = time.monotonic_ns()
  proc.write(packet(Op.TIMESTAMP, addr(mem) + 8) + packet(Op.BARRIER) + packet(Op.TIMESTAMP, addr(mem) + 16) +
             packet(Op.SIGNAL, addr(mem), 0xDEAD_BEEF_0000_0001))
  assert proc.wait_value(addr(mem), 0xDEAD_BEEF_0000_0001, timeout=5)
  after = time.monotonic_ns()
  assert before <= mem[1] <= mem[2] <= after


def test_processor_wait_released_by_host(proc):
  gate, done = np.zeros(1, np.uint64), np.zeros(1, np.uint64)
  proc.write(packet(Op.WAIT, addr(gate), 5) + packet(Op.SIGNAL, addr(done), 1))
  assert not proc.wait_value(addr(done), 1, timeout=0.05)  # blocked on the gate
  gate[0] = 4                                              # not yet
  futex_wake(addr(gate))
  assert not proc.wait_value(addr(done), 1, timeout=0.05)
  assert proc.rptr == proc._ctl.last_header_rptr and proc.wptr == proc.rptr + 6
  gate[0] = 5
  futex_wake(addr(gate))
  assert proc.wait_value(addr(done), 1, timeout=5)
  proc.wait_idle(timeout=5)


def test_processor_indirect(proc, kernels):
  a, b = np.arange(16, dtype=np.float32), np.full(16, 0.5, np.float32)
  out, copied, signal = np.zeros(16, np.float32), np.zeros(16, np.float32), np.zeros(1, np.uint64)
  args = np.array([addr(out), addr(a), addr(b), 16], dtype=np.uint64)
  ib = np.array(packet(Op.EXEC, kernels.symbol("add"), addr(args)) + packet(Op.NOP) +
                packet(Op.COPY, addr(copied), addr(out), 64), dtype=np.uint64)
  proc.write(packet(Op.INDIRECT, addr(ib), len(ib)) + packet(Op.SIGNAL, addr(signal), 7))
  assert proc.wait_value(addr(signal), 7, timeout=5)
  np.testing.assert_array_equal(out, a + b)
  np.testing.assert_array_equal(copied, a + b)


def test_processor_ring_wraps():
  with CommandProcessor(ring_words=64) as proc:
    dst = np.zeros(300, np.uint64)
    values = np.arange(1000, 1300, dtype=np.uint64)
    for i in range(300):  # mixed 3- and 4-word packets so the wrap needs NOP padding
      if i % 3 == 0: proc.write(packet(Op.SIGNAL, addr(dst) + 8 * i, int(values[i])))
      else: proc.write(packet(Op.COPY, addr(dst) + 8 * i, addr(values) + 8 * i, 8))
    proc.wait_idle(timeout=5)
    np.testing.assert_array_equal(dst, values)
    assert proc.rptr == proc.wptr > 64 * 10
    assert proc.wptr > 100 * 3 + 200 * 4  # padding was inserted
    # a packet as large as the whole ring, written at an odd position: pad, wait for the ring to drain, write
    signal = np.zeros(1, np.uint64)
    proc.write(packet(Op.SIGNAL, addr(signal), 1) + [header(Op.NOP, 64)] + [0] * 63 + packet(Op.SIGNAL, addr(signal), 2))
    assert proc.wait_value(addr(signal), 2, timeout=5)
    proc.wait_idle(timeout=5)


def test_processor_blocks_politely_when_full():
  with CommandProcessor(ring_words=64) as proc:
    gate, dst = np.zeros(1, np.uint64), np.zeros(100, np.uint64)
    proc.write(packet(Op.WAIT, addr(gate), 1))
    writer = threading.Thread(target=lambda: [proc.write(packet(Op.SIGNAL, addr(dst) + 8 * i, i + 1)) for i in range(100)])
    writer.start()
    writer.join(0.1)
    assert writer.is_alive()                           # the ring is full: write() waits
    assert proc.wptr - proc.rptr <= 64 and dst.sum() == 0
    gate[0] = 1
    futex_wake(addr(gate))
    writer.join(5)
    assert not writer.is_alive()
    proc.wait_idle(timeout=5)
    np.testing.assert_array_equal(dst, np.arange(1, 101))


def test_a_fault_is_reported_after_its_thread_ended():
  """A fault ends the processor's thread; a wait that starts once the thread is gone reports the fault itself (it
  said "the thread is not running" when the wait began after the thread had ended: a race seen under load)."""
  with CommandProcessor() as proc:
    proc.write(packet(Op.NOP) + [header(99, 1)])
    proc._thread.join(5)
    assert not proc._thread.is_alive()
    signal = np.zeros(1, np.uint64)
    with pytest.raises(ProcessorFault, match="unknown opcode 99"):
      proc.wait_value(addr(signal), 1, timeout=5)


def test_processor_faults():
  with CommandProcessor() as proc:
    proc.write(packet(Op.NOP) + [header(99, 1)] + packet(Op.NOP))
    with pytest.raises(ProcessorFault, match="unknown opcode 99 .*ring position 1"):
      proc.wait_idle(timeout=5)
    assert "unknown opcode 99" in proc.fault and proc.rptr == 1
    with pytest.raises(ProcessorFault):
      proc.write(packet(Op.NOP))
  with CommandProcessor() as proc:  # EXEC with 2 words: smaller than the packet needs
    proc.write(packet(Op.NOP) + [header(Op.EXEC, 2), 0])
    with pytest.raises(ProcessorFault, match="bad packet size: EXEC"):
      proc.wait_idle(timeout=5)
  with CommandProcessor() as proc:  # nwords = 0 inside an indirect buffer
    ib = np.array(packet(Op.NOP) + [header(Op.NOP, 0)], dtype=np.uint64)
    proc.write(packet(Op.INDIRECT, addr(ib), 2))
    with pytest.raises(ProcessorFault, match="bad packet size.*word 1 of the INDIRECT buffer"):
      proc.wait_idle(timeout=5)
  with CommandProcessor() as proc:  # INDIRECT inside an indirect buffer
    inner = np.array(packet(Op.NOP), dtype=np.uint64)
    ib = np.array(packet(Op.INDIRECT, addr(inner), 1), dtype=np.uint64)
    signal = np.zeros(1, np.uint64)
    proc.write(packet(Op.INDIRECT, addr(ib), 3))
    with pytest.raises(ProcessorFault, match="INDIRECT inside an INDIRECT buffer"):
      proc.wait_value(addr(signal), 1, timeout=5)


def test_processor_write_checks_packets(proc):
  with pytest.raises(ValueError, match="nwords=0"):
    proc.write([header(Op.NOP, 0)])
  with pytest.raises(ValueError, match="needs 3 words"):
    proc.write(packet(Op.SIGNAL, 0, 0)[:2])
  with pytest.raises(TypeError):
    packet(Op.SIGNAL, 1)


def test_processor_throughput(proc):
  signal = np.zeros(1, np.uint64)
  n = 10_000
  start = time.perf_counter()
  for i in range(1, n + 1): proc.write(packet(Op.SIGNAL, addr(signal), i))
  assert proc.wait_value(addr(signal), n, timeout=10)
  one_by_one = time.perf_counter() - start
  words = [w for i in range(1, n + 1) for w in packet(Op.SIGNAL, addr(signal), n + i)]
  start = time.perf_counter()
  proc.write(words)
  assert proc.wait_value(addr(signal), 2 * n, timeout=10)
  batched = time.perf_counter() - start
  print(f"\n{n} SIGNAL packets: {n / one_by_one:,.0f}/s written one by one, {n / batched:,.0f}/s in one write")


def test_processor_round_trip_latency(proc, kernels):
  """Printed, not asserted (speed belongs to the benchmark tool)."""
  signal = np.zeros(1, np.uint64)
  for spin_ns, label in ((20_000, "spin 20 us, then futex"), (0, "futex only")):
    times = []
    for i in range(1, 1001):
      start = time.perf_counter_ns()
      proc.write(packet(Op.EXEC, kernels.symbol("empty"), 0) + packet(Op.SIGNAL, addr(signal), i))
      assert proc.wait_value(addr(signal), i, timeout=5, spin_ns=spin_ns)
      times.append(time.perf_counter_ns() - start)
    signal[0] = 0
    t = np.array(times[50:]) / 1000
    print(f"\nEXEC(empty)+SIGNAL round trip, host {label}: median {np.median(t):.1f} us, p99 {np.percentile(t, 99):.1f} us")
  # the host surely asleep in futex: a 200 us kernel, then TIMESTAMP + SIGNAL; latency = host sees it - timestamp
  mem, args = np.zeros(2, np.uint64), np.array([200_000], np.uint64)
  wake = []
  for i in range(1, 201):
    proc.write(packet(Op.EXEC, kernels.symbol("busy"), addr(args)) + packet(Op.TIMESTAMP, addr(mem) + 8) +
               packet(Op.SIGNAL, addr(mem), i))
    assert proc.wait_value(addr(mem), i, timeout=5, spin_ns=0)
    wake.append(time.monotonic_ns() - int(mem[1]))
  t = np.array(wake[10:]) / 1000
  assert np.all(t > 0)
  print(f"SIGNAL -> host awake from futex: median {np.median(t):.1f} us, p99 {np.percentile(t, 99):.1f} us")


def test_host_futex_helpers():
  word = np.zeros(1, np.uint64)
  start = time.monotonic()
  assert futex_wait(addr(word), 0, 0.02) is False           # nobody wakes it: times out
  assert time.monotonic() - start >= 0.015
  assert futex_wait(addr(word), 1, 1.0) is True             # value differs: returns at once
  woke = []
  t = threading.Thread(target=lambda: woke.append(futex_wait(addr(word), 0, 5.0)))
  t.start()
  deadline = time.monotonic() + 5
  while futex_wake(addr(word)) == 0 and time.monotonic() < deadline: time.sleep(0.001)
  t.join(5)
  assert woke == [True]
  word[0] = 3
  assert wait_value(addr(word), 3, 0.1) and not wait_value(addr(word), 4, 0.01)


def test_processor_stop_and_gc():
  proc = CommandProcessor(ring_words=256)
  thread = proc._thread
  gate = np.zeros(1, np.uint64)
  proc.write(packet(Op.WAIT, addr(gate), 1))  # never released: stop() must still end the thread
  time.sleep(0.01)
  proc.stop()
  assert not thread.is_alive()
  proc.stop()  # idempotent
  with pytest.raises(RuntimeError, match="stopped"):
    proc.write(packet(Op.NOP))
  proc = CommandProcessor(ring_words=256)
  thread = proc._thread
  assert thread.is_alive()
  del proc
  gc.collect()
  thread.join(5)
  assert not thread.is_alive()
