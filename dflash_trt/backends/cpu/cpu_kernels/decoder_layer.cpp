// The CPU runtime's inference passes in C++ (fp32, Qwen3 / Llama 3.x shapes): a whole decoder layer
// per call for one or several sequences, the greedy heads (lazy verify, confident drafts), RMSNorm
// and the projections they share. Built and loaded with ctypes by dflash_trt/backends/cpu/ops.py;
// backends/cpu/layers.py decides when a pass can use it.
//
// Why: at decode sizes (1..16 rows) an eager PyTorch layer is dozens of small ops, each paying its
// dispatch, plus MKL's small-matrix setup per projection, and that overhead rather than the arithmetic
// bounds a step; here a layer is one call that streams each weight once.
//
// Row independence (the lossless property this file keeps): every output element of every row is
// computed by the same instruction sequence whatever the number of rows in the call, so a verify
// pass over a block gives bit-identical hidden states to decoding the same tokens one at a time.
//
// Threads (dfl_set_threads; one by default): the projections and heads split into chunks of weight
// panels and attention into (sequence, K/V head) tasks, shared out between the calling thread and a
// small persistent pool (thread_pool.h). An output element is computed inside one chunk by the instruction sequence
// of the one-thread code, and reductions over a row (argmax, softmax sums, the draft cut) stay after
// the split in their one-thread order, so every thread count gives the same bits.
//
// Layout (all row-major, contiguous, fp32), per sequence (a call may carry several, see below):
//   x      [Q, H]            block rows: the residual stream, updated in place
//   ctx    [C, H] or null    context rows (drafter): K/V only, no input norm, no query
//   rows [ctx ; x] sit at absolute positions start .. start + C + Q - 1
//   cos/sin [C + Q, D]       RoPE rows for those positions (HF rotate_half convention)
//   k/v cache [NKV, cap, D]  this layer's slice for the sequence; positions < start must hold K/V
//   query row t (absolute position p) attends to keys 0..p (causal) or 0..start+C+Q-1 (not causal),
//   narrowed to |p - k| < window on a sliding-window layer (its cost then bounded by the window)
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "thread_pool.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

extern "C" {

struct DflLayerWeights {  // pointers stay owned by the Python module (layers.LayerPlan keeps them alive)
  const float* input_norm;   // [H]
  // the four projections as panels (pack_panels): [ceil(n / 8), k, 8] for a weight [n, k]
  // panels hold fp32 values, or the bf16 (weight_format 1) / fp16 (2) bits of weights that are such values:
  // the kernel expands each exactly to fp32, so the FMA chains and results are the same, from half the bytes
  const void* qkv;           // [(NH + 2 NKV) D, H]  rows: q heads, k heads, v heads
  const float* q_norm;       // [D] or null (no q/k norm: Llama)
  const float* k_norm;       // [D] or null
  const void* o_proj;        // [H, NH D]
  const float* post_norm;    // [H]
  const void* gate_up;       // [2 I, H]  rows: gate, up
  const void* down;          // [H, I]
  int32_t hidden, heads, kv_heads, head_dim, intermediate;
  float eps;
  int32_t weight_format;     // 0: fp32 panels, 1: bf16 panels, 2: fp16 panels
  int32_t window;            // sliding window (0: none): a query at p sees keys k with p - k < window, and
                             // also k - p < window when not causal (z-lab's drafter mask, model.draft_layer)
};

}  // extern "C"

// ---- threads: which work is split (the pool itself: thread_pool.h) ---------------------------------

