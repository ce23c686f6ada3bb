"""RDNA3 (gfx1100) assembler and disassembler, written without LLVM."""
