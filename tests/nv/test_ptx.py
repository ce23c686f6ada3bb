"""PTX renderer and cubin reader against NVIDIA's own tools (no GPU needed).

- Every kernel the op test suite compiles is rendered to PTX and must be accepted by ptxas for sm_80 and
  sm_90. The kernels are recorded once per test process by tests/helpers_capture.py (the suite runs on the
  CPU device in a subprocess, shared with the AMD renderer tests), plus a matrix of every op, cast and bitcast on
  every dtype (uint16/uint64 too, which the suite does not use). They are assembled in a few multi-entry
  modules per arch, so ptxas starts a handful of times and reruns hit the cubin cache.
- `load_cubin` (parameter layout, constant-bank offset, registers, shared and stack sizes) is checked
  against `cuobjdump -elf` (pip install nvidia-cuda-cuobjdump) and `ptxas -v` on the same cubins.
- Error paths: no ptxas anywhere, and PTX that ptxas rejects.
ptxas is preinstalled at /usr/local/bin/ptxas on the project's machines: without it these tests skip,
except under CI, where they fail.
"""
import concurrent.futures, hashlib, json, os, re, shutil, subprocess, sys
from pathlib import Path

import pytest

from baregrad.drivers import settings
from baregrad.drivers.nv import cubin
from baregrad.drivers.nv.cubin import compile_ptx, load_cubin, find_ptxas, PtxasError, PtxasNotFound
from baregrad.compiler.render_ptx import PTXRenderer
from baregrad.compiler.dtype import dtypes

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kernel_capture  # noqa: E402

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
ARCHS = ["sm_80", "sm_90"]
# where ptxas puts the first kernel parameter in constant bank 0 (observed; see drivers/nv/cubin.py)
PARAM_BASE = {"sm_80": 0x160, "sm_86": 0x160, "sm_89": 0x160, "sm_90": 0x210}
BUCKETS = 8      # modules per arch: parallel ptxas runs, and a changed kernel recompiles only its bucket


def _need(tool: str, finder):
  try:
    return finder()
  except (PtxasNotFound, FileNotFoundError) as e:
    if os.environ.get("CI"): pytest.fail(f"{tool} is required in CI: {e}")
    pytest.skip(str(e))


def _find_cuobjdump() -> str:
  if (found := shutil.which("cuobjdump")): return found
  try:
    import nvidia
    for root in nvidia.__path__:
      for cand in Path(root).glob("*/bin/cuobjdump"): return str(cand)
  except ImportError:
    pass
  raise FileNotFoundError("cuobjdump not found: pip install nvidia-cuda-cuobjdump (in the test extra)")


@pytest.fixture(scope="module")
def ptxas():
  return _need("ptxas", find_ptxas)


@pytest.fixture(scope="module")
def cuobjdump():
  return _need("cuobjdump", _find_cuobjdump)


# ---------------------------------------------------------------------------------------------
# the op suite's kernels
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def captured():
  kernels, errors = kernel_capture.op_suite_kernels()
  data = {"kernels": kernels, "errors": errors}
  data["n_op_suite"] = kernel_capture.op_suite_count()
  known = {k["entry"] for k in data["kernels"]}
  data["kernels"] += [k for k in kernel_capture.dtype_matrix() if k["entry"] not in known]
  for k in data["kernels"]:   # a unique, stable entry name per kernel
    k["entry_name"] = f"{k['name']}_{hashlib.sha256(k['entry'].encode()).hexdigest()[:12]}"
  return data


def test_op_suite_kernels_render(captured):
  assert not captured["errors"], f"{len(captured['errors'])} kernels failed to render; first:\n{captured['errors'][0]}"
  kernels = captured["kernels"]
  assert captured["n_op_suite"] >= 500, f"only {captured['n_op_suite']} kernels recorded from the op suite"
  seen = {p for k in kernels for p in k["uops"]}
  # with the dtype matrix, every dtype reaches memory and every op the renderer has rules for is rendered
  for dt in dtypes.all():
    assert f"LOAD:{dt.name}" in seen or f"PARAM:{dt.name}" in seen, f"no kernel touches {dt.name} memory"
  for op in ("ADD", "MUL", "MAX", "MOD", "IDIV", "CMPLT", "CMPNE", "XOR", "OR", "AND", "SHL", "SHR", "WHERE", "NEG",
             "RECIP", "SQRT", "TRUNC", "CAST", "BITCAST", "RANGE", "DEFINE_ACC", "ACC_UPDATE", "SPECIAL", "DEFINE_VAR"):
    assert any(p.startswith(op + ":") for p in seen), f"no kernel of the op suite has {op}"