namespace {

// Work below this many multiply-adds (~ a 32 KB weight slice at one row: a few microseconds) runs on
// the calling thread: handing it out would cost a good part of what a second thread saves.
constexpr long MIN_PARALLEL_MACS = 16384;

bool parallel_worth(long macs, int chunks) {
  return chunks > 1 && macs >= MIN_PARALLEL_MACS && pool_threads.load(std::memory_order_relaxed) > 1;
}

// dot_rows<R>: out[r] = w . x_r for R rows x_r = x + r * ldx (length n each). Each row's sum has
// one fixed shape, whatever R: two 8-lane accumulators over 16-float chunks, one more 8-float chunk
// into the first, then a fixed horizontal reduction, then the scalar tail. R > 1 only shares the
// loads of w and fills both FMA pipes (R independent pairs of accumulator chains).
#if defined(__AVX2__) && defined(__FMA__)
inline float reduce(__m256 a0, __m256 a1) {
  const __m256 a = _mm256_add_ps(a0, a1);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(s);
}

template <int R>
inline void dot_rows(const float* w, const float* x, size_t ldx, int n, float* out) {
  __m256 acc0[R], acc1[R];
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 w0 = _mm256_loadu_ps(w + i), w1 = _mm256_loadu_ps(w + i + 8);
    for (int r = 0; r < R; ++r) {
      acc0[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * ldx + i), acc0[r]);
      acc1[r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + r * ldx + i + 8), acc1[r]);
    }
  }
  if (i + 8 <= n) {
    const __m256 w0 = _mm256_loadu_ps(w + i);
    for (int r = 0; r < R; ++r) acc0[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * ldx + i), acc0[r]);
    i += 8;
  }
  for (int r = 0; r < R; ++r) {
    float s = reduce(acc0[r], acc1[r]);
    for (int j = i; j < n; ++j) s += w[j] * x[r * ldx + j];
    out[r] = s;
  }
}
#else
template <int R>
inline void dot_rows(const float* w, const float* x, size_t ldx, int n, float* out) {
  for (int r = 0; r < R; ++r) {
    const float* xr = x + r * ldx;
    float acc[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
      for (int l = 0; l < 16; ++l) acc[l] += w[i + l] * xr[i + l];
    if (i + 8 <= n) {
      for (int l = 0; l < 8; ++l) acc[l] += w[i + l] * xr[i + l];
      i += 8;
    }
    float lanes[8];
    for (int l = 0; l < 8; ++l) lanes[l] = acc[l] + acc[l + 8];
    float s = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
    for (; i < n; ++i) s += w[i] * xr[i];
    out[r] = s;
  }
}
#endif

inline float dot(const float* a, const float* b, int n) {
  float out;
  dot_rows<1>(a, b, 0, n, &out);
  return out;
}

// out[t, j] = x[t, :] . w[j, :] for t < rows, j < n (x [rows, k], w [n, k], out [rows, n]).
// Weight rows outer: each is read from memory once and used for every row while in L1.
void matmul_nt(const float* x, int rows, int k, const float* w, int n, float* out) {
  float sums[4];
  for (int j = 0; j < n; ++j) {
    const float* wj = w + static_cast<size_t>(j) * k;
    int t = 0;
    for (; t + 4 <= rows; t += 4) {
      dot_rows<4>(wj, x + static_cast<size_t>(t) * k, k, k, sums);
      for (int r = 0; r < 4; ++r) out[static_cast<size_t>(t + r) * n + j] = sums[r];
    }
    for (; t + 2 <= rows; t += 2) {
      dot_rows<2>(wj, x + static_cast<size_t>(t) * k, k, k, sums);
      for (int r = 0; r < 2; ++r) out[static_cast<size_t>(t + r) * n + j] = sums[r];
    }
    for (; t < rows; ++t) out[static_cast<size_t>(t) * n + j] = dot(wj, x + static_cast<size_t>(t) * k, k);
  }
}

// Panels: a weight w [n, k] stored as [ceil(n / 8), k, 8] (panel p, column kk = w[8p .. 8p+7, kk],
// zero rows past n), so a tile streams its panels front to back. out[t, j] = sum over kk in order of
// x[t, kk] * w[j, kk], one fused multiply-add chain per output: the same chain whatever the tile
// (rows x panels) it is computed in, so rows are independent here too.
void pack_panels(const float* w, int n, int k, float* panels) {
  for (int p = 0; p < (n + 7) / 8; ++p)
    for (int kk = 0; kk < k; ++kk)
      for (int l = 0; l < 8; ++l) {
        const int j = p * 8 + l;
        panels[(static_cast<size_t>(p) * k + kk) * 8 + l] = j < n ? w[static_cast<size_t>(j) * k + kk] : 0.0f;
      }
}

// bf16 panels: the upper 16 bits of fp32 values whose lower 16 bits are zero (exact both ways).
inline float weight_value(float w) { return w; }
inline float weight_value(uint16_t w) {
  const uint32_t bits = static_cast<uint32_t>(w) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// fp16 panels: IEEE half bits of weights that are fp16 values (every one is an fp32 value).
struct Half {
  uint16_t bits;
};
inline float weight_value(Half w) {
  const uint32_t sign = static_cast<uint32_t>(w.bits & 0x8000u) << 16, exponent = (w.bits >> 10) & 0x1Fu,
                 mantissa = w.bits & 0x3FFu;
  uint32_t bits;
  if (exponent == 0x1F) {
    bits = sign | 0x7F800000u | (mantissa << 13);  // inf / nan
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;  // +-0
  } else {  // subnormal half: normalize
    int e = -1;
    uint32_t m = mantissa;
    do {
      ++e;
      m <<= 1;
    } while ((m & 0x400u) == 0);
    bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((m & 0x3FFu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

#if defined(__AVX2__) && defined(__FMA__)
inline __m256 load_weights(const float* p) { return _mm256_load_ps(p); }
inline __m256 load_weights(const uint16_t* p) {
  const __m128i half = _mm_load_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
}
inline __m256 load_weights(const Half* p) {
#if defined(__F16C__)
  return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(p)));
#else
  alignas(32) float v[8];
  for (int i = 0; i < 8; ++i) v[i] = weight_value(p[i]);
  return _mm256_load_ps(v);
#endif
}
#endif

template <int RG, int P, typename W>
inline void panel_tile(const float* __restrict x, int k, const W* __restrict panels, int p0, int n,
                       float* __restrict out) {
  alignas(32) float result[RG * P * 8];
#if defined(__AVX2__) && defined(__FMA__)
  __m256 acc[RG * P];
#pragma GCC unroll 12
  for (int i = 0; i < RG * P; ++i) acc[i] = _mm256_setzero_ps();
  const W* base = panels + static_cast<size_t>(p0) * k * 8;
  const size_t next = static_cast<size_t>(k) * 8;  // from one panel to the next
  for (int kk = 0; kk < k; ++kk) {
    __m256 wv[P];
#pragma GCC unroll 3
    for (int q = 0; q < P; ++q) {
      if (RG > 1 && (kk & 1) == 0)  // 8 KB ahead: DRAM-resident weights stream while the FMAs run
        _mm_prefetch(reinterpret_cast<const char*>(base + q * next + static_cast<size_t>(kk + 256) * 8), _MM_HINT_T0);
      wv[q] = load_weights(base + q * next + static_cast<size_t>(kk) * 8);
      __asm__("" : "+x"(wv[q]));  // keep it in a register: GCC would re-load it in every row's FMA
    }
#pragma GCC unroll 8
    for (int r = 0; r < RG; ++r) {
      const __m256 xb = _mm256_broadcast_ss(x + static_cast<size_t>(r) * k + kk);
#pragma GCC unroll 3
      for (int q = 0; q < P; ++q) acc[r * P + q] = _mm256_fmadd_ps(xb, wv[q], acc[r * P + q]);
    }
  }
#pragma GCC unroll 12
  for (int i = 0; i < RG * P; ++i) _mm256_store_ps(result + i * 8, acc[i]);
#else
  for (int r = 0; r < RG; ++r)
    for (int q = 0; q < P; ++q)
      for (int l = 0; l < 8; ++l) {
        const W* col = panels + static_cast<size_t>(p0 + q) * k * 8 + l;
        float a = 0.0f;
        for (int kk = 0; kk < k; ++kk) a += x[static_cast<size_t>(r) * k + kk] * weight_value(col[static_cast<size_t>(kk) * 8]);
        result[(r * P + q) * 8 + l] = a;
      }
#endif
  for (int r = 0; r < RG; ++r)
    for (int q = 0; q < P; ++q)
      for (int l = 0; l < 8; ++l) {
        const int j = (p0 + q) * 8 + l;
        if (j < n) out[static_cast<size_t>(r) * n + j] = result[(r * P + q) * 8 + l];
      }
}

// Panels p_begin .. p_end-1 for RG rows, P panels per tile: 3 up to 4 rows (12 accumulators at 4),
// 2 for 5-6 rows (12 at 6), 1 for 7-8 rows (16 ymm registers hold no more), so each kk step has >= 7
// independent FMA chains (FMA latency 4 cycles, 2 pipes) except at 1-2 rows.
template <int RG, typename W>
void panel_span(const float* x, int k, const W* panels, int p_begin, int p_end, int n, float* out) {
  constexpr int P = RG <= 4 ? 3 : (RG <= 6 ? 2 : 1);
  int p = p_begin;
  for (; p + P <= p_end; p += P) panel_tile<RG, P, W>(x, k, panels, p, n, out);
  if (P == 3 && p + 2 <= p_end) {
    panel_tile<RG, 2, W>(x, k, panels, p, n, out);
    p += 2;
  }
  if (p < p_end) panel_tile<RG, 1, W>(x, k, panels, p, n, out);
}

// out [rows, n] = x [rows, k] @ w^T with w packed by pack_panels, for panels p_first .. p_last-1
// (output columns 8 p_first .. min(8 p_last, n) - 1; other columns are not written). PANEL_BLOCK panels
// at a time across all rows, so each weight is streamed from memory once per call and re-read from L1 /
// L2 by the other row groups; rows in groups of 4, the last group 3..6 rows (never a 1- or 2-row tile
// after 4s). A column's chains are the same whichever range or rows share the call. One thread; the
// callers below split a range between threads (split_panel_range).
constexpr int PANEL_BLOCK = 6;

template <typename W>
void matmul_panel_range(const float* x, int rows, int k, const W* panels, int n, int p_first, int p_last,
                        float* out) {
  for (int pb = p_first; pb < p_last; pb += PANEL_BLOCK) {
    const int pe = pb + PANEL_BLOCK < p_last ? pb + PANEL_BLOCK : p_last;
    for (int t = 0; t < rows;) {
      // up to 8 rows: one group (a second group would re-read the block from L2 while no weight streams
      // in from memory); more: 4s while more than 6 remain, then all of them
      const int g = rows <= 8 ? rows : (rows - t > 6 ? 4 : rows - t);
      const float* xt = x + static_cast<size_t>(t) * k;
      float* ot = out + static_cast<size_t>(t) * n;
      switch (g) {
        case 1: panel_span<1>(xt, k, panels, pb, pe, n, ot); break;
        case 2: panel_span<2>(xt, k, panels, pb, pe, n, ot); break;
        case 3: panel_span<3>(xt, k, panels, pb, pe, n, ot); break;
        case 4: panel_span<4>(xt, k, panels, pb, pe, n, ot); break;
        case 5: panel_span<5>(xt, k, panels, pb, pe, n, ot); break;
        case 6: panel_span<6>(xt, k, panels, pb, pe, n, ot); break;
        case 7: panel_span<7>(xt, k, panels, pb, pe, n, ot); break;
        default: panel_span<8>(xt, k, panels, pb, pe, n, ot); break;
      }
      t += g;
    }
  }
}

// matmul_panel_range over the pool's threads when the range is worth splitting: chunk c is the block
// of PANEL_BLOCK panels that the one-thread loop runs c-th, with the same row groups and tiles, so each
// output is the same chain whichever thread computes it.
template <typename W>
void split_panel_range(const float* x, int rows, int k, const W* panels, int n, int p_first, int p_last,
                       float* out) {
  const int chunks = (p_last - p_first + PANEL_BLOCK - 1) / PANEL_BLOCK;
  if (!parallel_worth(static_cast<long>(p_last - p_first) * 8 * k * rows, chunks)) {
    matmul_panel_range(x, rows, k, panels, n, p_first, p_last, out);
    return;
  }
  parallel_for(chunks, [&](int c) {
    const int pb = p_first + c * PANEL_BLOCK;
    matmul_panel_range(x, rows, k, panels, n, pb, pb + PANEL_BLOCK < p_last ? pb + PANEL_BLOCK : p_last, out);
  });
}

template <typename W>
void matmul_panels(const float* x, int rows, int k, const W* panels, int n, float* out) {
  split_panel_range(x, rows, k, panels, n, 0, (n + 7) / 8, out);
}

// A layer projection's panels in its format (DflLayerWeights::weight_format).
void layer_panel_range(const DflLayerWeights* w, const void* panels, const float* x, int rows, int k, int n,
                       int p_first, int p_last, float* out) {
  if (w->weight_format == 1)
    split_panel_range(x, rows, k, static_cast<const uint16_t*>(panels), n, p_first, p_last, out);
  else if (w->weight_format == 2)
    split_panel_range(x, rows, k, static_cast<const Half*>(panels), n, p_first, p_last, out);
  else
    split_panel_range(x, rows, k, static_cast<const float*>(panels), n, p_first, p_last, out);
}

void layer_panels(const DflLayerWeights* w, const void* panels, const float* x, int rows, int k, int n, float* out) {
  layer_panel_range(w, panels, x, rows, k, n, 0, (n + 7) / 8, out);
}

// out = weight * (x / sqrt(mean(x^2) + eps)); weight may be null (x / rms only). out may alias x.
void rms_norm(const float* x, const float* weight, int n, float eps, float* out) {
  const float scale = 1.0f / std::sqrt(dot(x, x, n) / static_cast<float>(n) + eps);
  for (int i = 0; i < n; ++i) out[i] = weight ? weight[i] * (x[i] * scale) : x[i] * scale;
}

// In place: v (length d) = v * cos + rotate_half(v) * sin, rotate_half(v) = [-v[d/2:], v[:d/2]].
void rope(float* v, const float* cos, const float* sin, int d) {
  const int half = d / 2;
  for (int i = 0; i < half; ++i) {
    const float a = v[i], b = v[i + half];
    v[i] = a * cos[i] - b * sin[i];
    v[i + half] = b * cos[i + half] + a * sin[i + half];
  }
}

// exp of 8 lanes (Cephes expf: range reduction by ln 2, degree-5 polynomial; ~1 ulp). Lanes are
// independent, so an element's result never depends on its neighbours.
#if defined(__AVX2__) && defined(__FMA__)
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-88.3762626647949f)), _mm256_set1_ps(88.3762626647949f));
  const __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}
