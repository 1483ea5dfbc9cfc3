// tile_reduce.cu: the local step of Mirage's tile allreduce. After the allgather, rows[W][n]
// holds every rank's input; out[i] = op over w of rows[w][i], accumulated in float32 for
// floating-point data (int64 for int32) in rank order, then rounded once to the data type.
// avg divides the float32 sum by W before that rounding. min and max keep a NaN, as torch.

typedef long long i64;

enum Op { SUM = 0, AVG = 1, PROD = 2, MIN = 3, MAX = 4 };

// float32 <-> the 16-bit types, round to nearest even (sm_80 or newer for bf16)
__device__ __forceinline__ float load_f(const float* p) { return *p; }
__device__ __forceinline__ float load_f(const unsigned short* p, bool bf16) {
  if (bf16) return __uint_as_float(((unsigned)*p) << 16);
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(*p));
  return f;
}
__device__ __forceinline__ unsigned short to_16(float f, bool bf16) {
  unsigned short h;
  if (bf16)
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
  else
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

template <typename A>
__device__ __forceinline__ A combine(A acc, A v, int op) {
  switch (op) {
    case PROD: return acc * v;
    case MIN: return (acc != acc || acc < v) ? acc : v;
    case MAX: return (acc != acc || acc > v) ? acc : v;
    default: return acc + v;
  }
}

#define GRID_STRIDE(i, n) \
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

extern "C" __global__ void tile_reduce_f32(const float* __restrict__ rows,
                                           float* __restrict__ out, i64 n, int world, int op) {
  GRID_STRIDE(i, n) {
    float acc = rows[i];
    for (int w = 1; w < world; ++w) acc = combine(acc, rows[(i64)w * n + i], op);
    out[i] = op == AVG ? acc / (float)world : acc;
  }
}

#define DEFINE_REDUCE_16(NAME, BF16)                                                        \
  extern "C" __global__ void NAME(const unsigned short* __restrict__ rows,                 \
                                  unsigned short* __restrict__ out, i64 n, int world,      \
                                  int op) {                                                 \
    GRID_STRIDE(i, n) {                                                                     \
      float acc = load_f(rows + i, BF16);                                                   \
      for (int w = 1; w < world; ++w) acc = combine(acc, load_f(rows + (i64)w * n + i, BF16), op); \
      out[i] = to_16(op == AVG ? acc / (float)world : acc, BF16);                           \
    }                                                                                       \
  }

DEFINE_REDUCE_16(tile_reduce_bf16, true)
DEFINE_REDUCE_16(tile_reduce_f16, false)

extern "C" __global__ void tile_reduce_i32(const int* __restrict__ rows, int* __restrict__ out,
                                           i64 n, int world, int op) {
  GRID_STRIDE(i, n) {
    i64 acc = rows[i];
    for (int w = 1; w < world; ++w) acc = combine<i64>(acc, rows[(i64)w * n + i], op);
    out[i] = (int)acc;  // wraps like torch's int64 -> int32 cast
  }
}
