"""The moe family; suites/moe.py gathers the specs."""
