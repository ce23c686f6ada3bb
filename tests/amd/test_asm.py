"""The gfx1100 assembler/disassembler checked against llvm-mc-19, the independent reference.

One batched llvm-mc call assembles the whole corpus (thousands of instructions); our encoder must
produce the same bytes. A second batched call disassembles those bytes; our decoder must print
the same text. Instructions llvm rejects are dropped (and counted).
"""
import os
import re
import shutil
import subprocess
import tempfile

import pytest
from elftools.elf.elffile import ELFFile

from baregrad.drivers.amd import isa
from baregrad.compiler.amd.asm import AsmError, assemble, encode
from baregrad.drivers.amd.disasm import disassemble
from gfx11_corpus import corpus

LLVM_MC = "llvm-mc-19"
MC_ARGS = ["-triple=amdgcn-amd-amdhsa", "-mcpu=gfx1100"]
MIN_CHECKED = 3000


def _need_llvm() -> str:
  path = shutil.which(LLVM_MC)
  if path is None:
    message = f"{LLVM_MC} not found (apt-get install llvm-19); it is the reference for these tests"
    if os.environ.get("CI"): pytest.fail(message)
    pytest.skip(message)
  return path


def _run_mc(args: list[str], text: str) -> subprocess.CompletedProcess:
  proc = subprocess.run([_need_llvm(), *MC_ARGS, *args], input=text, capture_output=True, text=True, timeout=120)
  assert "is not a recognized processor" not in proc.stderr, proc.stderr[:500]
  return proc


def _encodings(stdout: str) -> list[tuple[str, bytes]]:
  out = []
  for line in stdout.splitlines():
    if "; encoding:" not in line: continue
    text, enc = line.split("; encoding:")
    out.append((text.strip(), bytes(int(x, 16) for x in re.findall(r"0x[0-9a-fA-F]+", enc))))
  return out


def llvm_assemble(lines: list[str]) -> list[bytes | None]:
  """llvm's bytes for every line (None where llvm rejects it), in one process."""
  proc = _run_mc(["-show-encoding"], "\n".join(lines) + "\n")
  rejected = {int(m[1]) - 1 for m in re.finditer(r"<stdin>:(\d+):\d+: error", proc.stderr)}
  encoded = iter(_encodings(proc.stdout))
  result = [None if i in rejected else next(encoded)[1] for i in range(len(lines))]
  assert next(encoded, None) is None, "llvm-mc printed more encodings than accepted lines"
  return result


def llvm_disassemble(blobs: list[bytes]) -> list[str | None]:
  """llvm's text for every instruction (None where it cannot decode it), batched.

  Without invalid words llvm prints exactly one line per input line. Lines with an invalid word
  (reported on stderr as line:column) are dropped and the rest disassembled again.
  (-show-encoding is not used: it prints llvm's re-encoding, which can differ from the input.)"""
  result: list[str | None] = [None] * len(blobs)
  todo = list(range(len(blobs)))
  for _ in range(4):
    text = "\n".join(",".join(f"0x{b:02x}" for b in blobs[i]) for i in todo) + "\n"
    proc = _run_mc(["-disassemble"], text)
    invalid = {int(m[1]) - 1 for m in re.finditer(r"<stdin>:(\d+):\d+: warning: invalid", proc.stderr)}
    if invalid:
      todo = [i for k, i in enumerate(todo) if k not in invalid]
      continue
    outputs = [line.strip() for line in proc.stdout.splitlines() if line.startswith("\t") and line.strip() != ".text"]
    assert len(outputs) == len(todo), "llvm-mc printed a different number of instructions"
    for i, out in zip(todo, outputs):
      # llvm marks operands it would not accept back with a /* comment */: not a reference text
      result[i] = None if "/*" in out else out
    break
  return result


@pytest.fixture(scope="module")
def checked():
  lines = corpus()
  reference = llvm_assemble(lines)
  accepted = [(line, ref) for line, ref in zip(lines, reference) if ref is not None]
  print(f"\ncorpus: {len(lines)} instructions, llvm-mc-19 rejected {len(lines) - len(accepted)}, "
        f"kept {len(accepted)}")
  texts = llvm_disassemble([ref for _, ref in accepted])
  undecodable = sum(t is None for t in texts)
  print(f"llvm-mc-19 could not disassemble {undecodable} of its own encodings (dropped)")
  return [(line, ref, text) for (line, ref), text in zip(accepted, texts) if text is not None]


def _report(failures: list[str], total: int):
  assert not failures, f"{len(failures)} of {total} differ from llvm-mc-19:\n" + "\n".join(failures[:25])


def test_corpus_is_large(checked):
  mnemonics = {line.split()[0] for line, _, _ in checked}
  print(f"checked {len(checked)} instructions, {len(mnemonics)} distinct mnemonics")
  assert len(checked) >= MIN_CHECKED
  assert len({line for line, _, _ in checked}) == len(checked)


