"""The CPU loader's AArch64 link step (drivers/cpu/elf.py link_elf), checked byte for byte against an independent
linker on any host: llvm-mc assembles an AArch64 object that uses every relocation type the loader applies, link_elf
links it at a fixed base, ld.lld links the same object with a linker script that puts every section (and its GOT)
at the address link_elf chose, and every loaded byte must agree."""
import io, shutil, struct, subprocess
import pytest
from elftools.elf.elffile import ELFFile
from baregrad.drivers.cpu import elf
from baregrad.drivers.cpu.elf import ElfError, link_elf, load_elf

MC = next(filter(shutil.which, ("llvm-mc-19", "llvm-mc")), None)
LLD = next(filter(shutil.which, ("ld.lld-19", "ld.lld")), None)
pytestmark = pytest.mark.skipif(not (MC and LLD), reason="needs llvm-mc and ld.lld (LLVM 19) to assemble AArch64 "
                                "objects and to link them as the reference")
BASE = 0x10000000
# the resolver's addresses: near_ext within a branch's +-128 MiB of the image, far_ext far beyond (-> a stub),
# the others sized for the checked MOVW/ABS16 forms; weak_ext stays unresolved (a call to it falls through)
EXTERNALS = {"near_ext": BASE + (64 << 20), "far_ext": 0x7F1234567890, "mid_ext": 0x12345678, "tiny_ext": 0x1234,
             "neg_ext": -0x1234, "weak_ext": 0}

# Every type of elf.AARCH64_RELOCS (test_every_relocation_type_is_used checks that). GOT slot order: link_elf gives
# slots in the order of the first GOT reference, lld gives global symbols in symbol-table order (the assembler's
# order of first mention), then local ones; the GOT references below come in that order (near_ext, data_word,
# far_ext, local_obj), so both GOTs agree slot for slot. The far calls sit in the last code section: lld appends its
# range-extension thunk after it, where link_elf's stubs are, and no section of the script overlaps it.
ASM = r"""
  .text
  .globl entry
  .type entry, %function
  .p2align 2
entry:
  .reloc ., R_AARCH64_NONE, entry
  bl helper
  b helper
  bl near_ext
  b near_ext
  bl weak_ext
  b.ne helper
  cbz x0, helper
  tbz x0, #3, helper
  tbnz w1, #31, helper
  ldr x1, rodata_quad
  ldr w1, rodata_word
  ldr x1, :got:near_ext
  adr x2, rodata_word
  adr x2, helper
  adrp x3, rodata_word
  add x3, x3, :lo12:rodata_word
  adrp x4, :pg_hi21_nc:data_bytes
  ldrb w5, [x4, :lo12:data_bytes]
  strb w5, [x4, :lo12:data_bytes+1]
  ldrh w5, [x4, :lo12:data_half]
  ldr w5, [x4, :lo12:data_word]
  ldr x5, [x4, :lo12:data_dword]
  ldr q5, [x4, :lo12:data_quad]
  adrp x6, bss_buf
  str q5, [x6, :lo12:bss_buf+16]
  str x5, [x6, :lo12:bss_buf+8]
  add x6, x6, :lo12:bss_buf+4096
  adrp x6, bss_buf+0x1800
  ldr x5, [x6, :lo12:bss_buf+0x1808]
  add x6, x6, :lo12:bss_buf+0x1800
  adrp x7, :got:near_ext
  ldr x7, [x7, :got_lo12:near_ext]
  adrp x9, :got:data_word
  ldr x9, [x9, :got_lo12:data_word]
  adrp x8, :got:far_ext
  ldr x8, [x8, :got_lo12:far_ext]
  adrp x9, :got:local_obj
  ldr x9, [x9, :got_lo12:local_obj]
  movz x10, #:abs_g3:far_ext
  movk x10, #:abs_g2_nc:far_ext
  movk x10, #:abs_g1_nc:far_ext
  movk x10, #:abs_g0_nc:far_ext
  movz x11, #:abs_g0:tiny_ext
  movz x11, #:abs_g1:mid_ext
  movz x11, #:abs_g2:far_ext
  movz x12, #:abs_g0_s:neg_ext
  movz x12, #:abs_g1_s:neg_ext
  movz x12, #:abs_g2_s:neg_ext
  movz x12, #:abs_g0_s:tiny_ext
  movz x12, #:abs_g1_s:mid_ext
  ret

  .section .text.far,"ax",@progbits
  .globl helper
  .type helper, %function
  .p2align 4
helper:
  bl entry
  b.eq entry
  tbnz x1, #40, entry
  adr x2, entry
  ldr w3, entry
  bl far_ext
  b far_ext
  nop
  ret
  .org 0x840
  adrp x0, rodata_word          // a place with bit 11 set (0x10000900): Page(P) must clear it
  ret

  .section .rodata,"a",@progbits
  .p2align 4
rodata_word: .word 0x11223344
  .p2align 3
rodata_quad:
  .quad entry
  .quad helper + 12
  .word near_ext
  .word data_word - 8
  .hword tiny_ext
  .hword -2
  .quad far_ext - .
  .word helper - .
  .word near_ext - .
  .hword entry - .
  .hword data_word - .

  .data
  .p2align 4
  .globl data_word
data_bytes: .byte 1, 2, 3, 4
data_half: .hword 5
  .p2align 2
data_word: .word 6
  .p2align 3
data_dword: .quad helper
  .p2align 4
data_quad: .quad 7, 8
local_obj: .quad entry + 4
  .word rodata_word - .

  .bss
  .p2align 4
bss_buf: .zero 8192
  .weak weak_ext
"""
STUB_ASM = "ldr x16, #8\nbr x16\n"   # what a stub's two instructions must be


