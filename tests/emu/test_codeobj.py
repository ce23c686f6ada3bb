"""The code-object writer checked with LLVM's tools: llvm-objdump-19 disassembles the code and
prints the kernel descriptor, llvm-readelf-19 reads header, symbols and metadata note, and a
reference object built by llvm-mc-19 + ld.lld-19 from the same source with .amdhsa_kernel
directives has the same descriptor, field by field."""
import dataclasses
import io
import os
import re
import shutil
import subprocess

import pytest
from elftools.elf.elffile import ELFFile

from baregrad.compiler.amd.asm import assemble
from baregrad.drivers.amd.codeobj import (CodeObjectError, KD_FIELDS, KernelDescriptor, msgpack, read_code_object,
                                          write_code_object)
from baregrad.drivers.amd.disasm import disassemble

TOOLS = {"mc": "llvm-mc-19", "objdump": "llvm-objdump-19", "readelf": "llvm-readelf-19", "lld": "ld.lld-19"}

SOURCE = """\
  s_load_b128 s[4:7], s[0:1], 0x0
  v_lshl_add_u32 v1, s2, 6, v0
  v_lshlrev_b32 v1, 2, v1
  s_waitcnt lgkmcnt(0)
  global_load_b32 v2, v1, s[4:5]
  s_waitcnt vmcnt(0)
  v_fma_f32 v2, v2, 0x40490fdb, 1.0
  ds_store_b32 v1, v2
  global_store_b32 v1, v2, s[6:7]
  s_endpgm
"""
ARGS = [{".name": "x", ".size": 8, ".offset": 0, ".value_kind": "global_buffer", ".address_space": "global"},
        {".name": "y", ".size": 8, ".offset": 8, ".value_kind": "global_buffer", ".address_space": "global"}]


def tool(name: str) -> str:
  path = shutil.which(TOOLS[name])
  if path is None:
    message = f"{TOOLS[name]} not found (apt-get install llvm-19 lld-19); it is the reference for these tests"
    if os.environ.get("CI"): pytest.fail(message)
    pytest.skip(message)
  return path


def sh(name: str, *args: str, input_text: str | None = None) -> subprocess.CompletedProcess:
  proc = subprocess.run([tool(name), *args], input=input_text, capture_output=True, text=True, timeout=60)
  assert proc.returncode == 0, proc.stderr
  return proc


@pytest.fixture
def ours(tmp_path):
  kd = KernelDescriptor.for_kernel(vgprs=12, kernarg_size=16, lds_size=256, workgroup_ids=1, workitem_dims=1)
  data = write_code_object("saxpy", assemble(SOURCE), kd, 16, ARGS, sgpr_count=24, max_flat_workgroup_size=64)
  path = tmp_path / "ours.hsaco"
  path.write_bytes(data)
  return path, data, kd


def test_objdump_disassembles_the_code(ours):
  path, data, _ = ours
  out = sh("objdump", "-d", str(path)).stdout
  assert "<saxpy>:" in out
  lines = [line.split("//")[0].strip() for line in out.splitlines() if line.startswith("\t")]
  assert lines == disassemble(assemble(SOURCE))


def _amdhsa_block(text: str) -> dict:
  fields = {}
  for line in text.splitlines():
    m = re.match(r"\s*(?:\.amdhsa_(\w+)|; (\w+)) (-?\d+|0x[0-9a-fA-F]+)$", line)
    if m: fields[(m[1] or m[2]).lower()] = int(m[3], 0)
  return fields


# our descriptor field -> the name llvm-objdump prints it under (.amdhsa_* or a ; comment)
OBJDUMP_NAMES = {
  "group_segment_fixed_size": "group_segment_fixed_size", "private_segment_fixed_size": "private_segment_fixed_size",
  "kernarg_size": "kernarg_size", "shared_vgpr_count": "shared_vgpr_count", "inst_pref_size": "inst_pref_size",
  "trap_on_start": "trap_on_start", "trap_on_end": "trap_on_end", "image_op": "image_op",
  "float_round_mode_32": "float_round_mode_32", "float_round_mode_16_64": "float_round_mode_16_64",
  "float_denorm_mode_32": "float_denorm_mode_32", "float_denorm_mode_16_64": "float_denorm_mode_16_64",
  "enable_dx10_clamp": "dx10_clamp", "enable_ieee_mode": "ieee_mode", "fp16_ovfl": "fp16_overflow",
  "wgp_mode": "workgroup_processor_mode", "mem_ordered": "memory_ordered", "fwd_progress": "forward_progress",
  "enable_private_segment": "enable_private_segment",
  "enable_sgpr_workgroup_id_x": "system_sgpr_workgroup_id_x", "enable_sgpr_workgroup_id_y": "system_sgpr_workgroup_id_y",
  "enable_sgpr_workgroup_id_z": "system_sgpr_workgroup_id_z", "enable_sgpr_workgroup_info": "system_sgpr_workgroup_info",
  "enable_vgpr_workitem_id": "system_vgpr_workitem_id",
  "enable_exception_ieee_754_fp_invalid_operation": "exception_fp_ieee_invalid_op",
  "enable_exception_fp_denormal_source": "exception_fp_denorm_src",
  "enable_exception_ieee_754_fp_division_by_zero": "exception_fp_ieee_div_zero",
  "enable_exception_ieee_754_fp_overflow": "exception_fp_ieee_overflow",
  "enable_exception_ieee_754_fp_underflow": "exception_fp_ieee_underflow",
  "enable_exception_ieee_754_fp_inexact": "exception_fp_ieee_inexact",
  "enable_exception_int_divide_by_zero": "exception_int_div_zero",
  "enable_sgpr_dispatch_ptr": "user_sgpr_dispatch_ptr", "enable_sgpr_queue_ptr": "user_sgpr_queue_ptr",
  "enable_sgpr_kernarg_segment_ptr": "user_sgpr_kernarg_segment_ptr", "enable_sgpr_dispatch_id": "user_sgpr_dispatch_id",
  "enable_sgpr_private_segment_size": "user_sgpr_private_segment_size", "enable_wavefront_size32": "wavefront_size32",
  "uses_dynamic_stack": "uses_dynamic_stack",
}


