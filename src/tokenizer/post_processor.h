// Post-processors of tokenizer.json ("post_processor"), applied when special tokens are added:
// TemplateProcessing (single sequence), BertProcessing/RobertaProcessing, ByteLevel (ids
// unchanged; it only adjusts offsets) and Sequence.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/status.h"

namespace dh::tok {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void Process(std::vector<int32_t>* ids) const = 0;
};

Result<std::unique_ptr<PostProcessor>> ParsePostProcessor(const nlohmann::json& spec,
                                                          const std::string& where);

}  // namespace dh::tok
