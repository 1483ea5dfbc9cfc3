"""The fp8_gemm family; suites/fp8_gemm.py gathers the specs."""
