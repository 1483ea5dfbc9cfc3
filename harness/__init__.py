"""kernel-harness: correctness and performance regression harness for GPU kernels and
collectives. Importing it touches neither CUDA nor MPI."""

__version__ = "0.1.0"
