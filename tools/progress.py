"""The progress bar for tools (implemented at the drivers level so every layer can use it)."""
from baregrad.drivers.progress import Progress, progress

__all__ = ["Progress", "progress"]