#endif

// In place: v[i] = exp(v[i]) for i < n; v must have room for n rounded up to 8 (padding is overwritten).
void exp_inplace(float* v, int n) {
#if defined(__AVX2__) && defined(__FMA__)
  for (int i = 0; i < n; i += 8) _mm256_storeu_ps(v + i, exp8(_mm256_loadu_ps(v + i)));
#else
  for (int i = 0; i < n; ++i) v[i] = std::exp(v[i]);
#endif
}

#if defined(__AVX2__) && defined(__FMA__)
// q . k_s for the 8 keys k_s = k + s * d, s < 8 (d a multiple of 8): eight accumulators, then one
// reduction tree, the 8 sums in key order.
inline __m256 dot8_keys(const float* q, const float* k, int d) {
  __m256 a[8];
  for (int s = 0; s < 8; ++s) a[s] = _mm256_setzero_ps();
  for (int i = 0; i < d; i += 8) {
    const __m256 qv = _mm256_loadu_ps(q + i);
    for (int s = 0; s < 8; ++s) a[s] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + static_cast<size_t>(s) * d + i), a[s]);
  }
  const __m256 s0123 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 s4567 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

// Attention of M queries over one K/V head (head dim 8 DV), all in a fixed order per query:
//   1) scores 8 keys at a time (dot8_keys; the last n % 8 keys one by one), every query for one key
//      block before the next block, so a block is read from L2 once and from L1 by the others;
//   2) per query: max and exp-sum in 8 lanes;
//   3) the weighted values in two interleaved accumulator sets (even / odd keys) so the FMA chains
//      overlap, keys in chunks of KEY_CHUNK shared by all queries (accumulators parked in `state`).
// A query's result depends only on its own vector and keys: the same whatever else shares the call.
constexpr int KEY_CHUNK = 64;  // 64 keys x (d <= 128) x 4 B <= 32 KB: stays in L1 across queries

