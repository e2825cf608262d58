// WeightPlan: the load options that change weights, parsed once into typed values. LoadModel
// builds it at the start of a load (so a bad --dtype / --quant / --policy fails before any file
// is read) and hands it to every WeightLoader; nothing below re-reads the option strings.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"
#include "tensor/dtype.h"
#include "weights/load_options.h"
#include "weights/precision_policy.h"

namespace dh {

// --dtype: "auto" is nullopt (weights as stored); float32|f32, bfloat16|bf16, float16|f16|half.
// Error: "--dtype 'X': expected auto, float32, bfloat16 or float16".
Result<std::optional<DType>> ParseDTypeOption(std::string_view text);

std::string_view MlaModeName(MlaMode mode);  // auto | naive | absorbed
// Error names the accepted values.
Result<MlaMode> ParseMlaMode(std::string_view text);

struct WeightPlan {
  std::optional<DType> dtype;  // --dtype; nullopt: as stored
  PrecisionPolicy policy;      // --policy, or --quant (+ --quant-lm-head)
  MlaMode mla_mode = MlaMode::kAuto;

  // Equal for two plans exactly when they load every weight in the same format:
  // "dtype=<auto|f32|bf16|f16>;<policy canonical>".
  std::string Canonical() const;
};

Result<WeightPlan> MakeWeightPlan(const LoadOptions& options);

}  // namespace dh
