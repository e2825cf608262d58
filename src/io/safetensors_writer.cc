// safetensors writer: builds the header with nlohmann::json, then streams the tensor bytes.
#include "io/safetensors_writer.h"

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

namespace dh {

Status WriteSafetensors(const std::string& path,
                        const std::vector<std::pair<std::string, Tensor>>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__" || !names.insert(name).second) {
      return InvalidArgument("{}: tensor name '{}' is reserved or used twice", path, name);
    }
    if (!t.contiguous()) {
      return InvalidArgument("{}: tensor '{}' is not contiguous", path, name);
    }
    if (t.data == nullptr && t.numel() != 0) {
      return InvalidArgument("{}: tensor '{}' has no data", path, name);
    }
    std::vector<int64_t> shape(t.shape.begin(), t.shape.begin() + t.ndim);
    header[name] = {{"dtype", SafetensorsDTypeName(t.dtype)},
                    {"shape", shape},
                    {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');

  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!f) return IoError("{}: cannot open for writing", path);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(uint64_t{text.size()} >> (8 * i));
  bool ok = std::fwrite(len, 1, 8, f.get()) == 8 &&
            std::fwrite(text.data(), 1, text.size(), f.get()) == text.size();
  for (const auto& [name, t] : tensors) {
    const size_t n = t.nbytes();
    if (ok && n > 0) ok = std::fwrite(t.data, 1, n, f.get()) == n;
  }
  if (!ok || std::fclose(f.release()) != 0) return IoError("{}: write failed", path);
  return Status::Ok();
}

}  // namespace dh