template <int DV>
bool attend_each(const float* queries, const int* n_keys, int m_count, const float* keys, const float* values,
                 float scale, float* scores, int stride, float* out) {
  constexpr int d = 8 * DV;
  const __m256 vscale = _mm256_set1_ps(scale);
  int most = 0;
  for (int m = 0; m < m_count; ++m) most = n_keys[m] > most ? n_keys[m] : most;
  for (int s = 0; s < most; s += 8) {
    const float* k = keys + static_cast<size_t>(s) * d;
    for (int m = 0; m < m_count; ++m) {
      const float* q = queries + static_cast<size_t>(m) * d;
      float* row = scores + static_cast<size_t>(m) * stride;
      const int n = n_keys[m];
      if (s + 8 <= n) {
        _mm256_storeu_ps(row + s, _mm256_mul_ps(dot8_keys(q, k, d), vscale));
      } else {
        for (int t = s; t < n; ++t) row[t] = dot(q, keys + static_cast<size_t>(t) * d, d) * scale;
      }
    }
  }
  alignas(32) float lanes[8];
  std::vector<float> total(m_count);
  for (int m = 0; m < m_count; ++m) {  // max and sum in 8 lanes (the same order for a given n)
    float* row = scores + static_cast<size_t>(m) * stride;
    const int n = n_keys[m], padded = (n + 7) & ~7;
    for (int s = n; s < padded; ++s) row[s] = -INFINITY;
    __m256 vtop = _mm256_set1_ps(-INFINITY);
    for (int s = 0; s < padded; s += 8) vtop = _mm256_max_ps(vtop, _mm256_loadu_ps(row + s));
    _mm256_store_ps(lanes, vtop);
    float top = lanes[0];
    for (int l = 1; l < 8; ++l) top = lanes[l] > top ? lanes[l] : top;
    const __m256 shift = _mm256_set1_ps(top);
    __m256 vtotal = _mm256_setzero_ps();
    for (int s = 0; s < padded; s += 8) {
      __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(row + s), shift));
      if (s + 8 > n) e = _mm256_and_ps(e, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n - s),
                                                                                  _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))));
      _mm256_storeu_ps(row + s, e);
      vtotal = _mm256_add_ps(vtotal, e);
    }
    _mm256_store_ps(lanes, vtotal);
    total[m] = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
  }
  std::vector<float> state(static_cast<size_t>(m_count) * 2 * d, 0.0f);  // even / odd sums per query
  for (int c0 = 0; c0 < most; c0 += KEY_CHUNK) {
    for (int m = 0; m < m_count; ++m) {
      const int n = n_keys[m], c1 = c0 + KEY_CHUNK < n ? c0 + KEY_CHUNK : n;
      if (c0 >= n) continue;
      const float* row = scores + static_cast<size_t>(m) * stride;
      float* st = state.data() + static_cast<size_t>(m) * 2 * d;
      __m256 even[DV], odd[DV];
      for (int j = 0; j < DV; ++j) {
        even[j] = _mm256_loadu_ps(st + 8 * j);
        odd[j] = _mm256_loadu_ps(st + d + 8 * j);
      }
      int s = c0;
      for (; s + 2 <= c1; s += 2) {
        const __m256 p0 = _mm256_set1_ps(row[s]), p1 = _mm256_set1_ps(row[s + 1]);
        const float* v0 = values + static_cast<size_t>(s) * d;
        const float* v1 = v0 + d;
        for (int j = 0; j < DV; ++j) {
          even[j] = _mm256_fmadd_ps(p0, _mm256_loadu_ps(v0 + 8 * j), even[j]);
          odd[j] = _mm256_fmadd_ps(p1, _mm256_loadu_ps(v1 + 8 * j), odd[j]);
        }
      }
      if (s < c1) {  // only at the query's last key (chunks are even-sized)
        const __m256 p0 = _mm256_set1_ps(row[s]);
        const float* v0 = values + static_cast<size_t>(s) * d;
        for (int j = 0; j < DV; ++j) even[j] = _mm256_fmadd_ps(p0, _mm256_loadu_ps(v0 + 8 * j), even[j]);
      }
      for (int j = 0; j < DV; ++j) {
        _mm256_storeu_ps(st + 8 * j, even[j]);
        _mm256_storeu_ps(st + d + 8 * j, odd[j]);
      }
    }
  }
  for (int m = 0; m < m_count; ++m) {
    const float* st = state.data() + static_cast<size_t>(m) * 2 * d;
    const __m256 inv = _mm256_set1_ps(1.0f / total[m]);
    for (int j = 0; j < DV; ++j)
      _mm256_storeu_ps(out + static_cast<size_t>(m) * d + 8 * j,
                       _mm256_mul_ps(_mm256_add_ps(_mm256_loadu_ps(st + 8 * j), _mm256_loadu_ps(st + d + 8 * j)), inv));
  }
  return true;
}
#endif

// The head dims with a register-resident path (others take `attend`'s general loops).
bool attend_fast(const float* queries, const int* n_keys, int m_count, const float* keys, const float* values,
                 int d, float scale, float* scores, int stride, float* out) {
#if defined(__AVX2__) && defined(__FMA__)
  switch (d) {
    case 32: return attend_each<4>(queries, n_keys, m_count, keys, values, scale, scores, stride, out);
    case 48: return attend_each<6>(queries, n_keys, m_count, keys, values, scale, scores, stride, out);
    case 64: return attend_each<8>(queries, n_keys, m_count, keys, values, scale, scores, stride, out);
    case 128: return attend_each<16>(queries, n_keys, m_count, keys, values, scale, scores, stride, out);
    default: return false;
  }
#else
  (void)queries, (void)n_keys, (void)m_count, (void)keys, (void)values, (void)d, (void)scale, (void)scores,
      (void)stride, (void)out;
  return false;
#endif
}

// Attention of M query vectors sharing one K/V head: query m (queries [M, d]) sees keys 0..n_keys[m]-1
// (keys / values [*, d]); out [M, d]. scores [M, stride] is scratch, stride >= max n_keys rounded up
// to 8. Each query's scores, softmax and weighted sum run in a fixed order of its own, so its
// result does not depend on which other queries share the call.
void attend(const float* queries, const int* n_keys, int m_count, const float* keys, const float* values, int d,
            float scale, float* scores, int stride, float* out) {
  if (attend_fast(queries, n_keys, m_count, keys, values, d, scale, scores, stride, out)) return;
  int most = 0;
  for (int m = 0; m < m_count; ++m) most = n_keys[m] > most ? n_keys[m] : most;
  float sums[4];
  for (int s = 0; s < most; ++s) {  // q . k_s for every query, each key read once
    const float* k = keys + static_cast<size_t>(s) * d;
    int m = 0;
    for (; m + 4 <= m_count; m += 4) {
      dot_rows<4>(k, queries + static_cast<size_t>(m) * d, d, d, sums);
      for (int r = 0; r < 4; ++r) scores[static_cast<size_t>(m + r) * stride + s] = sums[r] * scale;
    }
    for (; m < m_count; ++m) scores[static_cast<size_t>(m) * stride + s] = dot(k, queries + static_cast<size_t>(m) * d, d) * scale;
  }
  std::vector<float> total(m_count);
  for (int m = 0; m < m_count; ++m) {
    float* row = scores + static_cast<size_t>(m) * stride;
    const int n = n_keys[m];
    float top = -INFINITY;
    for (int s = 0; s < n; ++s) top = row[s] > top ? row[s] : top;
    for (int s = 0; s < n; ++s) row[s] -= top;
    for (int s = n; s < stride && s < ((n + 7) & ~7); ++s) row[s] = 0.0f;  // padding: finite
    exp_inplace(row, n);
    float t = 0.0f;
    for (int s = 0; s < n; ++s) t += row[s];
    total[m] = t;
    for (int i = 0; i < d; ++i) out[static_cast<size_t>(m) * d + i] = 0.0f;
  }
  for (int s = 0; s < most; ++s) {  // weighted values, each value row read once
    const float* v = values + static_cast<size_t>(s) * d;
    for (int m = 0; m < m_count; ++m) {
      if (s >= n_keys[m]) continue;
      const float p = scores[static_cast<size_t>(m) * stride + s];
      float* o = out + static_cast<size_t>(m) * d;
      for (int i = 0; i < d; ++i) o[i] += p * v[i];
    }
  }
  for (int m = 0; m < m_count; ++m) {
    const float inv = 1.0f / total[m];
    for (int i = 0; i < d; ++i) out[static_cast<size_t>(m) * d + i] *= inv;
  }
}

// n floats left uninitialized: each layer buffer is written before it is read, and zeroing them is serial
// time that the other threads would wait through.
std::unique_ptr<float[]> uninitialized(size_t n) { return std::unique_ptr<float[]>(new float[n]); }

// In place over n values of gate g and up u: g = silu(g) * u = g / (1 + exp(-g)) * u.
void silu_mul(float* g, const float* u, int n) {
  std::vector<float> e(static_cast<size_t>((n + 7) & ~7));
  for (int i = 0; i < n; ++i) e[i] = -g[i];
  for (int i = n; i < static_cast<int>(e.size()); ++i) e[i] = 0.0f;
  exp_inplace(e.data(), n);
  for (int i = 0; i < n; ++i) g[i] = g[i] / (1.0f + e[i]) * u[i];
}

}  // namespace

