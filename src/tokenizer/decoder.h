// Decoders of tokenizer.json ("decoder"): ByteLevel, Metaspace, ByteFallback, Fuse, Strip,
// Replace, BPEDecoder and Sequence. Each rewrites the list of token strings; the final text is
// their concatenation.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/status.h"

namespace dh::tok {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual Status Decode(std::vector<std::string>* tokens) const = 0;
};

Result<std::unique_ptr<Decoder>> ParseDecoder(const nlohmann::json& spec, const std::string& where);

}  // namespace dh::tok
