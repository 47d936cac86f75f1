// The CPU twin of the verify kernels: the same row_select.h / verify_args.h code run by one host
// thread, behind a tiny C ABI that dflash_trt/kernels/twin.py loads with ctypes.
//
// Build (what twin.py does): g++ -std=c++17 -O2 -shared -fPIC -ffp-contract=off
//   -Iplugins/dflash_verify/include plugins/dflash_verify/twin/verify_twin.cpp -o libdflash_verify_twin.so
// -ffp-contract=off keeps every a*b+c two roundings, like __fmul_rn/__fadd_rn on the GPU.
#include <stdint.h>
#include <string.h>

#include <cstdio>
#include <vector>

#include "dflash_verify/row_select.h"
#include "dflash_verify/sampling_rule.h"
#include "dflash_verify/verify_args.h"

namespace {

// fp16 / bf16 elements as raw bits on the host.
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

inline float to_float(float x) { return x; }

inline float to_float(BFloat16 x) { return dfv::bits_float(static_cast<uint32_t>(x.bits) << 16); }

// Exact IEEE binary16 -> binary32 (subnormals, inf and NaN included).
inline float to_float(Half x) {
  const uint32_t sign = static_cast<uint32_t>(x.bits & 0x8000u) << 16;
  uint32_t exp = (x.bits >> 10) & 0x1fu;
  uint32_t man = x.bits & 0x3ffu;
  if (exp == 0x1fu) return dfv::bits_float(sign | 0x7f800000u | (man << 13));
  if (exp == 0) {
    if (man == 0) return dfv::bits_float(sign);
    exp = 113;  // renormalize: value = man * 2**-24
    while ((man & 0x400u) == 0) {
      man <<= 1;
      --exp;
    }
    return dfv::bits_float(sign | (exp << 23) | ((man & 0x3ffu) << 13));
  }
  return dfv::bits_float(sign | ((exp + 112) << 23) | (man << 13));
}

// One host thread playing a whole thread block: every reduction is the identity.
struct HostBlock {
  uint32_t count[256];
  uint64_t mass[256];