def test_encode_matches_llvm(checked):
  failures = []
  for line, ref, _ in checked:
    try:
      got = encode(line)
    except AsmError as e:
      failures.append(f"  {line}: AsmError {e}")
      continue
    if got != ref: failures.append(f"  {line}: ours {got.hex()} llvm {ref.hex()}")
  _report(failures, len(checked))


def test_disassemble_matches_llvm(checked):
  failures = []
  for line, ref, text in checked:
    try:
      got = disassemble(ref)
    except Exception as e:  # report every kind of decoder failure with the instruction
      failures.append(f"  {ref.hex()} ({line}): {type(e).__name__} {e}")
      continue
    if got != [text]: failures.append(f"  {ref.hex()}: ours {got} llvm {text!r}")
  _report(failures, len(checked))


def test_round_trip(checked):
  """decode(encode(x)) is llvm's canonical text; encoding that text again gives the same bytes,
  or, where llvm's printing is lossy (16-bit integer operands print inline floats as 0x3c00, which
  reads back as a literal), the same bytes llvm-mc-19 gives for that text."""
  failures, lossy = [], []
  for line, ref, text in checked:
    try:
      ours = encode(line)
      canonical = disassemble(ours)
      again = encode(canonical[0])
    except Exception as e:
      failures.append(f"  {line}: {type(e).__name__} {e}")
      continue
    if canonical != [text]: failures.append(f"  {line}: {canonical} != {text!r}")
    elif again != ours: lossy.append((canonical[0], again))
  if lossy:
    print(f"{len(lossy)} canonical texts do not read back to the same bytes; checking them against llvm")
    for (text, again), ref in zip(lossy, llvm_assemble([text for text, _ in lossy])):
      if again != ref: failures.append(f"  {text}: ours {again.hex()} llvm {ref.hex() if ref else None}")
  _report(failures, len(checked))


def test_table_size():
  assert len(isa.BY_NAME) >= 500
  for fmt in ("SOP1", "SOP2", "SOPK", "SOPC", "SOPP", "SMEM", "VOP1", "VOP2", "VOPC", "VOP3", "VOP3P", "DS",
              "FLAT", "GLOBAL", "SCRATCH"):
    assert isa.TABLES[fmt], fmt


def test_program_with_labels():
  program = """
  ; a loop: count s0 down to zero
  s_mov_b32 s0, 10          // literal-free inline constant
  loop:
    s_sub_u32 s0, s0, 1
    s_cmp_lg_u32 s0, 0
    s_cbranch_scc1 loop
  s_branch done
  v_mov_b32 v0, 0x12345678
  done: s_endpgm
  """
  code = assemble(program)
  text = disassemble(code)
  assert text == ["s_mov_b32 s0, 10", "s_sub_u32 s0, s0, 1", "s_cmp_lg_u32 s0, 0",
                  "s_cbranch_scc1 65533", "s_branch 2", "v_mov_b32_e32 v0, 0x12345678", "s_endpgm"]
  # the same program through llvm, which resolves the labels itself when writing an object file
  with tempfile.TemporaryDirectory() as tmp:
    obj = os.path.join(tmp, "k.o")
    proc = _run_mc(["-filetype=obj", "-o", obj], program)
    assert proc.returncode == 0 and "error" not in proc.stderr, proc.stderr
    with open(obj, "rb") as f:
      text_section = ELFFile(f).get_section_by_name(".text").data()
  assert text_section == code


@pytest.mark.parametrize("line, message", [
  ("v_frobnicate_f32 v0, v1, v2", "unknown mnemonic"),
  ("v_add_f32 v0, v1, x7", "cannot parse operand"),
  ("v_add_f32 v0, v1, v256", "out of range"),
  ("s_mov_b32 s106, s1", "out of range"),
  ("s_mov_b64 s[1:2], s[4:5]", "aligned"),
  ("s_mov_b32 s0, v1", "VGPRs"),
  ("v_add_f32 v0, v1", "operand"),
  ("v_readlane_b32 s0, v1, 0x1234", "literal"),
  ("v_add_f64 v[0:1], v[2:3], v4", "registers"),
  ("v_add_nc_u16 v0, 0x12345, v1", "16 bits"),
  ("s_waitcnt vmcnt(64)", "out of range"),
  ("ds_load_b32 v1, v2 offset:65536", "out of range"),
  ("global_load_b32 v1, v2, s[2:3] offset:5000", "out of range"),
  ("v_add_nc_u32 v0, v1, v2 mul:2", "not allowed"),
  ("v_add_f32 v0, 0x12345678, 0x87654321", "one literal"),
  ("s_branch nowhere", "label"),
])
def test_errors(line, message):
  with pytest.raises(AsmError, match=message):
    encode(line)


def test_assemble_error_names_line():
  with pytest.raises(AsmError, match="line 2"):
    assemble("s_nop 0\nv_bogus v0\n")
  with pytest.raises(AsmError, match="undefined label"):
    assemble("s_branch missing\n")