def assemble(tmp_path, src: str, name="t") -> bytes:
  (tmp_path / f"{name}.s").write_text(src)
  subprocess.run([MC, "-triple=aarch64-linux-gnu", "-filetype=obj", f"{name}.s", "-o", f"{name}.o"], cwd=tmp_path,
                 check=True, capture_output=True)
  return (tmp_path / f"{name}.o").read_bytes()


def text_of(obj: bytes) -> bytes: return ELFFile(io.BytesIO(obj)).get_section_by_name(".text").data()


@pytest.fixture(scope="module")
def linked(tmp_path_factory):
  """(object bytes, link_elf's result, lld's output file, the object's loaded sections as (name, size))"""
  tmp = tmp_path_factory.mktemp("a64")
  obj = assemble(tmp, ASM)
  asked = []
  mine = link_elf(obj, lambda size, align: asked.append((size, align)) or BASE, EXTERNALS.__getitem__)
  assert asked == [(len(mine.image), elf.PAGE)] and mine.base == BASE
  places = sorted([(at, f"  {name} {at:#x} : {{ t.o({name}) }}\n") for name, at in mine.sections.items()] +
                  [(mine.got, f"  .got {mine.got:#x} : {{ *(.got) }}\n")])   # output sections in address order
  (tmp / "t.ld").write_text("SECTIONS {\n" + "".join(line for _, line in places) + "}\n")
  defsyms = [f"--defsym={name}={'-' if at < 0 else ''}{abs(at):#x}" for name, at in EXTERNALS.items() if at]
  subprocess.run([LLD, "-static", "--no-pie", "--no-relax", "-e", "entry", "-T", "t.ld", *defsyms, "t.o", "-o", "t.out"],
                 cwd=tmp, check=True, capture_output=True)
  sections = [(s.name, s["sh_size"]) for s in ELFFile(io.BytesIO(obj)).iter_sections() if s["sh_flags"] & elf.SHF_ALLOC]
  return obj, mine, ELFFile(io.BytesIO((tmp / "t.out").read_bytes())), sections


def far_call_offsets(obj: bytes) -> set:
  """Offsets in .text.far of the branches to far_ext (lld sends them to its own thunk, link_elf to its stub)."""
  f = ELFFile(io.BytesIO(obj))
  syms = list(f.get_section_by_name(".symtab").iter_symbols())
  return {r["r_offset"] for r in f.get_section_by_name(".rela.text.far").iter_relocations()
          if syms[r["r_info_sym"]].name == "far_ext"}


def insn_at(image: bytes, at: int) -> int: return struct.unpack_from("<I", image, at)[0]


def branch_target(insn: int, at: int) -> int:   # B/BL: imm26 in bits [25:0], in words, signed
  return at + (((insn & 0x3FFFFFF) ^ 0x2000000) - 0x2000000) * 4


def test_every_relocation_type_is_used(linked):
  obj = linked[0]
  used = {r["r_info_type"] for s in ELFFile(io.BytesIO(obj)).iter_sections() if s["sh_type"] == "SHT_RELA"
          for r in s.iter_relocations()}
  assert set(elf.AARCH64_RELOCS) | {0} <= used, sorted(set(elf.AARCH64_RELOCS) - used)


def test_matches_lld_byte_for_byte(linked):
  obj, mine, theirs, sections = linked
  far = far_call_offsets(obj)
  for name, size in sections:
    out = theirs.get_section_by_name(name)
    assert out["sh_addr"] == mine.sections[name], name
    at = mine.sections[name] - BASE
    if out["sh_type"] == "SHT_NOBITS":
      assert mine.image[at:at + size] == bytes(size), name
      continue
    ref, got = bytearray(out.data()[:size]), bytearray(mine.image[at:at + size])
    if name == ".text.far":   # the far branches differ by design: checked in test_far_calls_go_through_stubs
      for off in far: ref[off:off + 4] = got[off:off + 4] = b"...."
    words = [f"{name}+{i:#x}: mine {got[i:i + 4].hex()} lld {ref[i:i + 4].hex()}" for i in range(0, size, 4)
             if got[i:i + 4] != ref[i:i + 4]]
    assert not words, "\n".join(words)
  got_out = theirs.get_section_by_name(".got")
  assert mine.got_slots == ["near_ext", "data_word", "far_ext", "local_obj"]
  assert got_out["sh_addr"] == mine.got and got_out.data() == bytes(mine.image[mine.got - BASE:][:8 * len(mine.got_slots)])
  lld_symbols = {s.name: s["st_value"] for s in theirs.get_section_by_name(".symtab").iter_symbols()}
  for name in ("entry", "helper", "data_word", "local_obj", "bss_buf", "rodata_quad"):
    assert mine.symbols[name] == lld_symbols[name], name


