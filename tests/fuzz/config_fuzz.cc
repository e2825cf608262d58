// Fuzz target: config.json -> ModelConfig (types, ranges, rope scaling, architecture fields).
#include "fuzz/fuzz_target.h"
#include "io/model_config.h"

DH_FUZZ_TARGET(config) {
  auto config = dh::ParseModelConfig(std::string(reinterpret_cast<const char*>(data), size),
                                     "fuzz/config.json");
  (void)config;
  return 0;
}
