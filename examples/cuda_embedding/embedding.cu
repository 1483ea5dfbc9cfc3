// out[b] = weight[ids[b]] for bf16 rows; an id < 0 (a padding slot) gives a zero row.
// One block per id; its threads copy the row's elements (bf16 as raw 16-bit words).
extern "C" __global__ void embedding(const long long* ids, const unsigned short* weight,
                                     unsigned short* out, long long hidden) {
  const long long b = blockIdx.x;
  const long long id = ids[b];
  for (long long h = threadIdx.x; h < hidden; h += blockDim.x)
    out[b * hidden + h] = id < 0 ? 0 : weight[id * hidden + h];
}