def _modules(kernels, arch):
  renderer = PTXRenderer(arch)
  buckets = [[] for _ in range(BUCKETS)]
  for k in sorted(kernels, key=lambda k: k["entry_name"]):   # the same kernels give the same modules
    buckets[int(k["entry_name"].rsplit("_", 1)[1], 16) % BUCKETS].append(k)
  return [(b, renderer.header() + "\n" + "\n".join(k["entry"].replace("__KERNEL__", k["entry_name"]) for k in b))
          for b in buckets if b]


@pytest.fixture(scope="module")
def assembled(captured, ptxas):
  """{arch: [(kernels, module source, cubin bytes or the exception)]}, both archs assembled in parallel."""
  jobs = {arch: _modules(captured["kernels"], arch) for arch in ARCHS}
  with concurrent.futures.ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as pool:
    futures = {arch: [pool.submit(compile_ptx, src, arch) for _, src in mods] for arch, mods in jobs.items()}
    out = {}
    for arch, mods in jobs.items():
      out[arch] = []
      for (ks, src), fut in zip(mods, futures[arch]):
        try: out[arch].append((ks, src, fut.result()))
        except PtxasError as e: out[arch].append((ks, src, e))
  return out


def _rejected(kernels, arch) -> list[str]:
  """After a failed module: which kernels ptxas rejects on their own, with its message."""
  bad = []
  for k in kernels:
    src = PTXRenderer(arch).header() + "\n" + k["entry"].replace("__KERNEL__", k["entry_name"])
    try: compile_ptx(src, arch)
    except PtxasError as e: bad.append(f"{k['entry_name']}: {str(e)[:3000]}")
  return bad


@pytest.mark.parametrize("arch", ARCHS)
def test_op_suite_kernels_assemble(assembled, captured, arch):
  n = 0
  for kernels, src, result in assembled[arch]:
    if isinstance(result, Exception):
      bad = _rejected(kernels, arch)
      pytest.fail(f"ptxas rejected {len(bad)} kernels for {arch}; first:\n" + ("\n".join(bad[:2]) or str(result)[:5000]))
    loaded = load_cubin(result)
    for k in kernels:
      info = loaded[k["entry_name"]]
      count = k["n_params"] + len(k["variables"])   # buffer addresses, then variables: 8 bytes each
      assert [(p.ordinal, p.offset, p.size) for p in info.params] == [(i, 8 * i, 8) for i in range(count)], k["entry_name"]
      assert info.param_base == PARAM_BASE[arch] and info.param_size == 8 * count
      assert info.registers > 0 and info.text
      # no stack frame: nothing spilled (ptxas -v "0 bytes spill stores") and no local array left in the kernel
      assert info.stack_size == 0, f"{k['entry_name']} needs a {info.stack_size}-byte stack frame on {arch}"
      n += 1
  assert n == len(captured["kernels"])


# ---------------------------------------------------------------------------------------------
# the cubin reader against cuobjdump and ptxas -v
# ---------------------------------------------------------------------------------------------

def parse_cuobjdump_elf(text: str) -> dict:
  """What cuobjdump -elf says per kernel: params [(ordinal, offset, size)], cbank (offset, size), registers,
  frame size, and the section sizes of .nv.constant0.<k> / .nv.shared.<k>."""
  kernels: dict[str, dict] = {}
  sizes = {}
  for line in text.splitlines():   # section table rows: Index Offset Size ES Align Type Flags Link Info Name
    f = line.split()
    if len(f) == 10 and re.fullmatch(r"[0-9a-f]+", f[0]) and f[9].startswith(".nv."):
      sizes[f[9]] = int(f[2], 16)
  for block in re.split(r"\n(?=\.nv\.info)", text):
    head = block.splitlines()[0].strip()
    if head.startswith(".nv.info."):
      k = kernels.setdefault(head[len(".nv.info."):], {"params": []})
      for o, off, size in re.findall(r"Ordinal\s*:\s*(0x[0-9a-f]+)\s+Offset\s*:\s*(0x[0-9a-f]+)\s+Size\s*:\s*(0x[0-9a-f]+)", block):
        k["params"].append((int(o, 16), int(off, 16), int(size, 16)))
      if (m := re.search(r"EIATTR_PARAM_CBANK\s+Format:\s+EIFMT_SVAL\s+Value:\s+0x[0-9a-f]+ (0x[0-9a-f]+)", block)):
        v = int(m.group(1), 16)
        k["cbank"] = (v & 0xFFFF, v >> 16)
    elif head == ".nv.info":
      for fn, regs in re.findall(r"function: (\w+)\(0x[0-9a-f]+\)\s+register count: (\d+)", block):
        kernels.setdefault(fn, {"params": []})["registers"] = int(regs)
      for fn, frame in re.findall(r"function: (\w+)\(0x[0-9a-f]+\)\s+frame size: (0x[0-9a-f]+)", block):
        kernels.setdefault(fn, {"params": []})["frame"] = int(frame, 16)
  for name, k in kernels.items():
    k["params"].sort()
    k["cbank0_size"] = sizes.get(f".nv.constant0.{name}")
    k["shared_size"] = sizes.get(f".nv.shared.{name}", 0)
  return kernels


