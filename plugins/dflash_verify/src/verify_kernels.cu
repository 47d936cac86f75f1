// CUDA kernels of the DFlash verification plugin.
//
// Stage 1, sample_kernel: one thread block per logits row (b, i) of [B, K+1, V] runs the
// sampling rule of row_select.h (the same code the CPU twin runs) and writes tokens[b, i].
// Stage 2, accept_kernel: one thread per (b, j) computes accepted[b] (leading drafts equal to
// the target's tokens) and next_block_ids[b, j] = [t_a, mask_token_id x K][j].
//
// CtaBlock gives row_select.h its primitives: strided vectorized loads of four elements (four
// in flight per thread in the light passes, one in the heavy ones), warp-shuffle + shared-memory
// reductions, and 256-bin histograms kept in kHistCopies bank-staggered copies (shared atomics;
// radix digits of floats pile into few bins). Every reduction is order-independent, so results
// do not depend on scheduling.
//
// FOOTGUN: never build with --use_fast_math / -ftz=true: flushing subnormal scores changes tokens.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

#include "dflash_verify/row_select.h"
#include "dflash_verify/verify.h"

namespace dfv {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kHistCopies = 8;
constexpr int kHistStride = 257;  // odd row stride: copy c of bin d sits in bank (c + d) % 32
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

struct SharedScratch {
  uint32_t copy_count[kHistCopies][kHistStride];
  unsigned long long copy_mass[kHistCopies][kHistStride];
  uint32_t count[256];
  uint64_t mass[256];
  float red_f[kWarps];
  unsigned long long red_u[kWarps];
  ArgMax red_a[kWarps];
  alignas(16) unsigned char broadcast[16];
};

__device__ __forceinline__ ArgMax shfl_xor(ArgMax a, int offset) {
  ArgMax o;
  o.value = __shfl_xor_sync(kFullMask, a.value, offset);
  o.index = __shfl_xor_sync(kFullMask, a.index, offset);
  return o;
}

class CtaBlock {
 public:
  __device__ explicit CtaBlock(SharedScratch& s) : s_(s), lane_(threadIdx.x & 31), warp_(threadIdx.x >> 5) {}

  // Latency-bound passes: four loads of four elements in flight per thread.
  template <class T, class F>
  __device__ void stream(const T* row, int32_t vocab, F&& f) const {
    visit<4>(row, vocab, f);
  }

  // Heavy passes (radix histograms, softmax sums): one load in flight, a quarter of the code.
  template <class T, class F>
  __device__ void sweep(const T* row, int32_t vocab, F&& f) const {
    visit<1>(row, vocab, f);
  }

