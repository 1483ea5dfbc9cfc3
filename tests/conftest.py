"""The test process runs implementations in-process on the CPU (harness.local), a CPU rank
of its own: Triton kernels there go through Triton's interpreter, which must be on before
anything imports triton, since triton.language's own ``@jit`` functions (``tl.max``,
``tl.sum``) are compiled or interpreted when triton is imported (harness/triton_impl.py)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