extern "C" {

// Threads for every later call (n < 1 counts as 1): the caller plus n - 1 workers, started here and
// kept; 1 stops them and runs everything on the calling thread. Results are the same bits for any n.
void dfl_set_threads(int32_t n) { set_pool_threads(n); }

// The thread count dfl_set_threads last set (1 in a forked child).
int32_t dfl_threads() { return pool_threads.load(); }

// How many jobs (a projection's panel chunks, a layer's attention heads) have been split between
// threads so far: work under the split threshold, or arriving while the pool is busy, runs alone.
int64_t dfl_pool_jobs() { return pool_jobs.load(); }

// out [rows, n] = x [rows, k] @ w[n, k]^T (the projection the layer uses; also the lm_head / fc).
void dfl_matmul_nt(const float* x, int32_t rows, int32_t k, const float* w, int32_t n, float* out) {
  matmul_nt(x, rows, k, w, n, out);
}

// panels [ceil(n / 8) * k * 8] = w [n, k] in the layer's panel layout.
void dfl_pack_panels(const float* w, int32_t n, int32_t k, float* panels) { pack_panels(w, n, k, panels); }

// out [rows, n] = weight * x / rms(x) row by row (x [rows, n]; the layer's RMSNorm).
void dfl_rms_norm(const float* x, int32_t rows, int32_t n, const float* weight, float eps, float* out) {
  for (int r = 0; r < rows; ++r) rms_norm(x + static_cast<size_t>(r) * n, weight, n, eps, out + static_cast<size_t>(r) * n);
}

// out [rows, n] = x [rows, k] @ w^T, w given as panels (the layer's projection).
void dfl_matmul_panels(const float* x, int32_t rows, int32_t k, const float* panels, int32_t n, float* out) {
  matmul_panels(x, rows, k, panels, n, out);
}

// One layer over n_seqs sequences, each [ctx_b ; x_b]: q_rows block rows (x [n_seqs * q_rows, H]) after
// c_counts[b] context rows (ctx [sum c_b, H] in sequence order; c_counts null: none). Sequence b's
// K/V live at k_layer / v_layer + slots[b] * NKV * capacity * D ([NKV, capacity, D]) and its rows
// sit at positions starts[b] ..; cos / sin hold one row per row of [ctx_b ; x_b], sequence by
// sequence. Returns 0, or -1 on bad sizes.
//
// dfl_decoder_layer_rows does part of it: with write_kv the K/V of every row go to the cache (else
// they must be there already); only block rows q_begin .. q_end-1 of each sequence get a query,
// attention, o_proj and the MLP (the other rows of x are left as they are). Each row's numbers are
// those of the whole-layer call (row independence), so a drafter's last layer can output the rows
// its confidence cut reads first and the rest only when needed. A partial query range needs the
// query heads to fill whole panels ((NH D) % 8 == 0).
int32_t dfl_decoder_layer_rows(const DflLayerWeights* w, float* x, int32_t n_seqs, int32_t q_rows, const float* ctx,
                               const int32_t* c_counts, const float* cos, const float* sin, float* k_layer,
                               float* v_layer, const int64_t* slots, const int64_t* starts, int32_t capacity,
                               int32_t causal, int32_t q_begin, int32_t q_end, int32_t write_kv) {
  const int H = w->hidden, NH = w->heads, NKV = w->kv_heads, D = w->head_dim, I = w->intermediate;
  const int QKV = (NH + 2 * NKV) * D, group = NH / NKV;
  const size_t slot_size = static_cast<size_t>(NKV) * capacity * D;  // one sequence's K (or V) of this layer
  if (n_seqs < 1 || q_rows < 1 || NKV < 1 || NH % NKV != 0 || D % 2 != 0) return -1;
  const bool whole = write_kv && q_begin == 0 && q_end == q_rows;  // the plain layer: one projection of all rows
  if (q_begin < 0 || q_end > q_rows || q_begin >= q_end || (!whole && (NH * D) % 8 != 0)) return -1;
  std::vector<int> first_row(n_seqs + 1, 0), first_ctx(n_seqs + 1, 0);  // row offsets of each sequence
  int longest = 0;  // keys of the longest sequence after this call's writes
  for (int b = 0; b < n_seqs; ++b) {
    const int c = c_counts ? c_counts[b] : 0;
    if (c < 0 || starts[b] < 0 || starts[b] + c + q_rows > capacity || slots[b] < 0) return -1;
    first_ctx[b + 1] = first_ctx[b] + c;
    first_row[b + 1] = first_row[b] + c + q_rows;
    longest = starts[b] + c + q_rows > longest ? static_cast<int>(starts[b]) + c + q_rows : longest;
  }
  const int rows = first_row[n_seqs], qn = q_end - q_begin, q_total = n_seqs * qn;
  auto x_row = [&](int i) { return x + static_cast<size_t>((i / qn) * q_rows + q_begin + i % qn) * H; };

  // 1) input norm (block rows only; context rows are already features) and the q/k/v projection:
  // K/V columns of every row when writing K/V, q columns of the query rows
  auto h = uninitialized(static_cast<size_t>(rows) * H), qkv = uninitialized(static_cast<size_t>(rows) * QKV);
  for (int b = 0; b < n_seqs; ++b) {
    const int c = first_ctx[b + 1] - first_ctx[b];
    for (int r = 0; write_kv && r < c; ++r)
      for (int i = 0; i < H; ++i)
        h[static_cast<size_t>(first_row[b] + r) * H + i] = ctx[static_cast<size_t>(first_ctx[b] + r) * H + i];
    for (int t = write_kv ? 0 : q_begin; t < (write_kv ? q_rows : q_end); ++t)
      rms_norm(x + static_cast<size_t>(b * q_rows + t) * H, w->input_norm, H, w->eps,
               h.get() + static_cast<size_t>(first_row[b] + c + t) * H);
  }
  const int q_panels = NH * D / 8, all_panels = (QKV + 7) / 8;
  if (whole) {
    layer_panels(w, w->qkv, h.get(), rows, H, QKV, qkv.get());
  } else {
    if (write_kv) layer_panel_range(w, w->qkv, h.get(), rows, H, QKV, q_panels, all_panels, qkv.get());
    for (int b = 0; b < n_seqs; ++b) {
      const size_t r0 = static_cast<size_t>(first_row[b] + first_ctx[b + 1] - first_ctx[b] + q_begin);
      layer_panel_range(w, w->qkv, h.get() + r0 * H, qn, H, QKV, 0, q_panels, qkv.get() + r0 * QKV);
    }
  }

  // 2) per-head q/k norm and RoPE; K/V of every row into its sequence's cache at its position
  for (int b = 0; b < n_seqs; ++b) {
    const int c_rows = first_ctx[b + 1] - first_ctx[b];
    float* k_seq = k_layer + slots[b] * slot_size;
    float* v_seq = v_layer + slots[b] * slot_size;
    for (int local = 0; local < c_rows + q_rows; ++local) {
      const bool query = local >= c_rows + q_begin && local < c_rows + q_end;  // context rows need no query
      if (!query && !write_kv) continue;
      const int r = first_row[b] + local;
      float* row = qkv.get() + static_cast<size_t>(r) * QKV;
      const float* cs = cos + static_cast<size_t>(r) * D;
      const float* sn = sin + static_cast<size_t>(r) * D;
      for (int head = (query ? 0 : NH); head < (write_kv ? NH + NKV : NH); ++head) {
        float* v = row + head * D;
        const float* norm = head < NH ? w->q_norm : w->k_norm;
        if (norm) rms_norm(v, norm, D, w->eps, v);
        rope(v, cs, sn, D);
      }
      for (int kv = 0; write_kv && kv < NKV; ++kv) {
        float* kd = k_seq + (static_cast<size_t>(kv) * capacity + starts[b] + local) * D;
        float* vd = v_seq + (static_cast<size_t>(kv) * capacity + starts[b] + local) * D;
        for (int i = 0; i < D; ++i) {
          kd[i] = row[(NH + kv) * D + i];
          vd[i] = row[(NH + NKV + kv) * D + i];
        }
      }
    }
  }

  // 3) attention of the query rows (per sequence and K/V head), then o_proj and the residual;
  // queries grouped by the K/V head they read (GQA): row t, head kv*group+j -> slot t*group+j
  const int stride = (longest + 7) & ~7, m_count = qn * group;
  auto attn = uninitialized(static_cast<size_t>(q_total) * NH * D);
  auto out = uninitialized(static_cast<size_t>(q_total) * H);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  // task b * NKV + kv: sequence b's queries of K/V head kv (scratch: queries, heads_out [m_count, D],
  // scores [m_count, stride], n_keys [m_count]); each writes its own part of attn
  auto attend_kv_head = [&](int task, float* queries, float* heads_out, float* scores, int* n_keys) {
    const int b = task / NKV, kv = task % NKV;
    const int c_rows = first_ctx[b + 1] - first_ctx[b], start = static_cast<int>(starts[b]);
    for (int t = 0; t < qn; ++t)
      for (int j = 0; j < group; ++j) {
        const float* q =
            qkv.get() + static_cast<size_t>(first_row[b] + c_rows + q_begin + t) * QKV + (kv * group + j) * D;
        for (int i = 0; i < D; ++i) queries[(static_cast<size_t>(t) * group + j) * D + i] = q[i];
        n_keys[t * group + j] = causal ? start + c_rows + q_begin + t + 1 : start + c_rows + q_rows;
      }
    const size_t base = slots[b] * slot_size + static_cast<size_t>(kv) * capacity * D;
    if (w->window > 0) {  // each row's keys are its own range [lo, hi): one call per row, based at lo, so a
                          // query's numbers depend on its position and keys only (row independence)
      for (int t = 0; t < qn; ++t) {
        const int p = start + c_rows + q_begin + t, end = n_keys[t * group];
        const int lo = p - w->window + 1 > 0 ? p - w->window + 1 : 0;
        const int hi = causal || p + w->window > end ? end : p + w->window;
        for (int j = 0; j < group; ++j) n_keys[t * group + j] = hi - lo;
        const size_t at = base + static_cast<size_t>(lo) * D, row = static_cast<size_t>(t) * group;
        attend(queries + row * D, n_keys + row, group, k_layer + at, v_layer + at, D, scale, scores, stride,
               heads_out + row * D);
      }
    } else {
      attend(queries, n_keys, m_count, k_layer + base, v_layer + base, D, scale, scores, stride, heads_out);
    }
    for (int t = 0; t < qn; ++t)
      for (int j = 0; j < group; ++j)
        for (int i = 0; i < D; ++i)
          attn[(static_cast<size_t>(b * qn + t) * NH + kv * group + j) * D + i] =
              heads_out[(static_cast<size_t>(t) * group + j) * D + i];
  };
  const int tasks = n_seqs * NKV;
  const size_t head_floats = static_cast<size_t>(m_count) * D, score_floats = static_cast<size_t>(m_count) * stride;
  if (parallel_worth(2L * tasks * m_count * longest * D, tasks)) {
    parallel_for(tasks, [&](int task) {  // scratch of its own: tasks run on any thread
      auto scratch = uninitialized(2 * head_floats + score_floats);
      std::vector<int> n_keys(m_count);
      attend_kv_head(task, scratch.get(), scratch.get() + head_floats, scratch.get() + 2 * head_floats,
                     n_keys.data());
    });
  } else {
    auto queries = uninitialized(head_floats), heads_out = uninitialized(head_floats);
    auto scores = uninitialized(score_floats);
    std::vector<int> n_keys(m_count);
    for (int task = 0; task < tasks; ++task)
      attend_kv_head(task, queries.get(), heads_out.get(), scores.get(), n_keys.data());
  }
  layer_panels(w, w->o_proj, attn.get(), q_total, NH * D, H, out.get());
  for (int t = 0; t < q_total; ++t)
    for (int i = 0; i < H; ++i) x_row(t)[i] += out[static_cast<size_t>(t) * H + i];

  // 4) post-attention norm, SwiGLU MLP, residual
  auto gate_up = uninitialized(static_cast<size_t>(q_total) * 2 * I);
  auto act = uninitialized(static_cast<size_t>(q_total) * I);
  for (int t = 0; t < q_total; ++t)
    rms_norm(x_row(t), w->post_norm, H, w->eps, h.get() + static_cast<size_t>(t) * H);
  layer_panels(w, w->gate_up, h.get(), q_total, H, 2 * I, gate_up.get());
  for (int t = 0; t < q_total; ++t) {
    float* g = gate_up.get() + static_cast<size_t>(t) * 2 * I;
    silu_mul(g, g + I, I);
    for (int i = 0; i < I; ++i) act[static_cast<size_t>(t) * I + i] = g[i];
  }
  layer_panels(w, w->down, act.get(), q_total, I, H, out.get());
  for (int t = 0; t < q_total; ++t)
    for (int i = 0; i < H; ++i) x_row(t)[i] += out[static_cast<size_t>(t) * H + i];
  return 0;
}

int32_t dfl_decoder_layer(const DflLayerWeights* w, float* x, int32_t n_seqs, int32_t q_rows, const float* ctx,
                          const int32_t* c_counts, const float* cos, const float* sin, float* k_layer, float* v_layer,
                          const int64_t* slots, const int64_t* starts, int32_t capacity, int32_t causal) {
  return dfl_decoder_layer_rows(w, x, n_seqs, q_rows, ctx, c_counts, cos, sin, k_layer, v_layer, slots, starts,
                                capacity, causal, 0, q_rows, 1);
}

}  // extern "C"

