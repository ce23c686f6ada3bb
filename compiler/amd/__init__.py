"""RDNA3 (gfx1100) instruction objects, their encoder, register allocation; the tables are drivers/amd/isa.py."""
