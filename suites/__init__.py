"""What is tested: one module per family, each exposing ``SPECS: list[OpSpec]``."""
