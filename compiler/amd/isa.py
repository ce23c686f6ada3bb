"""Re-export: the RDNA3 instruction tables live in the driver layer (baregrad.drivers.amd.isa)."""
from baregrad.drivers.amd.isa import *  # noqa: F401,F403
