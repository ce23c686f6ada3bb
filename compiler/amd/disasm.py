"""Re-export: the RDNA3 decoder lives in the driver layer (baregrad.drivers.amd.disasm)."""
from baregrad.drivers.amd.disasm import *  # noqa: F401,F403
