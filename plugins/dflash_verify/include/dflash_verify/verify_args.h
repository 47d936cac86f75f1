// The verify call's arguments, shared by the CUDA launcher, the CPU twin, the torch op and the
// TensorRT plugin, plus the parts of verification that are not per-vocabulary work:
// per-row sampling params, the acceptance count and the next block.
//
// Semantics (dflash_trt/decoding/verify.py): the target ran the block [bonus, d_1 .. d_K] at
// positions start .. start+K; logits row i chooses the token t_i at absolute position
// start + i + 1 by the sampling rule. accepted a = number of leading i < K with d_{i+1} == t_i.
// next_block_ids = [t_a, mask_token_id x K]: the bonus token opens the next draft block.
#pragma once

#include <stdint.h>

#include "dflash_verify/sampling_rule.h"

namespace dfv {

enum DType : int32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// An integer tensor of int32 or int64 elements (TensorRT ids are int32, torch's int64).
struct IntIn {
  const void* data;
  int32_t bytes;  // 4 or 8
};

struct IntOut {
  void* data;
  int32_t bytes;  // 4 or 8
};

struct VerifyArgs {
  const void* logits;      // [B, K+1, V] fp32 / fp16 / bf16, contiguous
  int32_t logits_dtype;    // DType
  int32_t batch;           // B
  int32_t block_size;      // K+1 (slot 0 is the bonus token)
  int32_t vocab;           // V
  IntIn drafts;            // [B, K]
  IntIn start;             // [B]: absolute position of the bonus token
  const float* temperature;  // [B]: 0 (or less) = greedy
  IntIn top_k;             // [B]: 0 = off
  const float* top_p;      // [B]: >= 1 = off
  const int64_t* seed;     // [B]: uint64 bits
  int64_t mask_token_id;   // fills slots 1..K of next_block_ids
  IntOut tokens;           // [B, K+1]: t_i, the token at position start + i + 1
  IntOut accepted;         // [B]: a in [0, K]
  IntOut next_block_ids;   // [B, K+1]: [t_a, mask_token_id x K]; data may be null
};

// The host C ABI's arguments (the CPU twin and the CTA emulator): int64 ids everywhere except
// drafts, whose element size the caller passes.
inline VerifyArgs host_args(const void* logits, int32_t dtype, int32_t batch, int32_t block_size, int32_t vocab,
                            const void* drafts, int32_t drafts_bytes, const int64_t* start,
                            const float* temperature, const int64_t* top_k, const float* top_p,
                            const int64_t* seed, int64_t mask_token_id, int64_t* tokens, int64_t* accepted,
                            int64_t* next_block_ids) {
  VerifyArgs a{};
  a.logits = logits;
  a.logits_dtype = dtype;
  a.batch = batch;
  a.block_size = block_size;
  a.vocab = vocab;
  a.drafts = IntIn{drafts, drafts_bytes};
  a.start = IntIn{start, 8};
  a.temperature = temperature;
  a.top_k = IntIn{top_k, 8};
  a.top_p = top_p;
  a.seed = seed;
  a.mask_token_id = mask_token_id;
  a.tokens = IntOut{tokens, 8};
  a.accepted = IntOut{accepted, 8};
  a.next_block_ids = IntOut{next_block_ids, 8};
  return a;
}

// Vocabularies up to 2**23 keep every fixed-point softmax sum inside int64.
constexpr int32_t kMaxVocab = 1 << 23;

inline bool valid_int(IntIn r) { return r.data != nullptr && (r.bytes == 4 || r.bytes == 8); }
inline bool valid_int(IntOut r) { return r.data != nullptr && (r.bytes == 4 || r.bytes == 8); }

// nullptr if the arguments can be launched, else what is wrong (host-side, no device access).
inline const char* check_args(const VerifyArgs& a) {
  if (a.batch < 0) return "batch must be >= 0";
  if (a.block_size < 1) return "block_size (K+1) must be >= 1";
  if (a.vocab < 1 || a.vocab > kMaxVocab) return "vocab must be in [1, 2**23]";
  if (static_cast<int64_t>(a.batch) * a.block_size > 0x7fffffff) return "B * (K+1) must fit in int32";
  if (a.logits_dtype != kFloat32 && a.logits_dtype != kFloat16 && a.logits_dtype != kBFloat16)
    return "logits dtype must be float32, float16 or bfloat16";
  if (a.batch == 0) return nullptr;
  if (a.logits == nullptr || a.temperature == nullptr || a.top_p == nullptr || a.seed == nullptr)
    return "logits, temperature, top_p and seed must be non-null";
  if ((a.block_size > 1 && !valid_int(a.drafts)) || !valid_int(a.start) || !valid_int(a.top_k))
    return "drafts, start and top_k must be non-null int32/int64 tensors";
  if (!valid_int(a.tokens) || !valid_int(a.accepted)) return "tokens and accepted must be non-null int32/int64";
  if (a.next_block_ids.data != nullptr && !valid_int(a.next_block_ids)) return "next_block_ids must be int32/int64";
  return nullptr;
}

DFV_HD int64_t load(IntIn r, int64_t i) {
  return r.bytes == 8 ? static_cast<const int64_t*>(r.data)[i]
                      : static_cast<int64_t>(static_cast<const int32_t*>(r.data)[i]);
}

DFV_HD void store(IntOut r, int64_t i, int64_t value) {
  if (r.bytes == 8) {
    static_cast<int64_t*>(r.data)[i] = value;
  } else {
    static_cast<int32_t*>(r.data)[i] = static_cast<int32_t>(value);
  }
}

// One logits row's sampling inputs.
struct RowParams {
  float temperature;
  int64_t top_k;
  float top_p;
  uint64_t seed;
  int64_t position;  // absolute position of the token this row chooses
};

// Row `row` = b * (K+1) + i of the flattened [B*(K+1), V] logits.
DFV_HD RowParams row_params(const VerifyArgs& a, int64_t row) {
  const int64_t b = row / a.block_size;
  const int64_t i = row % a.block_size;
  RowParams p;
  p.temperature = a.temperature[b];
  p.top_k = load(a.top_k, b);
  p.top_p = a.top_p[b];
  p.seed = static_cast<uint64_t>(a.seed[b]);
  p.position = load(a.start, b) + 1 + i;
  return p;
}

// a: leading drafts equal to the target's tokens (tokens must be written already).
DFV_HD int32_t accept_length(const VerifyArgs& a, int64_t b) {
  const int32_t k = a.block_size - 1;
  const IntIn tokens{a.tokens.data, a.tokens.bytes};
  int32_t n = 0;
  while (n < k && load(a.drafts, b * k + n) == load(tokens, b * a.block_size + n)) ++n;
  return n;
}

// Element j of row b of the accept stage: accepted[b] (j == 0) and next_block_ids[b, j].
DFV_HD void accept_element(const VerifyArgs& a, int64_t b, int32_t j) {
  const int32_t n = accept_length(a, b);
  if (j == 0) store(a.accepted, b, n);
  if (a.next_block_ids.data == nullptr) return;
  const IntIn tokens{a.tokens.data, a.tokens.bytes};
  const int64_t id = j == 0 ? load(tokens, b * a.block_size + n) : a.mask_token_id;
  store(a.next_block_ids, b * a.block_size + j, id);
}

}  // namespace dfv