  template <class T, class F>
  void stream(const T* row, int32_t vocab, F&& f) {
    for (int32_t v = 0; v < vocab; ++v) f(v, to_float(row[v]));
  }
  template <class T, class F>
  void sweep(const T* row, int32_t vocab, F&& f) {
    stream(row, vocab, f);
  }
  float reduce_max(float x) { return x; }
  uint64_t reduce_sum(uint64_t x) { return x; }
  dfv::ArgMax reduce_argmax(dfv::ArgMax a) { return a; }
  void hist_begin() {
    memset(count, 0, sizeof count);
    memset(mass, 0, sizeof mass);
  }
  void hist_add(uint32_t bin, uint64_t m) {
    count[bin] += 1;
    mass[bin] += m;
  }
  void hist_end() {}
  const uint32_t* hist_count() const { return count; }
  const uint64_t* hist_mass() const { return mass; }
  template <class F>
  auto leader(F&& f) -> decltype(f()) {
    return f();
  }
};

// ---------------------------------------------------------------------------------------------
// Sampled rows in batches: the same rule as dfv::sampled_token, its Gumbel noise computed over all of a
// row's candidates in one loop the compiler vectorizes (the per-element path is a ~60 ns dependent chain
// of 4 hashes, 2 logs and 3 divisions). Bit-identical: the same IEEE-rounded ops in the same order for
// every element (vector lanes round like scalars; -ffp-contract=off), the per-row part of the hash done
// once, frexp of the positive normal floats the logs see done on the bits, candidates visited in column
// order with dfv::better. tests/test_verify_plugin.py checks it against the torch reference and dfv::gumbel.
// ---------------------------------------------------------------------------------------------

// dfv::log_f32 for positive normal x (every input of the two logs in g: u in [2**-24, 1 - 2**-24] and
// -log u), frexp done on the bits so the loop below vectorizes.
inline float log_normal(float x) {
  const uint32_t bits = dfv::float_bits(x);
  return dfv::log_from_frexp(dfv::bits_float((bits & 0x807fffffu) | 0x3f000000u),
                             static_cast<int>((bits >> 23) & 0xffu) - 126);
}

// g(seed, position, ids[i]) for n ids, `prefix` = dfv::hash_prefix(seed, position); vectorized (O3 for
// this loop only), cloned for AVX2 where the CPU has it.
__attribute__((target_clones("avx2", "default"), optimize("O3"))) void gumbel_many(uint32_t prefix,
                                                                                   const uint32_t* ids,
                                                                                   int32_t n, float* out) {
  for (int32_t i = 0; i < n; ++i) out[i] = -log_normal(-log_normal(dfv::uniform(dfv::hash_finish(prefix, ids[i]))));
}

// dfv::sampled_token with the noise of column c at token id ids[c] (ids == nullptr: c itself; ascending
// ids keep the lowest-id tie-break).
template <class T>
int32_t sampled_batched(const T* row, int32_t vocab, const dfv::RowParams& rp, const int64_t* ids) {
  HostBlock blk;
  const dfv::Filter f = dfv::row_filter(blk, row, vocab, rp);
  if (!(f.m > dfv::kNegInf)) return 0;
  // per thread, grown to the largest vocabulary seen: the candidates' ids (low 32 bits: all the hash
  // reads), columns, scores and noise
  static thread_local std::vector<uint32_t> cand_id;
  static thread_local std::vector<int32_t> cand_col;
  static thread_local std::vector<float> cand_s, cand_g;
  if (cand_id.size() < static_cast<size_t>(vocab)) {
    cand_id.resize(vocab);
    cand_col.resize(vocab);
    cand_s.resize(vocab);
    cand_g.resize(vocab);
  }
  int32_t n = 0;
  for (int32_t v = 0; v < vocab; ++v) {
    const float x = dfv::canonical_logit(to_float(row[v]));
    if (!(x >= f.x_cand)) continue;
    const float s = dfv::div(x, rp.temperature);
    if (!dfv::survives(x, s, f)) continue;
    cand_col[n] = v;
    cand_id[n] = static_cast<uint32_t>(static_cast<uint64_t>(ids == nullptr ? v : ids[v]));
    cand_s[n] = s;
    ++n;
  }
  gumbel_many(dfv::hash_prefix(rp.seed, rp.position), cand_id.data(), n, cand_g.data());
  dfv::ArgMax best{dfv::kNegInf, dfv::kNoIndex};
  for (int32_t i = 0; i < n; ++i) {
    const dfv::ArgMax c{dfv::add(cand_s[i], cand_g[i]), cand_col[i]};
    if (dfv::better(c, best)) best = c;
  }
  return best.index == dfv::kNoIndex ? 0 : best.index;
}

// `streaming`: the per-element rule (dfv::choose_token, what every CUDA thread block runs), for tests.
template <class T>
int32_t choose(const void* logits, int64_t row, int32_t vocab, const dfv::RowParams& rp,
               const int64_t* ids = nullptr, bool streaming = false) {
  const T* base = static_cast<const T*>(logits) + row * static_cast<int64_t>(vocab);
  if (rp.temperature > 0.0f && !streaming) return sampled_batched(base, vocab, rp, ids);
  HostBlock blk;
  return dfv::choose_token(blk, base, vocab, rp);
}

int32_t choose_any(int32_t dtype, const void* logits, int64_t row, int32_t vocab, const dfv::RowParams& rp,
                   const int64_t* ids = nullptr, bool streaming = false) {
  if (dtype == dfv::kFloat16) return choose<Half>(logits, row, vocab, rp, ids, streaming);
  if (dtype == dfv::kBFloat16) return choose<BFloat16>(logits, row, vocab, rp, ids, streaming);
  return choose<float>(logits, row, vocab, rp, ids, streaming);
}

void write_error(char* err, int32_t len, const char* msg) {
  if (err != nullptr && len > 0) snprintf(err, static_cast<size_t>(len), "%s", msg);
}

}  // namespace

