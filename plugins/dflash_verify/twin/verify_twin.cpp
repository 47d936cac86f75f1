// The CPU twin of the verify kernels: the same row_select.h / verify_args.h code run by one host
// thread, behind a tiny C ABI that dflash_trt/kernels/twin.py loads with ctypes.
//
// Build (what twin.py does): g++ -std=c++17 -O2 -shared -fPIC -ffp-contract=off
//   -Iplugins/dflash_verify/include plugins/dflash_verify/twin/verify_twin.cpp -o libdflash_verify_twin.so
// -ffp-contract=off keeps every a*b+c two roundings, like __fmul_rn/__fadd_rn on the GPU.
#include <stdint.h>
#include <string.h>

#include <cstdio>

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

template <class T>
int32_t choose(const void* logits, int64_t row, int32_t vocab, const dfv::RowParams& rp) {
  HostBlock blk;
  const T* base = static_cast<const T*>(logits) + row * static_cast<int64_t>(vocab);
  return dfv::choose_token(blk, base, vocab, rp);
}

int32_t choose_any(int32_t dtype, const void* logits, int64_t row, int32_t vocab, const dfv::RowParams& rp) {
  if (dtype == dfv::kFloat16) return choose<Half>(logits, row, vocab, rp);
  if (dtype == dfv::kBFloat16) return choose<BFloat16>(logits, row, vocab, rp);
  return choose<float>(logits, row, vocab, rp);
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

// Twin of spec.sampling.sample_tokens: one token per row of logits [N, V].
void dfv_twin_sample_rows(const void* logits, int32_t dtype, int64_t n, int32_t vocab, const int64_t* positions,
                          const float* temperature, const int64_t* top_k, const float* top_p,
                          const int64_t* seed, int64_t* out) {
  for (int64_t row = 0; row < n; ++row) {
    const dfv::RowParams rp{temperature[row], top_k[row], top_p[row], static_cast<uint64_t>(seed[row]),
                            positions[row]};
    out[row] = choose_any(dtype, logits, row, vocab, rp);
  }
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

uint32_t dfv_twin_abi_version(void) { return 1; }

}  // extern "C"