// ---- heads: greedy tokens from hidden rows through an lm_head given as panels ----------------------

namespace {

// Index of the largest value, NaN counting as -inf, the first one on ties; 0 when none is above -inf
// (torch's argmax of canonical_logits).
int64_t argmax(const float* v, int n) {
  int64_t best = 0;
  float top = -INFINITY;
  for (int i = 0; i < n; ++i)
    if (v[i] > top) {
      top = v[i];
      best = i;
    }
  return best;
}

// log of the softmax maximum of one row: -log(sum exp(v - max)); -inf when the row has a NaN or no
// finite maximum (spec: (top - logsumexp).nan_to_num(nan=-inf)). scratch: n rounded up to 8 floats.
float log_top_probability(const float* v, int n, float* scratch) {
  float top = -INFINITY;
  for (int i = 0; i < n; ++i) {
    if (std::isnan(v[i])) return -INFINITY;
    top = v[i] > top ? v[i] : top;
  }
  if (!std::isfinite(top)) return -INFINITY;
  for (int i = 0; i < n; ++i) scratch[i] = v[i] - top;
  for (int i = n; i < ((n + 7) & ~7); ++i) scratch[i] = 0.0f;
  exp_inplace(scratch, n);
  float total = 0.0f;
  for (int i = 0; i < n; ++i) total += scratch[i];
  return -std::log(total);
}

// log of one row's softmax at temperature t > 0 at column c: (s_c - max s) - log(sum exp(s - max s)),
// s = v / t (the trust of a sampled draft, spec: decoding.drafts.confident_prefix); -inf when the
// row has a NaN or no finite maximum. scratch: n rounded up to 8 floats.
float log_probability_at(const float* v, int n, int c, float t, float* scratch) {
  float top = -INFINITY;
  for (int i = 0; i < n; ++i) {
    if (std::isnan(v[i])) return -INFINITY;
    scratch[i] = v[i] / t;
    top = scratch[i] > top ? scratch[i] : top;
  }
  if (!std::isfinite(top)) return -INFINITY;
  const float s_c = scratch[c];
  for (int i = 0; i < n; ++i) scratch[i] -= top;
  for (int i = n; i < ((n + 7) & ~7); ++i) scratch[i] = 0.0f;
  exp_inplace(scratch, n);
  float total = 0.0f;
  for (int i = 0; i < n; ++i) total += scratch[i];
  return (s_c - top) - std::log(total);
}

}  // namespace

