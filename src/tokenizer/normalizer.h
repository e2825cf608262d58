// Normalizers of tokenizer.json ("normalizer"): NFC/NFD/NFKC/NFKD (utf8proc), Lowercase,
// Replace, Prepend, Strip and Sequence. They rewrite whole strings; offsets are not tracked.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "base/status.h"

namespace dh::tok {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // `text` is valid UTF-8 and stays valid UTF-8.
  virtual Status Normalize(std::string* text) const = 0;
};

// Builds the normalizer described by `spec` (null -> nullptr). `where` names the JSON location
// for error messages, e.g. "normalizer".
Result<std::unique_ptr<Normalizer>> ParseNormalizer(const nlohmann::json& spec,
                                                    const std::string& where);

}  // namespace dh::tok
