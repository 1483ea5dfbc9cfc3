"""The collectives family, one module per op; suites/collectives.py gathers their specs."""