def test_objdump_prints_the_descriptor_we_packed(ours):
  path, _, kd = ours
  out = sh("objdump", "-D", "-j", ".rodata", str(path)).stdout
  assert ".amdhsa_kernel saxpy" in out and ".end_amdhsa_kernel" in out
  printed = _amdhsa_block(out)
  for ours_name, llvm_name in OBJDUMP_NAMES.items():
    assert printed[llvm_name] == getattr(kd, ours_name), ours_name
  assert printed["next_free_vgpr"] == (kd.granulated_workitem_vgpr_count + 1) * 8


def test_readelf_header_symbols_and_metadata(ours):
  path, _, _ = ours
  proc = sh("readelf", "-h", "-s", "--notes", "-l", "-d", str(path))
  assert proc.stderr == ""
  out = proc.stdout
  assert re.search(r"OS/ABI:\s+AMDGPU - HSA", out) and re.search(r"ABI Version:\s+3", out)
  assert re.search(r"Machine:\s+EM_AMDGPU", out) and re.search(r"Flags:\s+0x41, gfx1100", out)
  assert re.search(r"Type:\s+DYN", out)
  assert re.search(r"FUNC\s+GLOBAL\s+PROTECTED\s+\d+ saxpy$", out, re.M)
  assert re.search(r"\s64 OBJECT\s+GLOBAL\s+DEFAULT\s+\d+ saxpy\.kd$", out, re.M)
  assert "NT_AMDGPU_METADATA" in out
  meta = out[out.index("AMDGPU Metadata"):]
  for key, value in ((".name", "saxpy"), (".symbol", "saxpy.kd"), (".kernarg_segment_size", "16"),
                     (".group_segment_fixed_size", "256"), (".private_segment_fixed_size", "0"), (".sgpr_count", "24"),
                     (".vgpr_count", "16"), (".wavefront_size", "32"), (".max_flat_workgroup_size", "64"),
                     (".value_kind", "global_buffer"), (".offset", "8")):
    assert re.search(rf"{re.escape(key)}:\s+{re.escape(value)}$", meta, re.M), key
  assert re.search(r"amdhsa.version:\s*\n\s+- 1\n\s+- 2", meta)


REFERENCE_DIRECTIVES = """
  .amdhsa_user_sgpr_kernarg_segment_ptr 1
  .amdhsa_next_free_vgpr {vgprs}
  .amdhsa_next_free_sgpr 24
  .amdhsa_kernarg_size {kernarg}
  .amdhsa_group_segment_fixed_size {lds}
  .amdhsa_private_segment_fixed_size {private}
  .amdhsa_enable_private_segment {private_on}
  .amdhsa_system_sgpr_workgroup_id_x 1
  .amdhsa_system_sgpr_workgroup_id_y {wgy}
  .amdhsa_system_sgpr_workgroup_id_z {wgz}
  .amdhsa_system_vgpr_workitem_id {workitem}
  .amdhsa_wavefront_size32 1
  .amdhsa_float_denorm_mode_32 {denorm32}
  .amdhsa_float_round_mode_16_64 {round16}
  .amdhsa_ieee_mode {ieee}
  .amdhsa_forward_progress {fwd}
  .amdhsa_exception_int_div_zero {divz}
"""
CASES = [
  dict(vgprs=12, kernarg=16, lds=256, private=0, private_on=0, wgy=0, wgz=0, workitem=0, denorm32=0, round16=0, ieee=1, fwd=0, divz=0),
  dict(vgprs=40, kernarg=120, lds=65536, private=64, private_on=1, wgy=1, wgz=1, workitem=2, denorm32=3, round16=2, ieee=0, fwd=1, divz=1),
]


