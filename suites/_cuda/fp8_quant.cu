// fp8_quant.cu: per-token (1x128) FP8 quantization of a bf16 matrix, DeepSeek-V3 style.
//
// For row m and group g (columns 128g .. 128g+127, the last group zero padded):
//   amax = max |x| over the group (NaN when an element is NaN, as torch's amax)
//   s    = max(amax, 1e-4) / fmax, with fmax = 448 (e4m3) or 57344 (e5m2)
//   s    = 2**ceil(log2 s) for UE8M0 scales (exponent-only, powers of two)
//   q    = fp8(clamp(x / s, -fmax, fmax)), rounded to nearest even
// x / s is an IEEE float32 division (NVRTC's default -prec-div=true), as in the reference.
// One warp per (row, group): lane l holds columns 128g + l + 32j, j < 4, so each load of the
// warp reads 64 contiguous bytes. Needs sm_89 or newer (the cvt to FP8).

typedef long long i64;

__device__ __forceinline__ float bf16_to_float(unsigned short b) {
  return __uint_as_float(((unsigned)b) << 16);
}

// max that keeps a NaN from either side (fmaxf would drop it)
__device__ __forceinline__ float nan_max(float a, float b) { return (a != a || a > b) ? a : b; }

// 2**ceil(log2 s) for a positive normal float: s itself when its mantissa is zero, else the
// next power of two. inf and NaN stay as they are.
__device__ __forceinline__ float pow2_ceil(float s) {
  unsigned u = __float_as_uint(s);
  if ((u & 0x7f800000u) == 0x7f800000u || (u & 0x007fffffu) == 0) return s;
  return __uint_as_float((u & 0xff800000u) + 0x00800000u);
}

// cvt.rn.satfinite packs two values: a into the upper byte, b into the lower one. satfinite
// saturates out-of-range values to +-fmax, which is the reference's clamp, and keeps NaN
// (clamping with fminf/fmaxf first would turn a NaN into fmax).
template <bool E4M3>
__device__ __forceinline__ unsigned char to_fp8(float v) {
  unsigned short d;
  if (E4M3)
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(0.0f), "f"(v));
  else
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(d) : "f"(0.0f), "f"(v));
  return (unsigned char)(d & 0xff);
}

template <bool E4M3>
__device__ __forceinline__ void quantize_1x128(const unsigned short* __restrict__ x,
                                               unsigned char* __restrict__ q,
                                               float* __restrict__ scales, i64 rows, i64 cols,
                                               int ue8m0) {
  const float fmax = E4M3 ? 448.0f : 57344.0f;
  const i64 groups = (cols + 127) / 128;
  const int lane = threadIdx.x & 31;
  const i64 first = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const i64 warps = ((i64)gridDim.x * blockDim.x) >> 5;
  for (i64 task = first; task < rows * groups; task += warps) {  // the same for a whole warp
    const i64 m = task / groups, g = task % groups;
    const unsigned short* row = x + m * cols;
    float v[4];
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const i64 col = g * 128 + lane + 32 * j;
      v[j] = col < cols ? bf16_to_float(row[col]) : 0.0f;
      amax = nan_max(amax, fabsf(v[j]));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = nan_max(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    float s = amax != amax ? amax : fmaxf(amax, 1e-4f) / fmax;
    if (ue8m0) s = pow2_ceil(s);
    if (lane == 0) scales[m * groups + g] = s;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const i64 col = g * 128 + lane + 32 * j;
      if (col < cols) q[m * cols + col] = to_fp8<E4M3>(v[j] / s);
    }
  }
}

extern "C" __global__ void quantize_1x128_e4m3(const unsigned short* x, unsigned char* q,
                                               float* scales, i64 rows, i64 cols, int ue8m0) {
  quantize_1x128<true>(x, q, scales, rows, cols, ue8m0);
}

extern "C" __global__ void quantize_1x128_e5m2(const unsigned short* x, unsigned char* q,
                                               float* scales, i64 rows, i64 cols, int ue8m0) {
  quantize_1x128<false>(x, q, scales, rows, cols, ue8m0);
}
