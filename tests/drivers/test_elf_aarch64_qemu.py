"""CPU kernels as baregrad renders them, run on an emulated AArch64 CPU: each kernel's C is compiled by an AArch64
cross gcc with the CPU device's flags, linked by the loader's link step (drivers/cpu/elf.py link_elf) at a fixed
base with externals resolved to a static harness's libm, and executed under qemu-user by that harness; the results
must equal numpy's. Needs aarch64-linux-gnu-gcc and qemu-aarch64 (Debian: gcc-aarch64-linux-gnu qemu-user), which
CI does not install: it skips there."""
import io, shutil, subprocess
import numpy as np
import pytest
from elftools.elf.elffile import ELFFile
from baregrad.tensor import Tensor
from baregrad.drivers.cpu import cc, elf

GCC, QEMU, NM = shutil.which("aarch64-linux-gnu-gcc"), shutil.which("qemu-aarch64"), shutil.which("aarch64-linux-gnu-nm")
pytestmark = pytest.mark.skipif(not (GCC and QEMU and NM), reason="needs an AArch64 cross gcc and qemu-user "
                                "(apt-get install gcc-aarch64-linux-gnu qemu-user)")
# The rendered C targets this (x86-64) host's choices where the renderer makes any (F16C conversions), so the cases
# avoid float16. -march=native is the host's: the AArch64 compile names a baseline instead.
FLAGS = [f for f in cc.DEFAULT_FLAGS if f != "-march=native"] + ["-march=armv8.2-a", "-mno-outline-atomics"]
BASE = 0x10000000
HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <sys/mman.h>
typedef void (*kernel_t)(const uint64_t *, int64_t);
volatile void *keep[] = {(void *)expf, (void *)logf, (void *)exp2f, (void *)log2f, (void *)sinf, (void *)cosf,
                         (void *)powf, (void *)exp, (void *)log, (void *)sin, (void *)cos, (void *)pow, (void *)sqrtf};
static void *slurp(const char *path, long *n) {
  FILE *f = fopen(path, "rb"); if (!f) { perror(path); exit(2); }
  fseek(f, 0, SEEK_END); *n = ftell(f); fseek(f, 0, SEEK_SET);
  void *b = aligned_alloc(64, (*n + 127) / 64 * 64);
  if (fread(b, 1, *n, f) != (size_t)*n) exit(3);
  fclose(f); return b;
}
int main(int argc, char **argv) {   /* image base entry cores buffer-files... (each rewritten with its contents) */
  long n, sizes[64]; uint64_t args[64];
  void *img = slurp(argv[1], &n);
  uint64_t base = strtoull(argv[2], 0, 16), entry = strtoull(argv[3], 0, 16);
  void *m = mmap((void *)base, (n + 4095) & ~4095L, PROT_READ | PROT_WRITE | PROT_EXEC,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  if (m == MAP_FAILED) { perror("mmap"); return 4; }
  memcpy(m, img, n); __builtin___clear_cache((char *)m, (char *)m + n);
  for (int i = 5; i < argc; i++) args[i - 5] = (uint64_t)slurp(argv[i], &sizes[i - 5]);
  for (int core = 0; core < atoi(argv[4]); core++) ((kernel_t)entry)(args, core);
  for (int i = 5; i < argc; i++) { FILE *f = fopen(argv[i], "wb"); fwrite((void *)args[i - 5], 1, sizes[i - 5], f); fclose(f); }
  return 0;
}
"""


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
  d = tmp_path_factory.mktemp("a64")
  (d / "h.c").write_text(HARNESS)
  subprocess.run([GCC, "-O1", "-static", "-no-pie", str(d / "h.c"), "-o", str(d / "h"), "-lm"], check=True)
  syms = {}
  for line in subprocess.run([NM, str(d / "h")], capture_output=True, text=True, check=True).stdout.splitlines():
    if len(p := line.split()) == 3 and p[1] in "TtWw": syms[p[2]] = int(p[0], 16)
  for name in ("memcpy", "memset", "memmove"):     # IFUNCs in a static glibc: take the generic implementation
    syms[name] = syms.get(f"__{name}_generic", 0)
  return d, syms


def read(buf) -> np.ndarray:
  out = np.empty(buf.size, buf.dtype.np)
  buf.copyout(memoryview(out).cast("B"))
  return out


def run_on_aarch64(t: Tensor, harness) -> tuple[np.ndarray, set]:
  d, syms = harness
  files, relocs = {}, set()
  items = t.schedule()
  for n, item in enumerate(items):
    obj_path = d / f"k{n}.o"
    subprocess.run([GCC, *FLAGS, "-c", "-x", "c", "-", "-o", str(obj_path)], input=item.program.source.encode(), check=True)
    obj = obj_path.read_bytes()
    relocs |= {elf.reloc_name(r["r_info_type"], elf.EM_AARCH64) for s in ELFFile(io.BytesIO(obj)).iter_sections()
               if s["sh_type"] == "SHT_RELA" for r in s.iter_relocations()}
    linked = elf.link_elf(obj, BASE, resolve=lambda name: syms.get(name, 0), machine=elf.EM_AARCH64)
    (d / "img").write_bytes(linked.image)
    for k, b in enumerate(item.bufs):
      if id(b) not in files:
        files[id(b)] = d / f"b{len(files)}"
        (read(b) if k > 0 and b.is_allocated else np.zeros(b.size, b.dtype.np)).tofile(files[id(b)])
    subprocess.run([QEMU, str(d / "h"), str(d / "img"), hex(BASE), hex(linked.symbols[item.program.name]),
                    str(item.program.meta.get("threads", 1) or 1), *(str(files[id(b)]) for b in item.bufs)], check=True)
  out = items[-1].bufs[0]
  return np.fromfile(files[id(out)], out.dtype.np), relocs


def test_rendered_kernels_run_on_aarch64(harness):
  r = np.random.default_rng(0)
  x, big = r.standard_normal((33, 70), dtype=np.float32), r.standard_normal((256, 256), dtype=np.float32)
  X, BIG = Tensor(x).realize(), Tensor(big).realize()
  x64 = x.astype(np.float64)
  e = np.exp(x64 - x64.max(1, keepdims=True))
  cases = [(BIG @ BIG, big.astype(np.float64) @ big),                          # packed right operand, vector tiles
           (X.softmax(-1), e / e.sum(1, keepdims=True)),
           ((X.abs() + 1).pow(X) + X.sin(), (np.abs(x64) + 1) ** x64 + np.sin(x64)),
           (X.cast("float64").exp().sum(1), np.exp(x64).sum(1)),
           (X[Tensor(np.array([3, 0, 7, 7, 1], np.int32))], x64[[3, 0, 7, 7, 1]])]
  seen = set()
  for t, ref in cases:
    got, relocs = run_on_aarch64(t, harness)
    seen |= relocs
    np.testing.assert_allclose(got[:ref.size].reshape(ref.shape), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
  # the kernels' own relocations went through the loader (constants by page + low 12 bits, jump-table entries)
  assert "R_AARCH64_ADR_PREL_PG_HI21" in seen and any(n.startswith("R_AARCH64_LDST") for n in seen), seen
