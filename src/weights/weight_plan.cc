// WeightPlan (weight_plan.h): the one place the weight-changing option strings are parsed.
#include "weights/weight_plan.h"

#include <fmt/format.h>

namespace dh {

Result<std::optional<DType>> ParseDTypeOption(std::string_view text) {
  if (text == "auto") return std::optional<DType>();
  if (text == "float32" || text == "f32") return std::optional<DType>(DType::kF32);
  if (text == "bfloat16" || text == "bf16") return std::optional<DType>(DType::kBF16);
  if (text == "float16" || text == "f16" || text == "half") {
    return std::optional<DType>(DType::kF16);
  }
  return InvalidArgument("--dtype '{}': expected auto, float32, bfloat16 or float16", text);
}

std::string_view MlaModeName(MlaMode mode) {
  switch (mode) {
    case MlaMode::kAuto: return "auto";
    case MlaMode::kNaive: return "naive";
    case MlaMode::kAbsorbed: return "absorbed";
  }
  return "?";
}

Result<MlaMode> ParseMlaMode(std::string_view text) {
  for (MlaMode m : {MlaMode::kAuto, MlaMode::kNaive, MlaMode::kAbsorbed}) {
    if (text == MlaModeName(m)) return m;
  }
  return InvalidArgument("MLA mode '{}': expected auto, naive or absorbed", text);
}

std::string WeightPlan::Canonical() const {
  const std::string d = dtype ? PrecisionFormat::Dense(*dtype).Name() : std::string("auto");
  return fmt::format("dtype={};{}", d, policy.Canonical());
}

Result<WeightPlan> ParseWeightPlan(const WeightFlags& flags) {
  WeightPlan plan;
  DH_ASSIGN_OR_RETURN(plan.dtype, ParseDTypeOption(flags.dtype));
  DH_ASSIGN_OR_RETURN(plan.policy, PolicyFromFlags(flags.quant, flags.quant_lm_head, flags.policy));
  return plan;
}

}  // namespace dh
