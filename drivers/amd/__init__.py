"""AMD driver layer: RDNA3 instruction tables and decoder (shared with compiler/amd), code objects."""
