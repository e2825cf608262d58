// SHA-256 (FIPS 180-4), incremental: for checkpoint manifests (`deepharness verify`).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dh {

class Sha256 {
 public:
  Sha256();
  void Update(const void* data, size_t n);
  // The digest; the object must not be updated afterwards.
  std::array<uint8_t, 32> Finish();
  std::string HexDigest();  // Finish() as 64 lower-case hex digits

  static std::string Hex(std::string_view data);

 private:
  void Block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

}  // namespace dh