extern "C" {

// Twin of the whole plugin: tokens [B, K+1], accepted [B], next_block_ids [B, K+1] (int64).
// Returns 0, or 1 with a message in err.
int32_t dfv_twin_verify(const void* logits, int32_t dtype, int32_t batch, int32_t block_size, int32_t vocab,
                        const void* drafts, int32_t drafts_bytes, const int64_t* start,
                        const float* temperature, const int64_t* top_k, const float* top_p,
                        const int64_t* seed, int64_t mask_token_id, int64_t* tokens, int64_t* accepted,
                        int64_t* next_block_ids, char* err, int32_t err_len) {
  const dfv::VerifyArgs a = dfv::host_args(logits, dtype, batch, block_size, vocab, drafts, drafts_bytes, start,
                                           temperature, top_k, top_p, seed, mask_token_id, tokens, accepted,
                                           next_block_ids);
  if (const char* problem = dfv::check_args(a)) {
    write_error(err, err_len, problem);
    return 1;
  }
  const int64_t rows = static_cast<int64_t>(batch) * block_size;
  for (int64_t row = 0; row < rows; ++row) {
    tokens[row] = choose_any(dtype, logits, row, vocab, dfv::row_params(a, row));
  }
  for (int64_t b = 0; b < batch; ++b) {
    for (int32_t j = 0; j < block_size; ++j) dfv::accept_element(a, b, j);
  }
  return 0;
}

// Twin of spec.sampling.sample_tokens: one token per row of logits [N, V]; `ids` (or nullptr) the token id
// of each column, ascending (a draft vocabulary: sampling.sample_tokens' vocab_ids in by_id order).
void dfv_twin_sample_rows(const void* logits, int32_t dtype, int64_t n, int32_t vocab, const int64_t* positions,
                          const float* temperature, const int64_t* top_k, const float* top_p,
                          const int64_t* seed, const int64_t* ids, int64_t* out) {
  for (int64_t row = 0; row < n; ++row) {
    const dfv::RowParams rp{temperature[row], top_k[row], top_p[row], static_cast<uint64_t>(seed[row]),
                            positions[row]};
    out[row] = choose_any(dtype, logits, row, vocab, rp, ids);
  }
}

// The same through the streaming rule (dfv::choose_token per element, as the CUDA kernels run it).
void dfv_twin_sample_rows_streaming(const void* logits, int32_t dtype, int64_t n, int32_t vocab,
                                    const int64_t* positions, const float* temperature, const int64_t* top_k,
                                    const float* top_p, const int64_t* seed, int64_t* out) {
  for (int64_t row = 0; row < n; ++row) {
    const dfv::RowParams rp{temperature[row], top_k[row], top_p[row], static_cast<uint64_t>(seed[row]),
                            positions[row]};
    out[row] = choose_any(dtype, logits, row, vocab, rp, nullptr, true);
  }
}

// The batched path's log (positive normal inputs): compared with dfv_twin_log_f32 in tests.
void dfv_twin_log_normal(const float* x, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = log_normal(x[i]);
}

// g over token ids by the batched path (gumbel_many): compared with dfv_twin_gumbel in tests.
void dfv_twin_gumbel_batched(uint64_t seed, int64_t position, const int64_t* ids, int32_t n, float* out) {
  std::vector<uint32_t> low(n > 0 ? n : 0);
  for (int32_t i = 0; i < n; ++i) low[i] = static_cast<uint32_t>(static_cast<uint64_t>(ids[i]));
  gumbel_many(dfv::hash_prefix(seed, position), low.data(), n, out);
}

// Twin of spec.sampling.survivors on logits / T (fp32 logits [N, V], T > 0): keep mask [N, V].
void dfv_twin_keep_mask(const float* logits, int64_t n, int32_t vocab, const float* temperature,
                        const int64_t* top_k, const float* top_p, uint8_t* keep) {
  for (int64_t row = 0; row < n; ++row) {
    const dfv::RowParams rp{temperature[row], top_k[row], top_p[row], 0, 0};
    const float* x = logits + row * static_cast<int64_t>(vocab);
    HostBlock blk;
    const dfv::Filter f = dfv::row_filter(blk, x, vocab, rp);
    for (int32_t v = 0; v < vocab; ++v) {
      const float xv = dfv::canonical_logit(x[v]);
      keep[row * vocab + v] = f.m > dfv::kNegInf && dfv::survives(xv, dfv::div(xv, rp.temperature), f);
    }
  }
}

// Elementwise twins of the scalar pieces, for bit-level tests against torch.
void dfv_twin_gumbel(const int64_t* seed, const int64_t* position, const int64_t* vocab, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = dfv::gumbel(static_cast<uint64_t>(seed[i]), position[i], vocab[i]);
}

void dfv_twin_log_f32(const float* x, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = dfv::log_f32(x[i]);
}

void dfv_twin_exp_neg(const float* x, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = dfv::exp_neg(x[i]);
}

uint32_t dfv_twin_abi_version(void) { return 2; }

}  // extern "C"
