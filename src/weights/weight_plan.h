// WeightPlan: the load options that change weights, as typed values. The command line (apps/)
// parses --dtype / --quant / --quant-lm-head / --policy into one with ParseWeightPlan, so a bad
// value fails before anything is read; LoadOptions carries it down to every WeightLoader and the
// compile cache key, and nothing below sees the option strings.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"
#include "tensor/dtype.h"
#include "weights/precision_policy.h"

namespace dh {

// --dtype: "auto" is nullopt (weights as stored); float32|f32, bfloat16|bf16, float16|f16|half.
// Error: "--dtype 'X': expected auto, float32, bfloat16 or float16".
Result<std::optional<DType>> ParseDTypeOption(std::string_view text);

// MLA attention path: auto (decompressed for prefill, absorbed for decode), naive or absorbed
// everywhere. Both give the same numbers; tests compare them.
enum class MlaMode : uint8_t { kAuto, kNaive, kAbsorbed };

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

// The weight flags as typed on the command line, before parsing.
struct WeightFlags {
  std::string dtype = "auto";  // auto | float32 | bfloat16 | float16 (and short names)
  // none | int8 | int8-g32 | int8-row | int4 | int4-g32 | int4-g128 | fp8 | bf16 | f16 | f32
  std::string quant = "none";
  bool quant_lm_head = false;
  std::string policy;  // "" (none: `quant` applies), static:FMT, dynamic, custom:CLASS=FMT,...
};

// The one parser of the flags above (MLA mode stays kAuto). Errors name the flag and the value:
// "--dtype 'X': expected ...", "--quant ...", "--policy ...".
Result<WeightPlan> ParseWeightPlan(const WeightFlags& flags);

}  // namespace dh
