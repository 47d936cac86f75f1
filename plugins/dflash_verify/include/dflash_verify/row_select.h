// The sampling rule over one logits row [V], written once for the CUDA CTA and the CPU twin.
//
// `Blk` is the execution context: a CUDA thread block (src/verify_kernels.cu) or one host thread
// (twin/verify_twin.cpp). It provides
//   stream(row, V, f)        f(v, float logit) for each v this thread owns (any order), with
//                            several loads in flight: for the light, latency-bound passes
//   sweep(row, V, f)         the same with compact code: for the heavy radix / softmax passes
//   reduce_max(float) / reduce_sum(uint64_t) / reduce_argmax(ArgMax)   block-wide, to all threads
//   hist_begin() / hist_add(bin, mass) / hist_end()   a 256-bin (count, mass) histogram
//   hist_count() / hist_mass()                        the merged bins, after hist_end()
//   leader(f)                 f() run by one thread, its result handed to every thread
// Every reduction is order-independent (max, integer sums, argmax under a total order), so the
// kernel and the twin produce the same bits whatever the thread count or schedule.
//
// Scores s = x / T (x the canonical logit) are monotone in x, so order statistics and score
// thresholds are taken on logits and mapped once per row (lowest_logit_reaching); the per-element
// divide is only paid where a probability or a perturbed score is needed. Per sampled row:
//   1. m = score(max x). No finite score -> token 0.
//   2. top-k (0 < k < V): the k-th largest x by a 4-level radix select (8-bit digits); top-k
//      survivors are x >= x_lo, the lowest logit whose score reaches score(kth x).
//   3. top-p (< 1): fixed-point softmax sum over top-k survivors, then p* = the smallest
//      probability whose strictly-larger mass is < top_p, by a 4-level radix search with mass
//      histograms; survivors are p >= p* (ties kept or dropped together).
//   4. argmax over survivors of s + g(seed, position, v), lowest id on ties; only scores within
//      kGumbelReach of m are hashed (no other score can win).
// Greedy rows (T <= 0 or NaN) are one argmax pass over the canonical logits.
#pragma once

#include <stdint.h>

#include "dflash_verify/sampling_rule.h"
#include "dflash_verify/verify_args.h"

