// WeightLoader's AWQ / GPTQ path: a projection stored as <base>.qweight (+ .qzeros, .scales,
// GPTQ .g_idx) is converted exactly to kInt4 (weights/packed_int4.h) and uploaded as is; --dtype,
// --quant and --policy do not re-quantize it. docs/quantized-checkpoints.md.
#include <functional>
#include <string_view>

#include "base/log.h"
#include "weights/packed_int4.h"
#include "weights/weight_loader.h"

namespace dh {
namespace {

constexpr std::string_view kWeightSuffix = ".weight";

Result<PackedInt4Tensors> FindPacked(const Checkpoint& ck, const std::string& base,
                                     const QuantizationConfig& q,
                                     const std::function<Result<const TensorInfo*>(
                                         const std::string&)>& find) {
  PackedInt4Tensors t;
  DH_ASSIGN_OR_RETURN(t.qweight, find(base + ".qweight"));
  DH_ASSIGN_OR_RETURN(t.qzeros, find(base + ".qzeros"));
  DH_ASSIGN_OR_RETURN(t.scales, find(base + ".scales"));
  // AWQ has no g_idx (one left in a checkpoint is reported as unused by Finish).
  if (q.method == "gptq" && ck.Find(base + ".g_idx") != nullptr) {
    DH_ASSIGN_OR_RETURN(t.g_idx, find(base + ".g_idx"));
  }
  return t;
}

}  // namespace

std::string WeightLoader::PackedInt4Base(const std::string& name) const {
  if (!name.ends_with(kWeightSuffix)) return "";
  std::string base = name.substr(0, name.size() - kWeightSuffix.size());
  return checkpoint_.Find(base + ".qweight") != nullptr ? base : "";
}

Result<Weight> WeightLoader::LoadPackedInt4(const std::string& base, int64_t rows, int64_t cols) {
  DH_ASSIGN_OR_RETURN(
      PackedInt4Tensors t,
      FindPacked(checkpoint_, base, config_.quantization,
                 [&](const std::string& n) -> Result<const TensorInfo*> { return Find(n); }));
  DH_ASSIGN_OR_RETURN(Int4Host host, ConvertPackedInt4(config_.quantization, t, rows, cols));
  // Any --quant / --policy that changes a format (the default policy keeps everything as stored).
  const bool requantize_asked = plan().policy.Canonical() != PrecisionPolicy().Canonical();
  if (requantize_asked && !logged_prequantized_) {
    logged_prequantized_ = true;
    DH_LOG(Info, "{}: {} int4 projections are used as stored; --quant / --policy apply to the "
           "other weights only", checkpoint_.dir(), config_.quantization.method);
  }
  if (host.inexact_scales > 0) {
    DH_LOG(Warning, "{}: {} bf16 scales lie below f16's normal range and were rounded to f16",
           t.scales->name, host.inexact_scales);
  }
  num_parameters_ += rows * cols;
  Weight w = host.View();
  DH_RETURN_IF_ERROR(CopyPartsToBackend(w, base + ".qweight"));
  prequantized_bytes_[t.qweight->name] = w.nbytes();
  for (const TensorInfo* companion : {t.qzeros, t.scales, t.g_idx}) {
    if (companion != nullptr) prequantized_bytes_[companion->name] = 0;
  }
  return PrepareNamed(base + ".weight", w);
}

Result<std::vector<float>> WeightLoader::HostPackedInt4F32(const std::string& base, int64_t rows,
                                                           int64_t cols, DType* stored_dtype) {
  DH_ASSIGN_OR_RETURN(
      PackedInt4Tensors t,
      FindPacked(checkpoint_, base, config_.quantization,
                 [&](const std::string& n) -> Result<const TensorInfo*> { return Find(n); }));
  DH_ASSIGN_OR_RETURN(Int4Host host, ConvertPackedInt4(config_.quantization, t, rows, cols));
  // The dequantized values (q - z) * s need up to 16 significant bits: f32 keeps rearranged
  // copies exact unless --dtype asks for a smaller type.
  *stored_dtype = plan().dtype == DType::kBF16 || plan().dtype == DType::kF16 ? *plan().dtype
                                                                             : DType::kF32;
  return host.Dequantize();
}

}  // namespace dh
