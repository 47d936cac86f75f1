// A host emulator of the CUDA thread block that runs src/verify_kernels.cu itself on the CPU.
//
// The twin (verify_twin.cpp) checks row_select.h; this file checks the CUDA-only layer around it
// (CtaBlock: strided / vectorized loads with peeled heads, warp-shuffle reductions, histogram
// copies and merge, leader broadcast; accept_kernel's indexing). The kernel source is compiled by
// g++ with CUDA's builtins replaced: every CUDA thread of a block is a ucontext fiber, run
// cooperatively; __syncthreads and each half of a warp shuffle are barriers that resume waiting
// fibers once all of the block's (or warp's) threads have arrived. A barrier some threads never
// reach (divergent __syncthreads) is reported as an error instead of hanging. Shared memory is
// the kernel's static local, one block at a time. No data races can show here; logic errors can.
//
// Build: g++ -std=c++17 -O1 -shared -fPIC -ffp-contract=off -Wno-unknown-pragmas
//   -Iplugins/dflash_verify/include -I<cuda>/include twin/cta_emulator.cpp -o libdflash_verify_emu.so
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <string.h>
#include <ucontext.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <vector>

// --- CUDA builtins on the host ----------------------------------------------------------------
#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __launch_bounds__(...)

namespace emu {

struct Dim {
  unsigned x, y, z;
};

enum class State { kRunnable, kBlockBarrier, kWarpBarrier, kDone };

struct Fiber {
  ucontext_t ctx;
  State state = State::kRunnable;
};

constexpr size_t kStackBytes = 64 << 10;
std::vector<std::vector<char>> g_stacks;  // reused by every block

struct Block {
  std::vector<Fiber> fibers;
  ucontext_t scheduler;
  int current = 0;
  uint64_t warp_buffer[64][32];
};

Block* g_block = nullptr;
Dim g_thread{0, 0, 0}, g_block_idx{0, 0, 0}, g_block_dim{1, 1, 1};
void (*g_body)() = nullptr;

inline void wait(State s) {
  Fiber& f = g_block->fibers[g_block->current];
  f.state = s;
  swapcontext(&f.ctx, &g_block->scheduler);
}

inline void syncthreads() { wait(State::kBlockBarrier); }

template <class T>
T shfl_xor(T v, int offset) {
  static_assert(sizeof(T) <= 8, "shuffle of at most 8 bytes");
  const int lane = static_cast<int>(g_thread.x) & 31, warp = static_cast<int>(g_thread.x) >> 5;
  memcpy(&g_block->warp_buffer[warp][lane], &v, sizeof v);
  wait(State::kWarpBarrier);
  T r;
  memcpy(&r, &g_block->warp_buffer[warp][lane ^ offset], sizeof r);
  wait(State::kWarpBarrier);
  return r;
}

void trampoline() {
  g_body();
  g_block->fibers[g_block->current].state = State::kDone;
}

// Release every barrier all of whose threads have arrived; false if nothing could move.
bool release(Block& b) {
  const int n = static_cast<int>(b.fibers.size());
  bool moved = false, all_at_block = true;
  for (const Fiber& f : b.fibers) all_at_block &= f.state == State::kBlockBarrier;
  if (all_at_block) {
    for (Fiber& f : b.fibers) f.state = State::kRunnable;
    return true;
  }
  for (int w = 0; w * 32 < n; ++w) {
    bool all = true;
    for (int t = w * 32; t < std::min(n, w * 32 + 32); ++t) all &= b.fibers[t].state == State::kWarpBarrier;
    if (!all) continue;
    for (int t = w * 32; t < std::min(n, w * 32 + 32); ++t) b.fibers[t].state = State::kRunnable;
    moved = true;
  }
  return moved;
}

// Run body() as every thread of block `block_idx`.
void run_block(void (*body)(), unsigned block_idx, unsigned threads) {
  Block b;
  b.fibers.resize(threads);
  g_block = &b;
  g_body = body;
  g_block_idx = Dim{block_idx, 0, 0};
  g_block_dim = Dim{threads, 1, 1};
  while (g_stacks.size() < threads) g_stacks.emplace_back(kStackBytes);
  for (unsigned t = 0; t < threads; ++t) {
    Fiber& f = b.fibers[t];
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = g_stacks[t].data();
    f.ctx.uc_stack.ss_size = kStackBytes;
    f.ctx.uc_link = &b.scheduler;
    makecontext(&f.ctx, trampoline, 0);
  }
  for (;;) {
    bool ran = false;
    for (unsigned t = 0; t < threads; ++t) {
      if (b.fibers[t].state != State::kRunnable) continue;
      b.current = static_cast<int>(t);
      g_thread = Dim{t, 0, 0};
      swapcontext(&b.scheduler, &b.fibers[t].ctx);
      ran = true;
    }
    if (std::all_of(b.fibers.begin(), b.fibers.end(), [](const Fiber& f) { return f.state == State::kDone; })) break;
    if (!release(b) && !ran) throw std::runtime_error("barrier not reached by every thread (divergent sync)");
  }
  g_block = nullptr;
}

}  // namespace emu