# a hand-written kernel with parameters of several sizes, static shared memory and a local array that
# stays in memory (dynamically indexed), so every field the reader returns is non-trivial
MIXED = """
.visible .entry mixed(.param .u64 out, .param .u32 n, .param .u8 flag, .param .f64 scale, .param .u16 h)
.maxntid 128, 1, 1
{
  .reg .pred %p<2>;
  .reg .b32 %r<8>;
  .reg .b64 %rd<6>;
  .shared .align 4 .b8 tile[512];
  .local .align 4 .b8 scratch[192];
  ld.param.u64 %rd0, [out];
  cvta.to.global.u64 %rd0, %rd0;
  ld.param.u32 %r0, [n];
  ld.param.u8 %r7, [flag];
  mov.u32 %r1, %tid.x;
  and.b32 %r2, %r1, 47;
  shl.b32 %r2, %r2, 2;
  mov.u64 %rd1, scratch;
  cvt.u64.u32 %rd2, %r2;
  add.s64 %rd1, %rd1, %rd2;
  st.local.u32 [%rd1], %r0;
  shl.b32 %r3, %r1, 2;
  mov.u32 %r4, tile;
  add.s32 %r4, %r4, %r3;
  st.shared.u32 [%r4], %r1;
  bar.sync 0;
  and.b32 %r5, %r0, 47;
  shl.b32 %r5, %r5, 2;
  mov.u64 %rd3, scratch;
  cvt.u64.u32 %rd4, %r5;
  add.s64 %rd3, %rd3, %rd4;
  ld.local.u32 %r6, [%rd3];
  ld.shared.u32 %r5, [%r4+4];
  add.s32 %r6, %r6, %r5;
  add.s32 %r6, %r6, %r7;
  st.global.u32 [%rd0], %r6;
  ret;
}
"""


