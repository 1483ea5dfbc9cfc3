"""RMSNorm in Triton for the op hopper_tasks.rmsnorm: out = x * rsqrt(mean(x^2) + eps) * w."""

import torch
import triton
import triton.language as tl


@triton.jit
def rmsnorm_kernel(x_ptr, w_ptr, out_ptr, hidden, x_row, w_step, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # one program per row
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * x_row + cols, mask=mask, other=0.0).to(tl.float32)
    scale = tl.math.rsqrt(tl.sum(x * x, axis=0) / hidden + eps)
    w = tl.load(w_ptr + cols * w_step, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * hidden + cols, (x * scale * w).to(out_ptr.dtype.element_ty),
             mask=mask)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The op's signature: allocate the output, launch, return it. The inputs may be views
    (a row of a wider buffer): the kernel steps by their strides."""
    if x.stride(1) != 1:
        x = x.contiguous()
    rows, hidden = x.shape
    out = torch.empty((rows, hidden), dtype=x.dtype, device=x.device)
    rmsnorm_kernel[(rows,)](x, weight, out, hidden, x.stride(0), weight.stride(0), 1e-6,
                            BLOCK=triton.next_power_of_2(hidden))
    return out
