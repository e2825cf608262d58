// Fuzz target: encoding arbitrary bytes with the embedded model's tokenizer
// (models/shakespeare-v3), then decoding the ids; valid UTF-8 must round-trip byte for byte
// (a byte-level BPE without normalizers loses nothing).
#include <cstdlib>

#include "base/utf8.h"
#include "fuzz/fuzz_target.h"
#include "tokenizer/tokenizer.h"

DH_FUZZ_TARGET(tokenizer_encode) {
  static const std::unique_ptr<dh::Tokenizer> tok = [] {
    auto t = dh::Tokenizer::Load(std::string(DH_SOURCE_DIR) + "/models/shakespeare-v3");
    if (!t.ok()) {
      std::fprintf(stderr, "fuzz tokenizer_encode: %s\n", t.status().message().c_str());
      std::abort();
    }
    return std::move(*t);
  }();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto ids = tok->Encode(text, /*add_special_tokens=*/false);
  if (!ids.ok()) return 0;
  auto back = tok->Decode(*ids, /*skip_special_tokens=*/false);
  if (!back.ok() || *back != text) {
    std::fprintf(stderr, "fuzz tokenizer_encode: decode(encode(x)) != x\n");
    std::abort();
  }
  return 0;
}
