"""What is tested and how it is judged: op specs and the registry of ops, suite discovery and
the project file, deterministic inputs and the buffers they live in, the comparison of an
output with its reference (tolerances, metrics), goldens, timing and the records of results.
It may import its own modules and ``harness.device``."""