  __device__ float reduce_max(float x) const {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, o));
    if (lane_ == 0) s_.red_f[warp_] = x;
    __syncthreads();
    float r = s_.red_f[0];
    for (int w = 1; w < kWarps; ++w) r = fmaxf(r, s_.red_f[w]);
    __syncthreads();
    return r;
  }

  __device__ uint64_t reduce_sum(uint64_t x) const {
    unsigned long long v = x;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
    if (lane_ == 0) s_.red_u[warp_] = v;
    __syncthreads();
    unsigned long long r = 0;
    for (int w = 0; w < kWarps; ++w) r += s_.red_u[w];
    __syncthreads();
    return r;
  }

  __device__ ArgMax reduce_argmax(ArgMax a) const {
    for (int o = 16; o > 0; o >>= 1) {
      const ArgMax other = shfl_xor(a, o);
      if (better(other, a)) a = other;
    }
    if (lane_ == 0) s_.red_a[warp_] = a;
    __syncthreads();
    ArgMax r = s_.red_a[0];
    for (int w = 1; w < kWarps; ++w) {
      if (better(s_.red_a[w], r)) r = s_.red_a[w];
    }
    __syncthreads();
    return r;
  }

  __device__ void hist_begin() const {
    for (int i = threadIdx.x; i < kHistCopies * kHistStride; i += kThreads) {
      (&s_.copy_count[0][0])[i] = 0;
      (&s_.copy_mass[0][0])[i] = 0;
    }
    __syncthreads();
  }

  __device__ void hist_add(uint32_t bin, uint64_t mass) const {
    const int c = warp_ % kHistCopies;
    atomicAdd(&s_.copy_count[c][bin], 1u);
    if (mass != 0) atomicAdd(&s_.copy_mass[c][bin], static_cast<unsigned long long>(mass));
  }

  __device__ void hist_end() const {
    __syncthreads();
    for (int d = threadIdx.x; d < 256; d += kThreads) {
      uint32_t n = 0;
      uint64_t m = 0;
      for (int c = 0; c < kHistCopies; ++c) {
        n += s_.copy_count[c][d];
        m += s_.copy_mass[c][d];
      }
      s_.count[d] = n;
      s_.mass[d] = m;
    }
    __syncthreads();
  }

  __device__ const uint32_t* hist_count() const { return s_.count; }
  __device__ const uint64_t* hist_mass() const { return s_.mass; }

  template <class F>
  __device__ auto leader(F&& f) const -> decltype(f()) {
    using R = decltype(f());
    static_assert(sizeof(R) <= sizeof(SharedScratch::broadcast), "leader result too large");
    if (threadIdx.x == 0) {
      const R r = f();
      memcpy(s_.broadcast, &r, sizeof r);
    }
    __syncthreads();
    R r;
    memcpy(&r, s_.broadcast, sizeof r);
    __syncthreads();
    return r;
  }

 private:
  // Loads of four elements: 16 bytes of fp32, 8 bytes of fp16 / bf16 (the same code size per dtype).
  template <class T>
  using Quad = typename std::conditional<sizeof(T) == 4, uint4, uint2>::type;

  template <int kInFlight, class T, class F>
  __device__ static void visit(const T* row, int32_t vocab, F& f) {
    using Q = Quad<T>;
    // Peel the elements before the first Q-aligned address (rows of an odd V are misaligned).
    const uintptr_t misalign = reinterpret_cast<uintptr_t>(row) % sizeof(Q);
    const int32_t head = min(vocab, static_cast<int32_t>((sizeof(Q) - misalign) % sizeof(Q) / sizeof(T)));
    if (static_cast<int32_t>(threadIdx.x) < head) f(threadIdx.x, to_float(row[threadIdx.x]));
    const int32_t nquad = (vocab - head) / 4;
    const Q* qrow = reinterpret_cast<const Q*>(row + head);
    int32_t j = threadIdx.x;
    for (; j + (kInFlight - 1) * kThreads < nquad; j += kInFlight * kThreads) {
      Q raw[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) raw[u] = __ldg(qrow + j + u * kThreads);
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) apply<T>(raw[u], head + (j + u * kThreads) * 4, f);
    }
    if (kInFlight > 1) {
      for (; j < nquad; j += kThreads) apply<T>(__ldg(qrow + j), head + j * 4, f);
    }
    for (int32_t v = head + nquad * 4 + static_cast<int32_t>(threadIdx.x); v < vocab; v += kThreads) {
      f(v, to_float(row[v]));
    }
  }

  template <class T, class Q, class F>
  __device__ static void apply(const Q& raw, int32_t v0, F& f) {
    T vals[4];
    memcpy(static_cast<void*>(vals), &raw, sizeof raw);
#pragma unroll
    for (int k = 0; k < 4; ++k) f(v0 + k, to_float(vals[k]));
  }

  SharedScratch& s_;
  int lane_;
  int warp_;
};

template <class T>
__global__ void __launch_bounds__(kThreads) sample_kernel(VerifyArgs args) {
  __shared__ SharedScratch scratch;
  CtaBlock blk(scratch);
  const int64_t row = blockIdx.x;
  const T* logits = static_cast<const T*>(args.logits) + row * static_cast<int64_t>(args.vocab);
  const int32_t token = choose_token(blk, logits, args.vocab, row_params(args, row));
  if (threadIdx.x == 0) store(args.tokens, row, token);
}

__global__ void accept_kernel(VerifyArgs args) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<int64_t>(args.batch) * args.block_size) return;
  accept_element(args, idx / args.block_size, static_cast<int32_t>(idx % args.block_size));
}

}  // namespace

#if !defined(DFV_HOST_EMULATION)  // twin/cta_emulator.cpp runs the kernels above on the CPU

cudaError_t launch_verify(const VerifyArgs& args, cudaStream_t stream) {
  if (check_args(args) != nullptr) return cudaErrorInvalidValue;
  if (args.batch == 0) return cudaSuccess;
  const unsigned rows = static_cast<unsigned>(args.batch) * static_cast<unsigned>(args.block_size);
  switch (args.logits_dtype) {
    case kFloat16:
      sample_kernel<__half><<<rows, kThreads, 0, stream>>>(args);
      break;
    case kBFloat16:
      sample_kernel<__nv_bfloat16><<<rows, kThreads, 0, stream>>>(args);
      break;
    default:
      sample_kernel<float><<<rows, kThreads, 0, stream>>>(args);
      break;
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  accept_kernel<<<(rows + 255) / 256, 256, 0, stream>>>(args);
  return cudaGetLastError();
}

const char* describe_args_error(const VerifyArgs& args) { return check_args(args); }

#endif  // !DFV_HOST_EMULATION

}  // namespace dfv