#define threadIdx emu::g_thread
#define blockIdx emu::g_block_idx
#define blockDim emu::g_block_dim
#define __syncthreads() emu::syncthreads()
#define __shfl_xor_sync(mask, v, offset) emu::shfl_xor((v), (offset))

template <class T>
T __ldg(const T* p) {
  return *p;
}
inline unsigned atomicAdd(unsigned* p, unsigned v) {
  const unsigned old = *p;
  *p = old + v;
  return old;
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  const unsigned long long old = *p;
  *p = old + v;
  return old;
}
inline int min(int a, int b) { return a < b ? a : b; }

#define DFV_HOST_EMULATION 1
#include "../src/verify_kernels.cu"

// --- entry point --------------------------------------------------------------------------------
namespace {

dfv::VerifyArgs g_args;
int64_t g_rows = 0;

template <class T>
void sample_body() {
  dfv::sample_kernel<T>(g_args);
}

void accept_body() { dfv::accept_kernel(g_args); }

}  // namespace

extern "C" {

// Same contract as dfv_twin_verify (int64 ids), through the emulated CUDA kernels.
int32_t dfv_emu_verify(const void* logits, int32_t dtype, int32_t batch, int32_t block_size, int32_t vocab,
                       const void* drafts, int32_t drafts_bytes, const int64_t* start, const float* temperature,
                       const int64_t* top_k, const float* top_p, const int64_t* seed, int64_t mask_token_id,
                       int64_t* tokens, int64_t* accepted, int64_t* next_block_ids, char* err, int32_t err_len) {
  const dfv::VerifyArgs a = dfv::host_args(logits, dtype, batch, block_size, vocab, drafts, drafts_bytes, start,
                                           temperature, top_k, top_p, seed, mask_token_id, tokens, accepted,
                                           next_block_ids);
  try {
    if (const char* problem = dfv::check_args(a)) throw std::runtime_error(problem);
    g_args = a;
    g_rows = static_cast<int64_t>(batch) * block_size;
    void (*body)() = dtype == dfv::kFloat16    ? sample_body<__half>
                     : dtype == dfv::kBFloat16 ? sample_body<__nv_bfloat16>
                                               : sample_body<float>;
    for (int64_t row = 0; row < g_rows; ++row) emu::run_block(body, static_cast<unsigned>(row), dfv::kThreads);
    for (int64_t b0 = 0; b0 < g_rows; b0 += 256) emu::run_block(accept_body, static_cast<unsigned>(b0 / 256), 256);
  } catch (const std::exception& e) {
    if (err != nullptr && err_len > 0) snprintf(err, static_cast<size_t>(err_len), "%s", e.what());
    return 1;
  }
  return 0;
}

}  // extern "C"
