"""The device layer: CUDA through cuda-python (the driver and its devices, NVRTC compiles and
kernel launches), NVML telemetry, where each rank runs and on which GPU (placement, the
bring-up checklist, the runtime ``World``), device memory, compute-sanitizer, the Python files
an implementation is loaded from, and implementations written as CUDA C++ or Triton kernels.
It imports nothing of the harness above it: only its own modules (and ``harness`` itself, for
the version)."""
