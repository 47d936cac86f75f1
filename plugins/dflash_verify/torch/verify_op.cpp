// torch custom op over the DFlash verify kernels: torch.ops.dflash_verify.verify_block.
//
//   tokens, accepted, next_block_ids = torch.ops.dflash_verify.verify_block(
//       logits,       # [B, K+1, V] fp32 / fp16 / bf16, CUDA, contiguous
//       drafts,       # [B, K] int64 / int32
//       start,        # [B] int64: absolute position of the bonus token (block slot 0)
//       temperature,  # [B] fp32
//       top_k,        # [B] int64 / int32
//       top_p,        # [B] fp32
//       seed,         # [B] int64 (uint64 bits)
//       mask_token_id=0)
//   -> tokens [B, K+1] int64, accepted [B] int64, next_block_ids [B, K+1] int64
//
// Same results, bit for bit, as dflash_trt.decoding.verify.verify_block (see docs/verify-plugin.md).
// Built by CMake (target dflash_verify_torch) or dflash_trt/kernels/build_op.py, loaded with
// torch.ops.load_library. Only CUDA (and Meta, for shape inference) implementations exist; CPU
// tensors go to the torch reference in dflash_trt.kernels.verify.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <tuple>

#include "dflash_verify/verify.h"

namespace {

using Outputs = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

dfv::IntIn int_in(const at::Tensor& t) {
  return dfv::IntIn{t.numel() > 0 ? t.data_ptr() : nullptr, static_cast<int32_t>(t.element_size())};
}

dfv::IntOut int_out(at::Tensor& t) { return dfv::IntOut{t.data_ptr(), static_cast<int32_t>(t.element_size())}; }

bool is_index(const at::Tensor& t) { return t.scalar_type() == at::kLong || t.scalar_type() == at::kInt; }

// Asserts shapes, dtypes, devices and contiguity; returns (B, K+1, V).
std::tuple<int64_t, int64_t, int64_t> check_inputs(const at::Tensor& logits, const at::Tensor& drafts,
                                                   const at::Tensor& start, const at::Tensor& temperature,
                                                   const at::Tensor& top_k, const at::Tensor& top_p,
                                                   const at::Tensor& seed) {
  TORCH_CHECK(logits.dim() == 3, "logits must be [B, K+1, V], got ", logits.sizes());
  const auto dtype = logits.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16,
              "logits must be float32, float16 or bfloat16, got ", dtype);
  const int64_t b = logits.size(0), width = logits.size(1), vocab = logits.size(2);
  TORCH_CHECK(width >= 1 && vocab >= 1 && vocab <= dfv::kMaxVocab, "need K+1 >= 1 and 1 <= V <= 2**23, got ",
              logits.sizes());
  TORCH_CHECK(drafts.dim() == 2 && drafts.size(0) == b && drafts.size(1) == width - 1 && is_index(drafts),
              "drafts must be int32/int64 [B, K] = [", b, ", ", width - 1, "], got ", drafts.sizes(), " ",
              drafts.scalar_type());
  TORCH_CHECK(start.scalar_type() == at::kLong && seed.scalar_type() == at::kLong, "start and seed must be int64");
  TORCH_CHECK(temperature.scalar_type() == at::kFloat && top_p.scalar_type() == at::kFloat,
              "temperature and top_p must be float32");
  TORCH_CHECK(is_index(top_k), "top_k must be int32 or int64");
  for (const at::Tensor* t : {&start, &temperature, &top_k, &top_p, &seed}) {
    TORCH_CHECK(t->dim() == 1 && t->size(0) == b, "per-request tensors must be [B] = [", b, "], got ", t->sizes());
  }
  for (const at::Tensor* t : {&logits, &drafts, &start, &temperature, &top_k, &top_p, &seed}) {
    TORCH_CHECK(t->device() == logits.device(), "all tensors must be on ", logits.device(), ", got ", t->device());
    TORCH_CHECK(t->is_contiguous(), "all tensors must be contiguous");
  }
  return {b, width, vocab};
}

dfv::DType dtype_code(at::ScalarType t) {
  if (t == at::kHalf) return dfv::kFloat16;
  if (t == at::kBFloat16) return dfv::kBFloat16;
  return dfv::kFloat32;
}

Outputs verify_block_cuda(const at::Tensor& logits, const at::Tensor& drafts, const at::Tensor& start,
                          const at::Tensor& temperature, const at::Tensor& top_k, const at::Tensor& top_p,
                          const at::Tensor& seed, int64_t mask_token_id) {
  TORCH_CHECK(logits.is_cuda(), "dflash_verify::verify_block runs on CUDA tensors");
  const auto [b, width, vocab] = check_inputs(logits, drafts, start, temperature, top_k, top_p, seed);
  const c10::cuda::CUDAGuard guard(logits.device());
  const auto options = logits.options().dtype(at::kLong);
  at::Tensor tokens = at::empty({b, width}, options);
  at::Tensor accepted = at::empty({b}, options);
  at::Tensor next_block_ids = at::empty({b, width}, options);
  if (b == 0) return {tokens, accepted, next_block_ids};

  dfv::VerifyArgs args{};
  args.logits = logits.data_ptr();
  args.logits_dtype = dtype_code(logits.scalar_type());
  args.batch = static_cast<int32_t>(b);
  args.block_size = static_cast<int32_t>(width);
  args.vocab = static_cast<int32_t>(vocab);
  args.drafts = int_in(drafts);
  args.start = int_in(start);
  args.temperature = temperature.data_ptr<float>();
  args.top_k = int_in(top_k);
  args.top_p = top_p.data_ptr<float>();
  args.seed = seed.data_ptr<int64_t>();
  args.mask_token_id = mask_token_id;
  args.tokens = int_out(tokens);
  args.accepted = int_out(accepted);
  args.next_block_ids = int_out(next_block_ids);
  const char* problem = dfv::describe_args_error(args);
  TORCH_CHECK(problem == nullptr, "dflash_verify::verify_block: ", problem ? problem : "");
  const cudaError_t err = dfv::launch_verify(args, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "dflash_verify::verify_block launch failed: ", cudaGetErrorString(err));
  return {tokens, accepted, next_block_ids};
}

// Shapes only, for fake tensors (torch.compile, meta-device tracing).
Outputs verify_block_meta(const at::Tensor& logits, const at::Tensor& drafts, const at::Tensor& start,
                          const at::Tensor& temperature, const at::Tensor& top_k, const at::Tensor& top_p,
                          const at::Tensor& seed, int64_t) {
  const auto [b, width, vocab] = check_inputs(logits, drafts, start, temperature, top_k, top_p, seed);
  (void)vocab;
  const auto options = logits.options().dtype(at::kLong);
  return {at::empty({b, width}, options), at::empty({b}, options), at::empty({b, width}, options)};
}

}  // namespace

TORCH_LIBRARY(dflash_verify, m) {
  m.def(
      "verify_block(Tensor logits, Tensor drafts, Tensor start, Tensor temperature, Tensor top_k, "
      "Tensor top_p, Tensor seed, int mask_token_id=0) -> (Tensor tokens, Tensor accepted, Tensor next_block_ids)");
}

TORCH_LIBRARY_IMPL(dflash_verify, CUDA, m) { m.impl("verify_block", &verify_block_cuda); }

TORCH_LIBRARY_IMPL(dflash_verify, Meta, m) { m.impl("verify_block", &verify_block_meta); }
