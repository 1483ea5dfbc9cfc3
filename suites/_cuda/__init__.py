"""Built-in CUDA C++ implementations: each ``NAME.cu`` beside its launch description
``NAME.py``, registered by the op's suite exactly as a user's ``--impl NAME.cu:launch`` is."""

from pathlib import Path

HERE = Path(__file__).parent


def source(name: str) -> Path:
    """The path of a built-in ``.cu`` file."""
    return HERE / name
