"""Where a process runs: device and dtype, threads, RNG, memory, torchrun, and the kernels for the
hardware.

- :mod:`.device`: device, dtype, CPU threads, RNG state, memory checks;
- :mod:`.distributed`: torchrun's process group, DDP and FSDP2 wrapping;
- :mod:`.kernels`: faster CPU kernels (oneDNN linear layers, dropout) swapped into a built model.
"""
