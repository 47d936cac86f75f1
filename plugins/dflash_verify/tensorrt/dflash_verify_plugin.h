// TensorRT wrapper of the DFlash verify kernels: an IPluginV3 ("DFlashVerify", version "1") and
// its IPluginCreatorV3One.
//
// Inputs                                        Outputs
//   0 logits       [B, K+1, V] fp32/fp16/bf16     0 tokens          [B, K+1] (ids type)
//   1 drafts       [B, K]      int32/int64 (ids)  1 accepted        [B]      int32
//   2 start        [B]         int32/int64        2 next_block_ids  [B, K+1] (ids type)
//   3 temperature  [B]         fp32
//   4 top_k        [B]         int32/int64
//   5 top_p        [B]         fp32
//   6 seed         [B]         int64 (uint64 bits)
// Field: mask_token_id (int32 or int64), which fills slots 1..K of next_block_ids.
// All tensors linear (row-major). Semantics: docs/verify-plugin.md (same bits as the torch op).
//
// The library exports getCreators() / setLoggerFinder() for IPluginRegistry::loadLibrary and
// `trtexec --dynamicPlugins`; it needs only TensorRT's headers, not libnvinfer.
#pragma once

#include <NvInferRuntime.h>

#include <cstdint>
#include <string>

namespace dfv_trt {

constexpr char kPluginName[] = "DFlashVerify";
constexpr char kPluginVersion[] = "1";
constexpr int32_t kNbInputs = 7;
constexpr int32_t kNbOutputs = 3;

class DFlashVerifyPlugin : public nvinfer1::IPluginV3,
                           public nvinfer1::IPluginV3OneCore,
                           public nvinfer1::IPluginV3OneBuild,
                           public nvinfer1::IPluginV3OneRuntime {
 public:
  DFlashVerifyPlugin(int64_t mask_token_id, std::string plugin_namespace);
  ~DFlashVerifyPlugin() override = default;

  // IPluginV3
  nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override;
  nvinfer1::IPluginV3* clone() noexcept override;

  // IPluginV3OneCore
  const char* getPluginName() const noexcept override { return kPluginName; }
  const char* getPluginVersion() const noexcept override { return kPluginVersion; }
  const char* getPluginNamespace() const noexcept override { return namespace_.c_str(); }

  // IPluginV3OneBuild
  int32_t configurePlugin(const nvinfer1::DynamicPluginTensorDesc* in, int32_t nb_inputs,
                          const nvinfer1::DynamicPluginTensorDesc* out, int32_t nb_outputs) noexcept override;
  int32_t getOutputDataTypes(nvinfer1::DataType* output_types, int32_t nb_outputs,
                             const nvinfer1::DataType* input_types, int32_t nb_inputs) const noexcept override;
  int32_t getOutputShapes(const nvinfer1::DimsExprs* inputs, int32_t nb_inputs,
                          const nvinfer1::DimsExprs* shape_inputs, int32_t nb_shape_inputs,
                          nvinfer1::DimsExprs* outputs, int32_t nb_outputs,
                          nvinfer1::IExprBuilder& expr_builder) noexcept override;
  bool supportsFormatCombination(int32_t pos, const nvinfer1::DynamicPluginTensorDesc* in_out, int32_t nb_inputs,
                                 int32_t nb_outputs) noexcept override;
  int32_t getNbOutputs() const noexcept override { return kNbOutputs; }
  size_t getWorkspaceSize(const nvinfer1::DynamicPluginTensorDesc* inputs, int32_t nb_inputs,
                          const nvinfer1::DynamicPluginTensorDesc* outputs,
                          int32_t nb_outputs) const noexcept override;

  // IPluginV3OneRuntime
  int32_t onShapeChange(const nvinfer1::PluginTensorDesc* in, int32_t nb_inputs, const nvinfer1::PluginTensorDesc* out,
                        int32_t nb_outputs) noexcept override;
  int32_t enqueue(const nvinfer1::PluginTensorDesc* input_desc, const nvinfer1::PluginTensorDesc* output_desc,
                  const void* const* inputs, void* const* outputs, void* workspace,
                  cudaStream_t stream) noexcept override;
  nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* context) noexcept override;
  const nvinfer1::PluginFieldCollection* getFieldsToSerialize() noexcept override;

 private:
  int64_t mask_token_id_;
  std::string namespace_;
  nvinfer1::PluginField fields_[1];
  nvinfer1::PluginFieldCollection field_collection_{};
};

class DFlashVerifyPluginCreator : public nvinfer1::IPluginCreatorV3One {
 public:
  DFlashVerifyPluginCreator();
  ~DFlashVerifyPluginCreator() override = default;

  const char* getPluginName() const noexcept override { return kPluginName; }
  const char* getPluginVersion() const noexcept override { return kPluginVersion; }
  const char* getPluginNamespace() const noexcept override { return namespace_.c_str(); }
  const nvinfer1::PluginFieldCollection* getFieldNames() noexcept override { return &field_collection_; }
  nvinfer1::IPluginV3* createPlugin(const char* name, const nvinfer1::PluginFieldCollection* fc,
                                    nvinfer1::TensorRTPhase phase) noexcept override;

 private:
  std::string namespace_;
  nvinfer1::PluginField fields_[1];
  nvinfer1::PluginFieldCollection field_collection_{};
};

}  // namespace dfv_trt