extern "C" {

// The sampling rule's CPU twin (plugins/dflash_verify/twin: dfv_twin_sample_rows), reached through a
// pointer: this library is built with FMA contraction, the rule's bits must not be.
typedef void (*DflSampleRows)(const void* logits, int32_t dtype, int64_t n, int32_t vocab, const int64_t* positions,
                              const float* temperature, const int64_t* top_k, const float* top_p, const int64_t* seed,
                              const int64_t* ids, int64_t* out);

struct DflSampling {  // one sampled sequence's rule for its coupled drafts (decoding.drafts.coupled_drafts)
  DflSampleRows sample_rows;
  const int64_t* ids;  // [vocab] ascending token id of each head row (its noise, its tie order), or null
  float temperature;   // > 0
  int64_t top_k;
  float top_p;
  int64_t seed;
  int64_t position;    // absolute position of draft slot 1's token (slot j: position + j - 1)
};

}  // extern "C"

namespace {

// out[r] = the rule's pick for logits row r of [n, vocab] (fp32), the token at position + r.
void sample_rows_at(const DflSampling* rule, const float* logits, int n, int vocab, int64_t position, int64_t* out) {
  std::vector<int64_t> positions(n), top_k(n, rule->top_k), seed(n, rule->seed);
  std::vector<float> temperature(n, rule->temperature), top_p(n, rule->top_p);
  for (int r = 0; r < n; ++r) positions[r] = position + r;
  rule->sample_rows(logits, 0, n, vocab, positions.data(), temperature.data(), top_k.data(), top_p.data(), seed.data(),
                    rule->ids, out);
}

// The confidence cut over the draft slots read so far (dfl_greedy_drafts, dfl_draft_step): each
// chunk of slots goes through the head; the running sum of log trusts carries over. A slot's token
// is the argmax (greedy) or the sampling rule's pick with the request's noise (`sampling`: coupled
// drafts); its trust the draft's probability of that token (at the row's temperature).
struct DraftCut {
  float log_floor;
  bool cut;  // log_floor > -inf and more than one slot: otherwise every slot is kept
  const DflSampling* sampling;
  float running = 0.0f;  // log trust of the slots of earlier chunks
  std::vector<float> logits, scratch;

  DraftCut(float floor, int k, int vocab, const DflSampling* sampled = nullptr)
      : log_floor(floor), cut(floor > -INFINITY && k > 1), sampling(sampled),
        scratch(static_cast<size_t>((vocab + 7) & ~7)) {}

  // Slots lo .. hi-1 from their hidden rows [hi - lo, h]: tokens[lo .. hi-1] = their picks (head
  // rows); returns how many of them are still trusted (a prefix; all of them without a cut).
  int read(const float* hidden, int lo, int hi, int h, const float* panels, int vocab, int64_t* tokens) {
    logits.resize(static_cast<size_t>(hi - lo) * vocab);
    matmul_panels(hidden, hi - lo, h, panels, vocab, logits.data());
    if (sampling) sample_rows_at(sampling, logits.data(), hi - lo, vocab, sampling->position + lo, tokens + lo);
    // the running sums as torch's cumsum over the chunk (fp32 outputs of a double sum), plus the earlier
    // chunks' total (one fp32 add; + 0 for the first chunk changes no value the cut compares), as the torch
    // rules (confident_drafts, confident_prefix) add them up
    int trusted = 0;
    double chunk = 0.0;
    float total = running;
    for (int r = lo; r < hi; ++r) {
      const float* row = logits.data() + static_cast<size_t>(r - lo) * vocab;
      if (!sampling) tokens[r] = argmax(row, vocab);
      if (!cut) continue;
      chunk += sampling ? log_probability_at(row, vocab, static_cast<int>(tokens[r]), sampling->temperature,
                                             scratch.data())
                        : log_top_probability(row, vocab, scratch.data());
      total = static_cast<float>(chunk) + running;
      if (total >= log_floor && trusted == r - lo) ++trusted;
    }
    running = total;
    return cut ? trusted : hi - lo;
  }
};

}  // namespace

extern "C" {

// Trust of sampled drafts: out[r] = log softmax(logits[r] / temperature[r])[columns[r]] (rows of
// [rows, vocab]; temperature > 0), -inf for a row with a NaN: what the C++ draft step's cut adds up.
void dfl_sampled_trust(const float* logits, int32_t rows, int32_t vocab, const int64_t* columns,
                       const float* temperature, float* out) {
  std::vector<float> scratch(static_cast<size_t>((vocab + 7) & ~7));
  for (int r = 0; r < rows; ++r)
    out[r] = log_probability_at(logits + static_cast<size_t>(r) * vocab, vocab, static_cast<int>(columns[r]),
                                temperature[r], scratch.data());
}

// Greedy verify of one block (backends/cpu/target.py verify_lazily at temperature 0): rows of hidden [rows, h]
// through the head in chunks of first, first, 2 first, ... until a draft mismatches. tokens [rows]
// gets the target's token of every row computed up to the first mismatch (the caller fills -1);
// returns the number of accepted drafts (drafts [rows - 1]).
int32_t dfl_greedy_verify(const float* hidden, int32_t rows, int32_t h, const float* panels, int32_t vocab,
                          const int64_t* drafts, int32_t first, int64_t* tokens) {
  std::vector<float> logits;
  int lo = 0, size = first;
  while (lo < rows) {
    const int hi = lo + size < rows ? lo + size : rows;
    logits.resize(static_cast<size_t>(hi - lo) * vocab);
    matmul_panels(hidden + static_cast<size_t>(lo) * h, hi - lo, h, panels, vocab, logits.data());
    for (int r = lo; r < hi; ++r) {
      tokens[r] = argmax(logits.data() + static_cast<size_t>(r - lo) * vocab, vocab);
      if (r == rows - 1 || drafts[r] != tokens[r]) return r;
    }
    size = lo ? 2 * size : size;
    lo = hi;
  }
  return rows - 1;
}

// Sampled verify of one block (backends/cpu/target.py verify_lazily, one row at temperature > 0): rows of hidden
// [rows, h] through the head in chunks of first, first, 2 first, ...; row r's token is the sampling rule's
// pick (`sampling`: the twin, position sampling->position + r) until a draft mismatches. tokens [rows] gets
// the target's token of every row computed up to the first mismatch (the caller fills -1); returns the
// number of accepted drafts (drafts [rows - 1]), or -1 without a rule.
int32_t dfl_sampled_verify(const float* hidden, int32_t rows, int32_t h, const float* panels, int32_t vocab,
                           const int64_t* drafts, int32_t first, const DflSampling* sampling, int64_t* tokens) {
  if (!sampling || !sampling->sample_rows || !(sampling->temperature > 0.0f) || first < 1) return -1;
  std::vector<float> logits;
  int lo = 0, size = first;
  while (lo < rows) {
    const int hi = lo + size < rows ? lo + size : rows, n = hi - lo;
    logits.resize(static_cast<size_t>(n) * vocab);
    matmul_panels(hidden + static_cast<size_t>(lo) * h, n, h, panels, vocab, logits.data());
    sample_rows_at(sampling, logits.data(), n, vocab, sampling->position + lo, tokens + lo);
    for (int r = lo; r < hi; ++r)
      if (r == rows - 1 || drafts[r] != tokens[r]) {
        for (int rest = r + 1; rest < hi; ++rest) tokens[rest] = -1;  // past the mismatch: not the caller's
        return r;
      }
    size = lo ? 2 * size : size;
    lo = hi;
  }
  return rows - 1;
}

// Greedy drafts of one block with the confidence cut (decoding.drafts.confident_drafts for one row):
// tokens [k] = argmax of each slot's head row (indices into the head's rows). With log_floor = -inf
// every slot is kept; otherwise slots are read in chunks (first, then the rest) and the drafts stop
// after the last slot whose running sum of log top-probabilities is >= log_floor (at least one).
// Returns the number kept.
int32_t dfl_greedy_drafts(const float* hidden, int32_t k, int32_t h, const float* panels, int32_t vocab,
                          float log_floor, int32_t first, int64_t* tokens) {
  DraftCut state(log_floor, k, vocab);
  int lo = 0;
  while (lo < k) {
    const int hi = !state.cut ? k : (lo ? k : (first < k ? first : k));
    const int trusted = state.read(hidden + static_cast<size_t>(lo) * h, lo, hi, h, panels, vocab, tokens);
    if (trusted < hi - lo) return lo + trusted > 1 ? lo + trusted : 1;
    lo = hi;
  }
  return k;
}

}  // extern "C"