def _reference(tmp_path, case) -> bytes:
  src = (".amdgcn_target \"amdgcn-amd-amdhsa--gfx1100\"\n.text\n.globl saxpy\n.p2align 8\n.type saxpy,@function\nsaxpy:\n"
         + SOURCE + ".rodata\n.p2align 6\n.amdhsa_kernel saxpy" + REFERENCE_DIRECTIVES.format(**case) + ".end_amdhsa_kernel\n")
  (tmp_path / "k.s").write_text(src)
  sh("mc", "-triple=amdgcn-amd-amdhsa", "-mcpu=gfx1100", "-filetype=obj", str(tmp_path / "k.s"), "-o", str(tmp_path / "k.o"))
  sh("lld", "-shared", str(tmp_path / "k.o"), "-o", str(tmp_path / "k.hsaco"))
  return (tmp_path / "k.hsaco").read_bytes()


@pytest.mark.parametrize("case", CASES, ids=["defaults", "non_default_fields"])
def test_descriptor_matches_llvm_reference(tmp_path, case):
  ref = _reference(tmp_path, case)
  ref_code, ref_kd, ref_entry, ref_name = read_code_object(ref)
  kd = KernelDescriptor.for_kernel(
    vgprs=case["vgprs"], kernarg_size=case["kernarg"], lds_size=case["lds"], private_size=case["private"],
    workgroup_ids=1 + case["wgy"] + case["wgz"], workitem_dims=case["workitem"] + 1,
    float_denorm_mode_32=case["denorm32"], float_round_mode_16_64=case["round16"], enable_ieee_mode=case["ieee"],
    fwd_progress=case["fwd"], enable_exception_int_divide_by_zero=case["divz"])
  data = write_code_object("saxpy", assemble(SOURCE), kd, case["kernarg"], ARGS)
  code, our_kd, entry, name = read_code_object(data)
  assert (name, entry) == (ref_name, ref_entry) == ("saxpy", 0)
  assert code == ref_code
  for field, *_ in KD_FIELDS:
    if field == "kernel_code_entry_byte_offset": continue       # depends on the section layout
    assert getattr(our_kd, field) == getattr(ref_kd, field), field
  # the ELF identity matches what ld.lld produced
  ours_elf, ref_elf = ELFFile(io.BytesIO(data)), ELFFile(io.BytesIO(ref))
  for key in ("e_type", "e_machine", "e_flags"):
    assert ours_elf.header[key] == ref_elf.header[key], key
  assert ours_elf.header["e_ident"] == ref_elf.header["e_ident"]
  sym = lambda elf: {s.name: (s["st_info"]["type"], s["st_size"] if s.name.endswith(".kd") else 0)
                     for s in elf.get_section_by_name(".dynsym").iter_symbols() if s.name}
  assert sym(ours_elf) == sym(ref_elf)


def test_pack_unpack_roundtrip_and_layout():
  kd = KernelDescriptor.for_kernel(vgprs=64, kernarg_size=0x1234, lds_size=4096, kernel_code_entry_byte_offset=-0x100)
  raw = kd.pack()
  assert len(raw) == 64
  assert KernelDescriptor.unpack(raw) == kd
  assert int.from_bytes(raw[0:4], "little") == 4096 and int.from_bytes(raw[8:12], "little") == 0x1234
  assert int.from_bytes(raw[16:24], "little", signed=True) == -0x100
  assert int.from_bytes(raw[48:52], "little") & 0x3F == 7                    # rsrc1 GRANULATED_WORKITEM_VGPR_COUNT
  assert int.from_bytes(raw[56:58], "little") == (1 << 3) | (1 << 10)       # kernarg ptr, wave32
  with pytest.raises(CodeObjectError, match="does not fit"):
    dataclasses.replace(kd, user_sgpr_count=40).pack()


def test_read_code_object_errors():
  with pytest.raises(CodeObjectError, match="not an ELF"):
    read_code_object(b"hello world")
  good = write_code_object("k", assemble("s_endpgm"), KernelDescriptor.for_kernel(vgprs=8), 0, [])
  with pytest.raises(CodeObjectError, match="malformed"):
    read_code_object(good[:100])
  no_kd = good.replace(b"k.kd\0", b"k_kd\0")
  with pytest.raises(CodeObjectError, match="kernel descriptor symbol"):
    read_code_object(no_kd)


def test_msgpack_encoding():
  # vectors from the MessagePack specification's type formats
  assert msgpack(5) == b"\x05" and msgpack(-1) == b"\xff" and msgpack(200) == b"\xcc\xc8"
  assert msgpack(70000) == b"\xce\x00\x01\x11\x70" and msgpack(-200) == b"\xd1\xff\x38"
  assert msgpack("ab") == b"\xa2ab" and msgpack("x" * 40) == b"\xd9\x28" + b"x" * 40
  assert msgpack([1, 2]) == b"\x92\x01\x02" and msgpack({"a": True}) == b"\x81\xa1a\xc3"
  assert msgpack(list(range(20)))[:3] == b"\xdc\x00\x14"