namespace dfv {

struct ArgMax {
  float value;
  int32_t index;  // kNoIndex when nothing was seen
};

constexpr int32_t kNoIndex = 0x7fffffff;

// Total order: larger value first, then lower index (the reference's first-maximum argmax).
DFV_HD bool better(ArgMax a, ArgMax b) {
  return a.value > b.value || (a.value == b.value && a.index < b.index);
}

struct BinPick {
  uint32_t bin;
  uint32_t rest;   // top-k: rank still to find inside the bin
  uint64_t above;  // top-p: fixed-point mass of everything above the bin
};

// Bin holding the k-th largest key, scanning from the top; k <= total count.
DFV_HD BinPick pick_kth_bin(const uint32_t* count, uint32_t k) {
  for (int d = 255; d > 0; --d) {
    if (k <= count[d]) return BinPick{static_cast<uint32_t>(d), k, 0};
    k -= count[d];
  }
  return BinPick{0, k, 0};
}

// Lowest non-empty bin whose mass above is < threshold (its largest element survives top-p).
DFV_HD BinPick pick_top_p_bin(const uint32_t* count, const uint64_t* mass, uint64_t above,
                              uint64_t threshold) {
  BinPick pick{0, 0, above};
  for (int d = 255; d >= 0; --d) {
    if (count[d] == 0) continue;
    if (above >= threshold) break;
    pick.bin = static_cast<uint32_t>(d);
    pick.above = above;
    above += mass[d];
  }
  return pick;
}

// The smallest logit x in [-FLT_MAX, +inf] with score(x) >= t (score is monotone in x).
DFV_HD float lowest_logit_reaching(float t, float temperature) {
  uint32_t lo = order_key(-kFltMax);
  uint32_t hi = order_key(kInf);
  DFV_NO_UNROLL
  while (lo < hi) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (div(key_float(mid), temperature) >= t) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return key_float(lo);
}

// What decides survival in a sampled row; thresholds on x are on canonical logits.
struct Filter {
  float m;          // max score (its token always survives)
  float x_lo;       // top-k survivors: x >= x_lo (finite score, score >= k-th largest score)
  float x_cand;     // Gumbel candidates: x >= x_cand (top-k survivors within reach of m)
  bool top_p_on;    // top_p < 1
  float inv_sum;    // 1 / softmax denominator over top-k survivors (top-p only)
  float p_star;     // top-p survivors: prob >= p_star (top-p only)
};

DFV_HD float prob(float s, const Filter& f) { return mul(exp_neg(sub(s, f.m)), f.inv_sum); }

// Survival of a token with canonical logit x and score s = x / T.
DFV_HD bool survives(float x, float s, const Filter& f) {
  return x >= f.x_lo && (!f.top_p_on || prob(s, f) >= f.p_star);
}

// 8-bit digit `level` (0 = most significant) of key, and the mask of the digits above it.
DFV_HD uint32_t digit(uint32_t key, int level) { return (key >> (24 - 8 * level)) & 0xffu; }
DFV_HD uint32_t high_mask(int level) { return level == 0 ? 0u : 0xffffffffu << (32 - 8 * level); }

// The k-th largest canonical logit (duplicates counted), 1 <= k <= V.
template <class Blk, class T>
DFV_HD float select_kth_logit(Blk& blk, const T* row, int32_t vocab, uint32_t k) {
  uint32_t prefix = 0;
  DFV_NO_UNROLL
  for (int level = 0; level < 4; ++level) {
    const uint32_t mask = high_mask(level);
    blk.hist_begin();
    blk.sweep(row, vocab, [&](int32_t, float x) {
      const uint32_t key = order_key(canonical_logit(x));
      if ((key & mask) == prefix) blk.hist_add(digit(key, level), 0);
    });
    blk.hist_end();
    const BinPick pick = blk.leader([&] { return pick_kth_bin(blk.hist_count(), k); });
    prefix |= pick.bin << (24 - 8 * level);
    k = pick.rest;
  }
  return key_float(prefix);
}

// p*: the smallest top-k survivor probability whose strictly-larger mass is < threshold.
template <class Blk, class T>
DFV_HD float select_top_p(Blk& blk, const T* row, int32_t vocab, float temperature, const Filter& f,
                          uint64_t threshold) {
  uint32_t prefix = 0;  // probabilities are >= +0, so their raw bits are order keys
  uint64_t above = 0;
  DFV_NO_UNROLL
  for (int level = 0; level < 4; ++level) {
    const uint32_t mask = high_mask(level);
    blk.hist_begin();
    blk.sweep(row, vocab, [&](int32_t, float x) {
      x = canonical_logit(x);
      if (!(x >= f.x_lo)) return;
      const float p = prob(div(x, temperature), f);
      const uint32_t key = float_bits(p);
      if ((key & mask) == prefix) blk.hist_add(digit(key, level), static_cast<uint64_t>(fixed62(p)));
    });
    blk.hist_end();
    const BinPick pick = blk.leader([&] {
      return pick_top_p_bin(blk.hist_count(), blk.hist_mass(), above, threshold);
    });
    prefix |= pick.bin << (24 - 8 * level);
    above = pick.above;
  }
  return bits_float(prefix);
}

template <class Blk, class T>
DFV_HD Filter row_filter(Blk& blk, const T* row, int32_t vocab, const RowParams& rp) {
  const float temperature = rp.temperature;
  Filter f{kNegInf, kInf, kInf, !(rp.top_p >= 1.0f), 1.0f, 0.0f};
  float local = kNegInf;
  blk.stream(row, vocab, [&](int32_t, float x) {
    x = canonical_logit(x);
    local = x > local ? x : local;
  });
  f.m = div(blk.reduce_max(local), temperature);
  if (!(f.m > kNegInf)) return f;  // no finite score: nothing survives
  float kth = -kFltMax;            // scores must be finite (> -inf) to survive
  if (rp.top_k > 0 && rp.top_k < vocab) {
    const float s = div(select_kth_logit(blk, row, vocab, static_cast<uint32_t>(rp.top_k)), temperature);
    kth = s > kth ? s : kth;
  }
  f.x_lo = lowest_logit_reaching(kth, temperature);
  const bool prefilter = f.m < kPrefilterLimit && f.m > -kPrefilterLimit;
  const float cut = prefilter ? sub(f.m, kGumbelReach) : kNegInf;
  f.x_cand = cut > kth ? lowest_logit_reaching(cut, temperature) : f.x_lo;
  if (!f.top_p_on) return f;
  const uint64_t threshold = top_p_threshold(rp.top_p);
  if (threshold == 0) {  // top_p <= 0 (or NaN): no token passes
    f.p_star = kInf;
    return f;
  }
  uint64_t local_sum = 0;
  blk.sweep(row, vocab, [&](int32_t, float x) {
    x = canonical_logit(x);
    if (x >= f.x_lo) local_sum += static_cast<uint64_t>(fixed40(exp_neg(sub(div(x, temperature), f.m))));
  });
  f.inv_sum = div(1.0f, from_fixed40(static_cast<int64_t>(blk.reduce_sum(local_sum))));
  f.p_star = select_top_p(blk, row, vocab, temperature, f, threshold);
  return f;
}

template <class Blk, class T>
DFV_HD int32_t greedy_token(Blk& blk, const T* row, int32_t vocab) {
  ArgMax best{kNegInf, kNoIndex};
  blk.stream(row, vocab, [&](int32_t v, float x) {
    const ArgMax c{canonical_logit(x), v};
    if (better(c, best)) best = c;
  });
  best = blk.reduce_argmax(best);
  return best.index == kNoIndex ? 0 : best.index;
}

// A candidate near the row max: its Gumbel-perturbed score, or nothing if it does not survive.
DFV_HD_OUTLINE ArgMax candidate(float x, int32_t v, Filter f, RowParams rp) {  // by value: no stack
  const float s = div(x, rp.temperature);
  if (!survives(x, s, f)) return ArgMax{kNegInf, kNoIndex};
  return ArgMax{add(s, gumbel(rp.seed, rp.position, v)), v};
}

template <class Blk, class T>
DFV_HD int32_t sampled_token(Blk& blk, const T* row, int32_t vocab, const RowParams& rp) {
  const Filter f = row_filter(blk, row, vocab, rp);
  if (!(f.m > kNegInf)) return 0;  // every logit NaN (or -inf at T < 1): token 0
  ArgMax best{kNegInf, kNoIndex};
  blk.stream(row, vocab, [&](int32_t v, float x) {
    x = canonical_logit(x);
    if (!(x >= f.x_cand)) return;
    const ArgMax c = candidate(x, v, f, rp);
    if (better(c, best)) best = c;
  });
  best = blk.reduce_argmax(best);
  return best.index == kNoIndex ? 0 : best.index;
}

// The sampling rule for one row: greedy argmax at T <= 0, else the Gumbel-max draw.
template <class Blk, class T>
DFV_HD int32_t choose_token(Blk& blk, const T* row, int32_t vocab, const RowParams& rp) {
  if (!(rp.temperature > 0.0f)) return greedy_token(blk, row, vocab);
  return sampled_token(blk, row, vocab, rp);
}

}  // namespace dfv