def test_far_calls_go_through_stubs(linked, tmp_path):
  obj, mine, theirs, _ = linked
  stub_insns = text_of(assemble(tmp_path, STUB_ASM, "stub"))
  stub = mine.stubs["far_ext"]
  assert stub - BASE + 16 <= mine.parts["text"][1]          # inside the executable part
  assert mine.image[stub - BASE:stub - BASE + 16] == stub_insns + struct.pack("<Q", EXTERNALS["far_ext"])
  lld_text = theirs.get_section_by_name(".text.far")
  for off in sorted(far_call_offsets(obj)):
    at = mine.sections[".text.far"] + off
    insn = insn_at(mine.image, at - BASE)
    assert insn >> 26 in (0b100101, 0b000101)                # still a BL / B
    assert branch_target(insn, at) == stub
    # lld's range-extension thunk for the same branch is the same kind of code (ldr x16 literal; br x16; address)
    lld_at = lld_text["sh_addr"] + off
    thunk = branch_target(insn_at(lld_text.data(), off), lld_at) - lld_text["sh_addr"]
    assert lld_text.data()[thunk:thunk + 16] == mine.image[stub - BASE:stub - BASE + 16]
  # near_ext is within reach: called directly (its stub stays unused)
  bl = insn_at(mine.image, mine.sections[".text"] + 8 - BASE)
  assert branch_target(bl, mine.sections[".text"] + 8) == EXTERNALS["near_ext"]


def test_unsupported_relocation(tmp_path):
  obj = assemble(tmp_path, "  movz x0, #:prel_g0:sym\n")     # R_AARCH64_MOVW_PREL_G0 (287)
  with pytest.raises(ElfError, match=r"unsupported relocation R_AARCH64_MOVW_PREL_G0 \(287\) at \.text\+0x0 against 'sym'"):
    link_elf(obj, BASE, lambda name: 0x1000)


def test_overflow_and_alignment(tmp_path):
  obj = assemble(tmp_path, "  nop\n  b.eq target\n")      # CONDBR19: -2**20 <= X < 2**20, X = target - (BASE + 4)
  for x in (-(1 << 20), (1 << 20) - 4):
    insn = insn_at(link_elf(obj, BASE, lambda name, x=x: BASE + 4 + x).image, 4)
    assert ((insn >> 5 & 0x7FFFF ^ 0x40000) - 0x40000) * 4 == x
  for x in (-(1 << 20) - 4, 1 << 20):
    with pytest.raises(ElfError, match=r"relocation overflow: R_AARCH64_CONDBR19 \(280\) at \.text\+0x4 against 'target'"):
      link_elf(obj, BASE, lambda name, x=x: BASE + 4 + x)
  obj = assemble(tmp_path, "  adrp x0, value\n  ldr x1, [x0, :lo12:value]\n")
  with pytest.raises(ElfError, match=r"misaligned relocation R_AARCH64_LDST64_ABS_LO12_NC \(286\) at \.text\+0x4"):
    link_elf(obj, BASE, lambda name: 0x1004)


def test_load_refuses_a_foreign_machine(tmp_path):
  """load_elf runs code, so it takes only the host's machine (here: an AArch64 object on x86-64, or the reverse)."""
  if elf._HOST_MACHINE is None: pytest.skip("the loader runs code on x86-64 and AArch64 hosts only")
  obj = assemble(tmp_path, "  ret\n")
  if elf._HOST_MACHINE == elf.EM_AARCH64:
    subprocess.run([MC, "-triple=x86_64-linux-gnu", "-filetype=obj", "t.s", "-o", "t.o"], cwd=tmp_path, check=True)
    obj = (tmp_path / "t.o").read_bytes()
  foreign, host = (("EM_X86_64", "EM_AARCH64") if elf._HOST_MACHINE == elf.EM_AARCH64 else ("EM_AARCH64", "EM_X86_64"))
  with pytest.raises(ElfError, match=rf"{foreign} is not supported on this host .*only from {host} objects"):
    load_elf(obj)
  assert link_elf(obj, BASE).machine != elf._HOST_MACHINE     # linking it (no running) is fine
