// strided_copy.cu: out = storage.as_strided(size, stride, offset).contiguous(), bitwise.
//
// Output element i (row-major over the view) reads src[offset + sum_d c_d * stride_d], where
// c_d are i's coordinates. The scheme is torch's own elementwise copy (TensorIterator with its
// OffsetCalculator): neighbouring lanes take neighbouring output elements, so every store is
// coalesced and the loads fall where the view puts them; a thread takes UNROLL elements a
// block apart and loads them all before it stores any, so its loads are in flight together.
//
// The launcher (strided_copy.py, `plan`) hands the kernel a prepared view:
//  - dims merged where they are contiguous with each other, innermost first, padded to
//    MAX_DIMS. The kernel indexes its dims only at compile time (the loops are unrolled): an
//    array indexed at run time would live in local memory, a stack frame per thread;
//  - widened: where the innermost stride is 1 and pointers, offset, outer strides and rows
//    allow, the copy moves units of 16, 8, 4 or 2 bytes instead of elements, so a contiguous
//    view is a copy of 16-byte vectors. A one-dim view's bytes past its last whole unit
//    (`tail`, under 16) are copied a byte a thread by block 0;
//  - index widths. Below 2**31 units the element index is 32-bit and each division is a
//    multiply-high and a shift by the launcher's magic numbers (torch's IntDivider); the
//    source position is 32-bit, counted from the offset (folded into the pointer), when the
//    view spans fewer than 2**31 units. Otherwise 64-bit: views of more than 2**31 elements
//    and strides or offsets past 2**31 are the large-tensor class, where 32-bit arithmetic
//    wraps (Paddle's StridedCopy fix).
//
// Every launch is by value (no device memory), so it can be captured in a CUDA graph.
//
// -DINDEX_32BIT plants the classic bug for the negative control: the source position, offset
// included, in 32 bits whatever the view. It wraps modulo 2**32 (unsigned arithmetic, so the
// wrap is defined C++), is read back as a signed int, and is then clamped into the storage,
// as the torch control does: a wrapped position must read wrong values, never an address
// outside the storage, whose illegal-address error would be sticky and end every later case
// of the process with it. The launcher never widens the control's units.

#define MAX_DIMS 8
#define UNROLL 4
#define BLOCK 128
typedef long long i64;
typedef unsigned long long u64;
typedef unsigned int u32;

struct Dims {     // innermost first; a dim at or past ndim has size 1 and stride 0
  i64 size[MAX_DIMS];
  i64 stride[MAX_DIMS];
  i64 magic[MAX_DIMS];  // (shift << 32) | multiplier: n / size for n < 2**31
  int ndim;             // >= 1
};

template <typename I>
__device__ __forceinline__ I quotient(I n, i64 size, i64 magic);

template <>
__device__ __forceinline__ u32 quotient<u32>(u32 n, i64, i64 magic) {
  // exact for n < 2**31: the launcher's numel bound, so t + n never carries out of 32 bits
  const u32 t = __umulhi(n, (u32)magic);
  return (t + n) >> (u32)(magic >> 32);
}

template <>
__device__ __forceinline__ u64 quotient<u64>(u64 n, i64 size, i64) {
  return n / (u64)size;
}

// Element i's source position in units, from the offset: torch's OffsetCalculator, a divmod
// per dim (the outermost too, whose quotient is 0; one fewer would save a division but takes
// a run-time dim index, which puts the dims in local memory).
template <typename I, typename P>
__device__ __forceinline__ P position(I i, const Dims& v) {
  P at = 0;
  I rest = i;
#pragma unroll
  for (int d = 0; d < MAX_DIMS; ++d) {
    if (d == v.ndim) break;
    const I q = quotient<I>(rest, v.size[d], v.magic[d]);
    at += (P)(rest - q * (I)v.size[d]) * (P)v.stride[d];
    rest = q;
  }
  return at;
}

template <typename T, typename I, typename P>
__device__ __forceinline__ void copy_view(T* __restrict__ out, const T* __restrict__ src,
                                          I numel, i64 storage_numel, i64 offset,
                                          const Dims& v, int tail) {
#ifndef INDEX_32BIT
  src += offset;  // 64-bit pointer arithmetic: positions count from here
#endif
  const I tile = (I)blockDim.x * UNROLL;
  const I step = (I)gridDim.x * tile;
  for (I first = (I)blockIdx.x * tile + (I)threadIdx.x; first < numel; first += step) {
    T buf[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const I i = first + (I)u * (I)blockDim.x;
      if (i >= numel) continue;
#ifdef INDEX_32BIT
      const u32 at = (u32)offset + position<I, u32>(i, v);
      const i64 p = (i64)(int)at;
      buf[u] = src[p < 0 ? 0 : (p >= storage_numel ? storage_numel - 1 : p)];
#else
      buf[u] = src[position<I, P>(i, v)];
#endif
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const I i = first + (I)u * (I)blockDim.x;
      if (i < numel) out[i] = buf[u];
    }
  }
  if (tail > 0 && blockIdx.x == 0 && (int)threadIdx.x < tail) {
    // a one-dim view (stride 1): its last bytes follow its last whole unit
    reinterpret_cast<unsigned char*>(out + numel)[threadIdx.x] =
        reinterpret_cast<const unsigned char*>(src + numel)[threadIdx.x];
  }
}

#define DIMS_PARAMS                                                                       \
  i64 n0, i64 n1, i64 n2, i64 n3, i64 n4, i64 n5, i64 n6, i64 n7, i64 s0, i64 s1, i64 s2, \
      i64 s3, i64 s4, i64 s5, i64 s6, i64 s7, i64 m0, i64 m1, i64 m2, i64 m3, i64 m4,     \
      i64 m5, i64 m6, i64 m7, int ndim

// NAME: strided_copy_<unit bytes>_<index><position>, i = 32-bit, l = 64-bit
#define DEFINE_COPY(NAME, T, I, P)                                                        \
  extern "C" __global__ void __launch_bounds__(BLOCK)                                     \
      NAME(T* __restrict__ out, const T* __restrict__ src, i64 numel, i64 storage_numel,  \
           i64 offset, DIMS_PARAMS, int tail) {                                           \
    const Dims v = {{n0, n1, n2, n3, n4, n5, n6, n7},                                     \
                    {s0, s1, s2, s3, s4, s5, s6, s7},                                     \
                    {m0, m1, m2, m3, m4, m5, m6, m7},                                     \
                    ndim};                                                                \
    copy_view<T, I, P>(out, src, (I)numel, storage_numel, offset, v, tail);               \
  }

#define DEFINE_UNIT(BYTES, T)                                 \
  DEFINE_COPY(strided_copy_##BYTES##_ii, T, u32, u32)         \
  DEFINE_COPY(strided_copy_##BYTES##_il, T, u32, i64)         \
  DEFINE_COPY(strided_copy_##BYTES##_ll, T, u64, i64)

DEFINE_UNIT(1, unsigned char)
DEFINE_UNIT(2, unsigned short)
DEFINE_UNIT(4, unsigned int)
DEFINE_UNIT(8, unsigned long long)
DEFINE_UNIT(16, uint4)
