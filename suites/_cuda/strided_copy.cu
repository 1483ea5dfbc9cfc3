// strided_copy.cu: out = storage.as_strided(size, stride, offset).contiguous(), bitwise.
//
// Output element i (row-major over size) reads src[offset + sum_d c_d * stride_d], where c_d
// are i's coordinates. The source position is computed in 64-bit signed integers, always:
// views of more than 2**31 elements and strides or offsets past 2**31 are the large-tensor
// class, where 32-bit index arithmetic wraps (Paddle's StridedCopy fix). Unravelling i into
// coordinates divides in 32 bits when the view has fewer than 2**32 elements (division is the
// costly part on a GPU, and no coordinate can exceed the element count), in 64 bits otherwise.
//
// Sizes and strides come by value (MAX_DIMS of each; unused dims have size 1), so a launch
// needs no device memory and can be captured in a CUDA graph. The launcher merges adjacent
// dims that are contiguous with each other first, and checks that the view lies inside the
// storage. Elements are copied as raw bytes of their width (1, 2, 4 or 8), so every dtype of
// that width takes the same kernel.
//
// Speed: a chunk is 16 bytes of one output row (16 / width elements), so the row's source
// position is unravelled once per chunk, not per element. A thread takes four chunks a pass
// (a block's chunks side by side, so a warp's stores are contiguous) and loads all four
// before it stores any: their loads are in flight together. A chunk whose source row is
// contiguous and 16-byte aligned is one 16-byte load; a whole chunk whose destination is
// aligned, one 16-byte store (transposes too: their loads are strided, their stores not).
//
// -DINDEX_32BIT plants the classic bug for the negative control: the source position in 32
// bits. It wraps modulo 2**32 (unsigned arithmetic, so the wrap is defined C++), is read back
// as a signed int, and is then clamped into the storage, as the torch control does: a wrapped
// position must read wrong values, never an address outside the storage, whose illegal-address
// error would be sticky and end every later case of the process with it.

#define MAX_DIMS 8
typedef long long i64;
typedef unsigned long long u64;
typedef unsigned int u32;

#ifdef INDEX_32BIT
typedef u32 position_t;
#else
typedef i64 position_t;
#endif

__device__ __forceinline__ i64 source_index(position_t at, i64 storage_numel) {
#ifdef INDEX_32BIT
  const i64 p = (i64)(int)at;
  return p < 0 ? 0 : (p >= storage_numel ? storage_numel - 1 : p);
#else
  return at;  // the launcher checked that the view lies inside the storage
#endif
}

struct View {
  i64 size[MAX_DIMS];
  i64 stride[MAX_DIMS];
  int ndim;
};

template <typename T, typename U>
__device__ __forceinline__ void copy_view(T* __restrict__ out, const T* __restrict__ src,
                                          i64 numel, i64 storage_numel, i64 offset,
                                          const View& v) {
  constexpr int V = 16 / sizeof(T);  // elements per chunk
  constexpr int UNROLL = 4;          // chunks per thread and pass, all loaded before any store
  union Chunk {
    uint4 whole;
    T e[V];
  };
  const int nd = v.ndim;
  // the last dim is the row: chunks never straddle two rows
  const U inner = nd > 0 ? (U)v.size[nd - 1] : (U)1;
  const i64 inner_stride = nd > 0 ? v.stride[nd - 1] : 0;
  const U per_row = (inner + (V - 1)) / V;
  const i64 chunks = (numel / (i64)inner) * (i64)per_row;  // <= numel: fits U
  const i64 tile = (i64)blockDim.x * UNROLL;  // a block's chunks per pass, side by side
  const i64 step = (i64)gridDim.x * tile;
  for (i64 first = (i64)blockIdx.x * tile + threadIdx.x; first < chunks; first += step) {
    Chunk buf[UNROLL];
    i64 dest[UNROLL];
    int count[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const i64 c = first + (i64)u * blockDim.x;
      count[u] = 0;
      dest[u] = 0;
      if (c >= chunks) continue;
      U row = 0, col = (U)c * V;
      if (nd > 1) {
        row = (U)c / per_row;
        col = ((U)c % per_row) * V;
      }
      position_t at = (position_t)offset;
      U rest = row;
      for (int d = nd - 2; d > 0; --d) {
        const U extent = (U)v.size[d];
        const U coord = rest % extent;
        rest /= extent;
        at += (position_t)coord * (position_t)v.stride[d];
      }
      if (nd > 1) at += (position_t)rest * (position_t)v.stride[0];  // what is left
      at += (position_t)col * (position_t)inner_stride;
      const i64 o = (i64)row * (i64)inner + (i64)col;  // the chunk's first output element
      const U left = inner - col;
      const int n = left < (U)V ? (int)left : V;
      count[u] = n;
      dest[u] = o;
#ifndef INDEX_32BIT
      if (n == V && inner_stride == 1 && ((u64)(src + at) & 15) == 0) {
        buf[u].whole = __ldg(reinterpret_cast<const uint4*>(src + at));
        continue;
      }
#endif
#pragma unroll
      for (int k = 0; k < V; ++k)
        if (k < n) buf[u].e[k] = src[source_index(at + (position_t)k * (position_t)inner_stride,
                                                  storage_numel)];
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int n = count[u];
      T* to = out + dest[u];
      if (n == V && ((u64)to & 15) == 0) {
        *reinterpret_cast<uint4*>(to) = buf[u].whole;
        continue;
      }
#pragma unroll
      for (int k = 0; k < V; ++k)
        if (k < n) to[k] = buf[u].e[k];
    }
  }
}

#define VIEW_PARAMS                                                                   \
  i64 n0, i64 n1, i64 n2, i64 n3, i64 n4, i64 n5, i64 n6, i64 n7, i64 s0, i64 s1, i64 s2, \
      i64 s3, i64 s4, i64 s5, i64 s6, i64 s7, int ndim

#define DEFINE_COPY(NAME, T)                                                               \
  extern "C" __global__ void NAME(T* __restrict__ out, const T* __restrict__ src,         \
                                  i64 numel, i64 storage_numel, i64 offset, VIEW_PARAMS) { \
    const View v = {{n0, n1, n2, n3, n4, n5, n6, n7}, {s0, s1, s2, s3, s4, s5, s6, s7}, ndim}; \
    if ((u64)numel <= 0xffffffffULL)                                                       \
      copy_view<T, u32>(out, src, numel, storage_numel, offset, v);                        \
    else                                                                                   \
      copy_view<T, u64>(out, src, numel, storage_numel, offset, v);                        \
  }

DEFINE_COPY(strided_copy_1, unsigned char)
DEFINE_COPY(strided_copy_2, unsigned short)
DEFINE_COPY(strided_copy_4, unsigned int)
DEFINE_COPY(strided_copy_8, unsigned long long)