// ---- one sequence's whole draft step ---------------------------------------------------------------

extern "C" {

struct DflDraftStep {  // pointers stay owned by the Python side (layers.DraftStep keeps them alive)
  const DflLayerWeights* const* layers;  // [n_layers] the drafter's decoder layers
  int32_t n_layers;
  const float* fc;           // panels of fc [H, fc_in]: target taps -> context features
  int32_t fc_in;
  const float* hidden_norm;  // [H] norm of the context features
  float hidden_eps;
  const float* final_norm;   // [H] the drafter's final norm
  float final_eps;
  const float* head;         // panels of the head [vocab, H] (the target lm_head or its draft-vocabulary rows)
  int32_t vocab;
  const int64_t* vocab_ids;  // [vocab] token of each head row, or null (row index = token)
  int32_t first;             // slots the confidence cut reads before deciding on the rest
};

// backends/cpu/draft.py draft_block for one sequence in one call: the context features of the n_ctx rows
// committed since the last step (target_hidden [n_ctx, fc_in] -> fc -> norm), every layer over
// [context ; block] (block [width, H]: the block's input rows, read only) with their K/V written at
// positions start - n_ctx .. start + width - 1 of cache slot `slot` (layer i's cache at k_cache / v_cache
// + i * layer_floats), then the head over slots 1 .. width-1 with the confidence cut. With a cut
// and more than `first` slots the last layer outputs slots 1..first, and the rest only when all of
// those are trusted (their K/V are written either way). cos / sin: RoPE rows of those positions.
// `sampling` null: greedy drafts; else coupled drafts (the request's sampling rule on the draft logits,
// `DflSampling`) trusted by their own probability. drafts [width - 1] gets the kept drafts (tokens);
// *last_rows the block rows the last layer output. Returns the number kept (>= 1), or -1 on bad sizes.
// The numbers are those of the separate calls (fc, rms_norm, dfl_decoder_layer(_rows), then
// dfl_greedy_drafts, or the head's panels, the twin's rule and dfl_sampled_trust).
int32_t dfl_draft_step(const DflDraftStep* s, const float* block, int32_t width, const float* target_hidden,
                       int32_t n_ctx, const float* cos, const float* sin, float* k_cache, float* v_cache,
                       int64_t layer_floats, int64_t slot, int64_t start, int32_t capacity, float log_floor,
                       const DflSampling* sampling, int64_t* drafts, int32_t* last_rows) {
  if (s->n_layers < 1 || width < 2 || n_ctx < 0 || start - n_ctx < 0 || (n_ctx && !target_hidden)) return -1;
  if (sampling && !(sampling->sample_rows && sampling->temperature > 0.0f)) return -1;
  const DflLayerWeights* last = s->layers[s->n_layers - 1];
  const int H = last->hidden, k = width - 1, first = s->first;
  std::vector<float> x(block, block + static_cast<size_t>(width) * H), features(static_cast<size_t>(n_ctx) * H);
  if (n_ctx) {
    matmul_panels(target_hidden, n_ctx, s->fc_in, s->fc, H, features.data());
    for (int r = 0; r < n_ctx; ++r) {
      float* row = features.data() + static_cast<size_t>(r) * H;
      rms_norm(row, s->hidden_norm, H, s->hidden_eps, row);
    }
  }
  const int32_t count = n_ctx;
  const int64_t first_position = start - n_ctx;
  const float* ctx = n_ctx ? features.data() : nullptr;
  const int32_t* counts = n_ctx ? &count : nullptr;
  auto layer = [&](int i, int lo, int hi, bool write_kv) {
    return dfl_decoder_layer_rows(s->layers[i], x.data(), 1, width, ctx, counts, cos, sin, k_cache + i * layer_floats,
                                  v_cache + i * layer_floats, &slot, &first_position, capacity, 0, lo, hi,
                                  write_kv ? 1 : 0);
  };
  for (int i = 0; i + 1 < s->n_layers; ++i)
    if (layer(i, 0, width, true) != 0) return -1;

  DraftCut state(log_floor, k, s->vocab, sampling);
  const bool lazy = state.cut && k > first && (last->heads * last->head_dim) % 8 == 0;
  const int head_first = state.cut && first < k ? first : k;  // slots of the first chunk
  const int ln = s->n_layers - 1;
  if (layer(ln, lazy ? 1 : 0, lazy ? 1 + first : width, true) != 0) return -1;
  *last_rows = lazy ? first : width;
  std::vector<float> normed(static_cast<size_t>(k) * H);
  std::vector<int64_t> tokens(k);
  auto read = [&](int lo, int hi) {  // final norm of slots lo..hi-1 (block rows lo+1..hi), then the head
    for (int r = lo; r < hi; ++r)
      rms_norm(x.data() + static_cast<size_t>(r + 1) * H, s->final_norm, H, s->final_eps,
               normed.data() + static_cast<size_t>(r) * H);
    return state.read(normed.data() + static_cast<size_t>(lo) * H, lo, hi, H, s->head, s->vocab, tokens.data());
  };
  int kept = k;
  const int trusted = read(0, head_first);
  if (trusted < head_first) {
    kept = trusted > 1 ? trusted : 1;
  } else if (head_first < k) {  // every slot read so far is trusted: the rest of the block too
    if (lazy) {
      if (layer(ln, 1 + first, width, false) != 0) return -1;
      *last_rows = width - 1;
    }
    const int more = read(head_first, k);
    kept = more < k - head_first ? (head_first + more > 1 ? head_first + more : 1) : k;
  }
  for (int r = 0; r < kept; ++r) drafts[r] = s->vocab_ids ? s->vocab_ids[tokens[r]] : tokens[r];
  return kept;
}

}  // extern "C"
