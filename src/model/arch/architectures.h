// Factories of the built-in architectures, one per arch/*.cc file, listed in architectures.cc.
#pragma once

#include "model/model.h"
#include "weights/weight_loader.h"

namespace dh {

Result<std::unique_ptr<Model>> MakeLlama(const ModelConfig& c, WeightLoader& w, Backend& b);
Result<std::unique_ptr<Model>> MakeQwen2(const ModelConfig& c, WeightLoader& w, Backend& b);
Result<std::unique_ptr<Model>> MakeDeepseekV2V3(const ModelConfig& c, WeightLoader& w, Backend& b);
Result<std::unique_ptr<Model>> MakeDeepseekMoe(const ModelConfig& c, WeightLoader& w, Backend& b);

}  // namespace dh
