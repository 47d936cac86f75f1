// Public C++ entry point of the DFlash verification kernels (src/verify_kernels.cu).
//
//   dfv::VerifyArgs args{...};                       // see verify_args.h for shapes and dtypes
//   cudaError_t err = dfv::launch_verify(args, stream);
//
// Inputs: logits [B, K+1, V] (fp32 / fp16 / bf16, contiguous, on the device), drafts [B, K],
// start [B], temperature [B], top_k [B], top_p [B], seed [B]. Outputs: tokens [B, K+1],
// accepted [B], next_block_ids [B, K+1] = [t_a, mask_token_id x K]. Two kernel launches on
// `stream`, no host synchronization, no workspace; safe to capture in a CUDA graph.
#pragma once

#include <cuda_runtime.h>

#include "dflash_verify/verify_args.h"

namespace dfv {

// cudaErrorInvalidValue when check_args() rejects the arguments (describe_args_error says why).
cudaError_t launch_verify(const VerifyArgs& args, cudaStream_t stream);

// nullptr if the arguments are launchable, else a message.
const char* describe_args_error(const VerifyArgs& args);

}  // namespace dfv
