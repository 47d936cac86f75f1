// The sampling rule's scalar pieces, bit-exact on the GPU and on the host (the CPU twin).
//
// Mirrors dflash_trt/decoding/sampling.py, which is the source of truth:
//   - canonical logits: NaN -> -inf, -inf stays, +inf stays (the reference's
//     `nan_to_num(nan=-inf, posinf=inf, neginf=-inf)`; see dfv_canonical_logit);
//   - the counter hash (lowbias32 `mix32`, chained over seed_lo, seed_hi, position, vocab id);
//   - u = ((h >> 9) + 0.5) / 2**23 and g = -log_f32(-log_f32(u)), with log_f32 the odd atanh
//     series built from IEEE-rounded +, *, / and frexp only.
//   - the exact top-p rule: dfv_exp_neg (the reference's `exp_f32`: exp(x) for x <= 0, Cody-Waite
//     + degree-7 Taylor) and fixed-point masses (2^-40 for softmax sums, 2^-62 for top-p masses),
//     summed as integers so every reduction order — GPU, twin, torch — gives the same bits.
//
// FOOTGUN: every float op goes through dfv_add/sub/mul/div. On the device they are __f*_rn,
// which nvcc never contracts into FMAs; on the host, build with -ffp-contract=off.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define DFV_HD __host__ __device__ __forceinline__
#define DFV_HD_OUTLINE __host__ __device__ __noinline__ inline  // rare, heavy: keeps kernels small
#else
#define DFV_HD inline
#define DFV_HD_OUTLINE inline
#endif

#if defined(__CUDA_ARCH__)
#define DFV_NO_UNROLL _Pragma("unroll 1")  // device pass only: gcc -Werror rejects the pragma
#else
#define DFV_NO_UNROLL
#endif

namespace dfv {

constexpr float kNegInf = -__builtin_huge_valf();
constexpr float kInf = __builtin_huge_valf();
constexpr float kFltMax = 3.40282346638528859811704183484516925e+38f;

// ---------------------------------------------------------------------------------------------
// IEEE-rounded arithmetic (no FMA contraction anywhere)
// ---------------------------------------------------------------------------------------------

DFV_HD float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

DFV_HD float sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

DFV_HD float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

DFV_HD float div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

DFV_HD uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
#endif
}

DFV_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
#endif
}

// Round-to-nearest-even float -> int64 (x must fit) and int64 -> float.
DFV_HD int64_t round_to_i64(float x) {
#if defined(__CUDA_ARCH__)
  return __float2ll_rn(x);
#else
  return llrintf(x);  // default rounding mode: nearest-even
#endif
}

DFV_HD float i64_to_float(int64_t x) {
#if defined(__CUDA_ARCH__)
  return __ll2float_rn(x);
#else
  return static_cast<float>(x);  // cvtsi2ss: correctly rounded, nearest-even
#endif
}

// 2**n as a float, for -126 <= n <= 127.
DFV_HD float pow2(int n) { return bits_float(static_cast<uint32_t>(n + 127) << 23); }

// ---------------------------------------------------------------------------------------------
// Logits
// ---------------------------------------------------------------------------------------------

// The reference upcasts to fp32 and applies `nan_to_num(nan=-inf, posinf=inf, neginf=-inf)`:
// NaN becomes -inf; -inf stays -inf. Neither is ever sampled; a row of only -inf picks token 0.
DFV_HD float canonical_logit(float x) {
  if (x != x) return kNegInf;
  return x;
}

// logit / T for a sampled row (T > 0), the `scores` of the reference.
DFV_HD float score(float x, float temperature) { return div(canonical_logit(x), temperature); }