def _ptxas_v(ptxas, src, arch, tmp_path) -> str:
  p = tmp_path / f"v_{arch}.ptx"
  p.write_text(src)
  proc = subprocess.run([ptxas, f"-arch={arch}", "-O3", "-v", str(p), "-o", str(tmp_path / f"v_{arch}.cubin")],
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  return proc.stdout + proc.stderr


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89", "sm_90"])
def test_cubin_reader_agrees_with_cuobjdump(captured, ptxas, cuobjdump, arch, tmp_path):
  # kernels with every parameter count the suite has (with and without variables), plus MIXED
  picks = {}
  for k in captured["kernels"]:
    picks.setdefault((k["n_params"], len(k["variables"])), k)
  assert len(picks) >= 3 and any(v for _, v in picks), f"too few parameter layouts in the op suite: {sorted(picks)}"
  src = PTXRenderer(arch).header() + MIXED + "\n".join(k["entry"].replace("__KERNEL__", k["entry_name"]) for k in picks.values())
  data = compile_ptx(src, arch)
  (tmp_path / "k.cubin").write_bytes(data)
  dump = subprocess.run([cuobjdump, "-elf", str(tmp_path / "k.cubin")], capture_output=True, text=True, timeout=120)
  assert dump.returncode == 0, dump.stderr
  want = parse_cuobjdump_elf(dump.stdout)
  got = load_cubin(data)
  assert set(got) == set(want) == {"mixed"} | {k["entry_name"] for k in picks.values()}
  for name, k in got.items():
    w = want[name]
    assert [(p.ordinal, p.offset, p.size) for p in k.params] == w["params"], name
    assert (k.param_base, k.param_size) == w["cbank"], name
    assert k.param_base == PARAM_BASE[arch]
    assert k.registers == w["registers"] and k.cbank0_size == w["cbank0_size"], name
    assert k.shared_size == w["shared_size"] and k.stack_size == w["frame"], name
  mixed = got["mixed"]
  assert [(p.offset, p.size) for p in mixed.params] == [(0, 8), (8, 4), (12, 1), (16, 8), (24, 2)]
  assert mixed.max_threads == (128, 1, 1) and mixed.barriers == 1
  # ptxas -v, an independent report of the same compile
  report = _ptxas_v(ptxas, PTXRenderer(arch).header() + MIXED, arch, tmp_path)
  section = report[report.index("Function properties for mixed"):]
  assert f"Used {mixed.registers} registers" in section
  assert f"{mixed.stack_size} bytes stack frame" in section and mixed.stack_size >= 192
  assert re.search(r"(\d+) bytes smem", section).group(1) == "512"
  assert mixed.shared_size == 512 + (1024 if arch == "sm_90" else 0)   # sm_90: 1 KiB reserved at the start


def test_build_cbuf0_places_parameters(captured, ptxas):
  k = next(k for k in captured["kernels"] if k["n_params"] >= 2 and k["variables"])
  count = k["n_params"] + len(k["variables"])
  for arch in ARCHS:
    src = PTXRenderer(arch).header() + "\n" + k["entry"].replace("__KERNEL__", "kk")
    info = load_cubin(compile_ptx(src, arch))["kk"]
    values = [0x7F00_0000_1000 + 0x100 * i for i in range(k["n_params"])] + [-3] * len(k["variables"])
    buf = info.build_cbuf0(values)
    assert len(buf) == info.cbank0_size
    for i, v in enumerate(values):
      at = PARAM_BASE[arch] + 8 * i
      assert int.from_bytes(buf[at:at + 8], "little", signed=True) == v
    assert not any(buf[:PARAM_BASE[arch]]) and not any(buf[PARAM_BASE[arch] + 8 * count:])
    with pytest.raises(ValueError, match=f"takes {count} parameters"):
      info.build_cbuf0(values[:-1])


# ---------------------------------------------------------------------------------------------
# compile_ptx: cache and errors
# ---------------------------------------------------------------------------------------------

TRIVIAL = ".visible .entry trivial(.param .u64 p)\n{\n  .reg .b64 %rd<2>;\n  ld.param.u64 %rd0, [p];\n  cvta.to.global.u64 %rd1, %rd0;\n  st.global.u32 [%rd1], 7;\n  ret;\n}\n"


def test_compile_ptx_caches(ptxas, tmp_path, monkeypatch):
  monkeypatch.setattr(settings, "BAREGRAD_CACHE", str(tmp_path))
  src = PTXRenderer("sm_90").header() + TRIVIAL
  before = dict(cubin.stats)
  first = compile_ptx(src, "sm_90")
  second = compile_ptx(src, "sm_90")
  assert first == second and first[:4] == b"\x7fELF"
  assert cubin.stats["compiles"] == before["compiles"] + 1 and cubin.stats["cache_hits"] == before["cache_hits"] + 1
  assert len(list((tmp_path / "ptxas").glob("*.cubin"))) == 1
  other = compile_ptx(src.replace("sm_90", "sm_80"), "sm_80")   # another arch is another entry
  assert other != first and len(list((tmp_path / "ptxas").glob("*.cubin"))) == 2


def test_missing_ptxas_is_a_clear_error(tmp_path, monkeypatch):
  monkeypatch.setenv("PATH", str(tmp_path))          # no ptxas on PATH
  monkeypatch.setattr(settings, "PTXAS", None)
  monkeypatch.setattr(cubin, "_wheel_ptxas", lambda: None)   # nor from the wheel
  with pytest.raises(PtxasNotFound, match=r"baregrad\[nv\] \(pip install nvidia-cuda-nvcc\) or put ptxas on PATH"):
    compile_ptx(PTXRenderer().header(), "sm_90")
  monkeypatch.setattr(settings, "PTXAS", str(tmp_path / "nope"))
  with pytest.raises(PtxasNotFound, match="PTXAS="):
    compile_ptx(PTXRenderer().header(), "sm_90")


def test_ptx_syntax_error_reports_ptxas_message(ptxas, tmp_path, monkeypatch):
  monkeypatch.setattr(settings, "BAREGRAD_CACHE", str(tmp_path))
  bad = PTXRenderer("sm_90").header() + TRIVIAL.replace("st.global.u32", "st.global.bogus")
  with pytest.raises(PtxasError) as info:
    compile_ptx(bad, "sm_90")
  msg = str(info.value)
  assert "ptxas failed" in msg and "sm_90" in msg
  assert re.search(r"line 9; error", msg), msg          # ptxas's own message, with the line
  assert " 9 |   st.global.bogus" in msg               # and the numbered source
  assert not list((tmp_path / "ptxas").glob("*.cubin"))   # failures are not cached
