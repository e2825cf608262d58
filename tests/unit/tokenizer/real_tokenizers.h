// Loads the real tokenizers under ../shared/data/tokenizers once per test binary (loading a
// 128K-vocab tokenizer.json takes a moment); nullptr when the shared data is absent.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "tokenizer/tokenizer.h"

namespace dh::testing_util {

inline std::filesystem::path SharedDir() {
  return std::filesystem::path(DH_SOURCE_DIR) / ".." / "shared";
}

inline const Tokenizer* RealTokenizer(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  std::lock_guard lock(mu);
  auto it = cache.find(name);
  if (it == cache.end()) {
    const auto dir = SharedDir() / "data" / "tokenizers" / name;
    std::unique_ptr<Tokenizer> loaded;
    if (std::filesystem::exists(dir / "tokenizer.json")) {
      auto t = Tokenizer::Load(dir.string());
      if (!t.ok()) {
        ADD_FAILURE() << "loading " << dir << ": " << t.status().message();
      } else {
        loaded = std::move(t).value();
      }
    }
    it = cache.emplace(name, std::move(loaded)).first;
  }
  return it->second.get();
}

}  // namespace dh::testing_util