// Order-preserving uint32 key of a non-NaN float (-0 folded into +0).
DFV_HD uint32_t order_key(float s) {
  uint32_t u = float_bits(s);
  if (u == 0x80000000u) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

DFV_HD float key_float(uint32_t k) {
  return bits_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// ---------------------------------------------------------------------------------------------
// Counter-based Gumbel noise
// ---------------------------------------------------------------------------------------------

DFV_HD uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  return x ^ (x >> 16);
}

// 32-bit hash of (seed: uint64, absolute position, vocab id); only the low 32 bits of
// position and vocab id enter, like the reference's `& _MASK32`. Its first three rounds depend on
// (seed, position) only: `hash_prefix` once per row, `hash_finish` per vocab id.
DFV_HD uint32_t hash_prefix(uint64_t seed, int64_t position) {
  uint32_t h = mix32(static_cast<uint32_t>(seed) ^ 0x9e3779b9u);
  h = mix32(h ^ static_cast<uint32_t>(seed >> 32));
  return mix32(h ^ static_cast<uint32_t>(static_cast<uint64_t>(position)));
}

DFV_HD uint32_t hash_finish(uint32_t prefix, uint32_t vocab_low) { return mix32(prefix ^ vocab_low); }

DFV_HD uint32_t counter_hash(uint64_t seed, int64_t position, int64_t vocab) {
  return hash_finish(hash_prefix(seed, position), static_cast<uint32_t>(static_cast<uint64_t>(vocab)));
}

// log_f32 from x = m * 2**e (frexp's m in [0.5, 1)). The m < sqrt(1/2) fold is arithmetic, not a
// branch (m * 1 is m exactly), so a host loop over many values vectorizes (the twin's batched noise).
DFV_HD float log_from_frexp(float m, int e) {
  const int fold = m < 0.70710678118654752f;
  m = mul(m, static_cast<float>(1 + fold));
  e -= fold;
  const float s = div(sub(m, 1.0f), add(m, 1.0f));
  const float s2 = mul(s, s);
  float series = static_cast<float>(1.0 / 13.0);
  series = add(mul(series, s2), static_cast<float>(1.0 / 11.0));
  series = add(mul(series, s2), static_cast<float>(1.0 / 9.0));
  series = add(mul(series, s2), static_cast<float>(1.0 / 7.0));
  series = add(mul(series, s2), static_cast<float>(1.0 / 5.0));
  series = add(mul(series, s2), static_cast<float>(1.0 / 3.0));
  series = add(mul(series, s2), 1.0f);
  return add(mul(static_cast<float>(e), static_cast<float>(0.6931471805599453)), mul(mul(s, 2.0f), series));
}

// Natural log of a positive normal float from IEEE-rounded ops and frexp only. The constants
// are the reference's Python doubles rounded to fp32, as torch does for a scalar operand of a
// float32 tensor op (the comparison included: m < 0.70710677f, not the double sqrt(.5)).
DFV_HD float log_f32(float x) {
  int e = 0;
  const float m = frexpf(x, &e);
  return log_from_frexp(m, e);
}

// u in (0, 1) from the top 23 bits of the hash; exact in fp32 (the 23-bit integer converts the same
// as signed, which vector units do directly).
DFV_HD float uniform(uint32_t h) {
  return mul(add(static_cast<float>(static_cast<int32_t>(h >> 9)), 0.5f), static_cast<float>(1.0 / 8388608.0));
}

// g(s, p, v) = -log(-log(u)), in [-2.82, 16.64].
DFV_HD float gumbel(uint64_t seed, int64_t position, int64_t vocab) {
  const float u = uniform(counter_hash(seed, position, vocab));
  return -log_f32(-log_f32(u));
}

// Largest possible spread between two Gumbel draws (16.64 + 2.82) plus slack for fp32 rounding
// of s + g while |s| < 2**20: a score more than this below the row max can never win.
constexpr float kGumbelReach = 20.0f;
constexpr float kPrefilterLimit = 1048576.0f;

// ---------------------------------------------------------------------------------------------
// Softmax numerators and fixed-point masses
// ---------------------------------------------------------------------------------------------

// exp(x) for x <= 0 (x = s - max): 1 at 0, 0 below -104 or at -inf, subnormals in between.
DFV_HD float exp_neg(float x) {
  if (!(x > -104.0f)) return 0.0f;
  const float t = floorf(add(mul(x, 1.44269502162933349609375f), 0.5f));  // round(x / ln2)
  const int n = static_cast<int>(t);
  // Cody-Waite: ln2 = 0x1.62e4p-1 (exact products for |n| < 2**8) + 1.4286068e-6.
  const float r = sub(sub(x, mul(t, 0.693145751953125f)), mul(t, 1.42860682030941723212e-6f));
  float p = static_cast<float>(1.0 / 5040.0);
  p = add(mul(p, r), static_cast<float>(1.0 / 720.0));
  p = add(mul(p, r), static_cast<float>(1.0 / 120.0));
  p = add(mul(p, r), static_cast<float>(1.0 / 24.0));
  p = add(mul(p, r), static_cast<float>(1.0 / 6.0));
  p = add(mul(p, r), 0.5f);
  p = add(mul(p, r), 1.0f);
  p = add(mul(p, r), 1.0f);
  if (n >= -125) return mul(p, pow2(n));
  return mul(mul(p, pow2(-64)), pow2(n + 64));  // one rounding, into the subnormals
}

// Softmax numerators in units of 2**-40 (e <= 1; sums of up to 2**23 terms fit in int64).
DFV_HD int64_t fixed40(float e) { return round_to_i64(mul(e, 1099511627776.0f)); }
DFV_HD float from_fixed40(int64_t x) { return mul(i64_to_float(x), static_cast<float>(1.0 / 1099511627776.0)); }

// Probabilities in units of 2**-62 (p <= 1, so a whole row's mass stays below 2**63).
DFV_HD int64_t fixed62(float p) { return round_to_i64(mul(p, 4611686018427387904.0f)); }

// top-p as the same fixed point: mass M passes iff M < top_p, i.e. M_fixed < ceil(top_p * 2**62).
// 0 for top_p <= 0 or NaN (nothing passes).
DFV_HD uint64_t top_p_threshold(float top_p) {
  if (!(top_p > 0.0f)) return 0;
  return static_cast<uint64_t>(ceil(static_cast<double>(top_p) * 4611686018427387904.0));
}

}  // namespace dfv
