// safetensors parsing with the reference library's rules (huggingface/safetensors tensor.rs):
// header length within limits and the file, a JSON object header without duplicate keys,
// string-only __metadata__, known dtypes, byte lengths equal to shape x dtype (checked maths),
// and tensors that tile the data region exactly — no holes, no overlap, no trailing bytes.
#include "io/safetensors.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>

#include "base/checked_math.h"
#include "base/log.h"
#include "base/memory_info.h"
#include "io/json_util.h"

namespace dh {
namespace {

using nlohmann::json;

struct Entry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// A JSON integer in [0, limit], or nullopt.
std::optional<uint64_t> NonNegativeInt(const json& v, uint64_t limit) {
  uint64_t u;
  if (v.is_number_unsigned()) {
    u = v.get<uint64_t>();
  } else if (v.is_number_integer()) {
    int64_t i = v.get<int64_t>();
    if (i < 0) return std::nullopt;
    u = static_cast<uint64_t>(i);
  } else {
    return std::nullopt;
  }
  if (u > limit) return std::nullopt;
  return u;
}

Result<Entry> ParseEntry(const std::string& path, const std::string& name, const json& v,
                         uint64_t data_size) {
  const std::string where = fmt::format("{}: tensor '{}'", path, name);
  if (!v.is_object()) {
    return InvalidArgument("{}: expected an object with dtype, shape and data_offsets, got {}",
                           where, JsonSnippet(v));
  }
  Entry e;
  e.name = name;

  auto dtype_it = v.find("dtype");
  if (dtype_it == v.end() || !dtype_it->is_string()) {
    return InvalidArgument("{}: field 'dtype': expected a dtype string, got {}", where,
                           dtype_it == v.end() ? "nothing" : JsonSnippet(*dtype_it));
  }
  const std::string& dtype_name = dtype_it->get_ref<const std::string&>();
  auto dtype = ParseSafetensorsDType(dtype_name);
  if (!dtype || SafetensorsDTypeName(*dtype) != dtype_name) {
    return InvalidArgument(
        "{}: field 'dtype': unknown dtype '{}' (expected one of F64 F32 F16 BF16 F8_E4M3 "
        "F8_E5M2 I64 I32 I16 I8 U8 BOOL)",
        where, dtype_name);
  }
  e.dtype = *dtype;

  auto shape_it = v.find("shape");
  if (shape_it == v.end() || !shape_it->is_array()) {
    return InvalidArgument("{}: field 'shape': expected a list of non-negative integers, got {}",
                           where, shape_it == v.end() ? "nothing" : JsonSnippet(*shape_it));
  }
  if (shape_it->size() > static_cast<size_t>(kMaxDims)) {
    return Unsupported("{}: field 'shape': {} dimensions, at most {} are supported", where,
                       shape_it->size(), kMaxDims);
  }
  for (const json& d : *shape_it) {
    auto dim = NonNegativeInt(d, static_cast<uint64_t>(INT64_MAX));
    if (!dim) {
      return InvalidArgument(
          "{}: field 'shape': expected a list of non-negative integers, got {} in {}", where,
          JsonSnippet(d), JsonSnippet(*shape_it));
    }
    e.shape.push_back(static_cast<int64_t>(*dim));
  }

  auto off_it = v.find("data_offsets");
  std::optional<uint64_t> begin, end;
  if (off_it != v.end() && off_it->is_array() && off_it->size() == 2) {
    begin = NonNegativeInt((*off_it)[0], UINT64_MAX);
    end = NonNegativeInt((*off_it)[1], UINT64_MAX);
  }
  if (!begin || !end) {
    return InvalidArgument(
        "{}: field 'data_offsets': expected [begin, end] with non-negative integers, got {}", where,
        off_it == v.end() ? "nothing" : JsonSnippet(*off_it));
  }
  if (*end < *begin) {
    return InvalidArgument("{}: field 'data_offsets': end {} is before begin {}", where, *end,
                           *begin);
  }
  if (*end > data_size) {
    return InvalidArgument(
        "{}: field 'data_offsets': [{}, {}] runs past the end of the {}-byte data region "
        "(truncated "
        "file?)",
        where, *begin, *end, data_size);
  }
  e.begin = *begin;
  e.end = *end;

  auto numel = CheckedProduct(e.shape);
  auto nbytes = numel ? CheckedMul(*numel, DTypeSize(e.dtype)) : std::nullopt;
  if (!nbytes) {
    return InvalidArgument("{}: shape {} overflows a 64-bit byte count", where,
                           FormatShape(e.shape));
  }
  if (*nbytes != e.end - e.begin) {
    return InvalidArgument(
        "{}: data_offsets [{}, {}] hold {} bytes but shape {} of {} needs {} bytes", where, e.begin,
        e.end, e.end - e.begin, FormatShape(e.shape), dtype_name, *nbytes);
  }
  return e;
}

bool IsRegularFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// A shard name from an index must be a plain file name inside the model directory: no
// separators, no "." / "..", no NUL (transformers#47176: "../x" and "/etc/passwd" escaped it).
bool IsPlainFileName(const std::string& name) {
  if (name.empty() || name == "." || name == "..") return false;
  return name.find_first_of(std::string_view("/\\\0", 3)) == std::string::npos;
}

}  // namespace

std::string FormatShape(std::span<const int64_t> dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", dims[i]);
  return s + "]";
}

std::string TensorInfo::ShapeString() const { return FormatShape(shape); }

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path,
                                                               const FileLoadOptions& options) {
  DH_ASSIGN_OR_RETURN(auto mapped, MappedFile::Open(path, options));
  return FromMapped(std::move(mapped));
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromMapped(
    std::shared_ptr<MappedFile> file) {
  const std::string& path = file->path();
  const uint64_t size = file->size();
  if (size < 8) {
    return InvalidArgument("{}: file is {} bytes, too short for the 8-byte header length", path,
                           size);
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | file->data()[i];
  if (header_len > kMaxSafetensorsHeaderBytes) {
    return InvalidArgument("{}: header length {} is more than the {} bytes allowed", path,
                           header_len, kMaxSafetensorsHeaderBytes);
  }
  if (header_len > size - 8) {
    return InvalidArgument(
        "{}: header length {} runs past the end of the file ({} bytes; truncated file?)", path,
        header_len, size);
  }
  std::string_view header(reinterpret_cast<const char*>(file->data()) + 8, header_len);
  if (header.empty() || header.front() != '{') {
    return InvalidArgument("{}: header: expected a JSON object starting with '{{'", path);
  }
  DH_ASSIGN_OR_RETURN(json root, ParseJsonStrict(header, path + ": header"));
  if (!root.is_object()) {
    return InvalidArgument("{}: header: expected a JSON object, got {}", path, JsonKind(root));
  }

  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = size - data_start;
  auto st = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  std::vector<Entry> entries;
  entries.reserve(root.size());
  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) {
        return InvalidArgument("{}: __metadata__: expected an object of strings, got {}", path,
                               JsonKind(value));
      }
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) {
          return InvalidArgument("{}: __metadata__ key '{}': expected a string, got {}", path, mk,
                                 JsonSnippet(mv));
        }
        st->metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    DH_ASSIGN_OR_RETURN(Entry e, ParseEntry(path, key, value, data_size));
    entries.push_back(std::move(e));
  }

  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    if (e.begin < covered) {
      return InvalidArgument(
          "{}: tensor '{}': data_offsets [{}, {}] overlap tensor '{}' (ends at {})", path, e.name,
          e.begin, e.end, entries[i - 1].name, covered);
    }
    if (e.begin > covered) {
      return InvalidArgument(
          "{}: tensor '{}': data_offsets begin at {}, leaving bytes [{}, {}) that no tensor uses "
          "(expected begin {})",
          path, e.name, e.begin, covered, e.begin, covered);
    }
    covered = e.end;
  }
  if (covered != data_size) {
    return InvalidArgument(
        "{}: tensors cover {} bytes of the {}-byte data region (expected the whole region, with no "
        "trailing bytes)",
        path, covered, data_size);
  }

  st->tensors_.reserve(entries.size());
  for (Entry& e : entries) {
    TensorInfo info;
    info.name = std::move(e.name);
    info.dtype = e.dtype;
    info.shape = std::move(e.shape);
    info.data = file->data() + data_start + e.begin;
    info.nbytes = e.end - e.begin;
    info.file = path;
    st->tensors_.push_back(std::move(info));
  }
  st->file_ = std::move(file);
  return st;
}

const TensorInfo* Checkpoint::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

Result<Checkpoint> Checkpoint::Open(const std::string& dir, const FileLoadOptions& options) {
  return Open(dir, options, nullptr);
}

Result<Checkpoint> Checkpoint::Open(const std::string& dir, const FileLoadOptions& options,
                                    const Progress& progress) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    return NotFound("{}: model directory does not exist", dir);
  }
  if (!S_ISDIR(st.st_mode)) {
    return InvalidArgument("{}: expected a model directory, got a file", dir);
  }

  const std::string index_path = dir + "/model.safetensors.index.json";
  std::vector<std::string> names;                               // shard file names, sorted
  std::vector<std::pair<std::string, std::string>> weight_map;  // tensor -> shard
  if (IsRegularFile(index_path)) {
    DH_ASSIGN_OR_RETURN(std::string text, ReadTextFile(index_path));
    DH_ASSIGN_OR_RETURN(json index, ParseJsonStrict(text, index_path));
    if (!index.is_object()) {
      return InvalidArgument("{}: expected a JSON object, got {}", index_path, JsonKind(index));
    }
    auto wm = index.find("weight_map");
    if (wm == index.end() || !wm->is_object()) {
      return InvalidArgument(
          "{}: field 'weight_map': expected an object of tensor -> shard, got {}", index_path,
          wm == index.end() ? "nothing" : JsonKind(*wm));
    }
    if (wm->empty()) {
      return InvalidArgument("{}: field 'weight_map': expected at least one tensor, got none",
                             index_path);
    }
    std::set<std::string> unique;
    for (const auto& [tensor, shard] : wm->items()) {
      if (!shard.is_string()) {
        return InvalidArgument("{}: weight_map['{}']: expected a shard file name, got {}",
                               index_path, tensor, JsonSnippet(shard));
      }
      const std::string& name = shard.get_ref<const std::string&>();
      if (!IsPlainFileName(name)) {
        return InvalidArgument(
            "{}: weight_map['{}']: shard '{}' escapes the model directory (expected a plain file "
            "name)",
            index_path, tensor, name);
      }
      if (unique.insert(name).second && !IsRegularFile(dir + "/" + name)) {
        return NotFound("{}: weight_map['{}']: shard '{}' does not exist in {}", index_path, tensor,
                        name, dir);
      }
      weight_map.emplace_back(tensor, name);
    }
    names.assign(unique.begin(), unique.end());
  } else if (IsRegularFile(dir + "/model.safetensors")) {
    names.push_back("model.safetensors");
  } else {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.size() > 12 && name.ends_with(".safetensors") &&
          IsRegularFile(entry.path().string())) {
        names.push_back(name);
      }
    }
    if (ec) return IoError("{}: cannot list the model directory: {}", dir, ec.message());
    std::sort(names.begin(), names.end());
  }
  if (names.empty()) {
    return NotFound(
        "{}: no model.safetensors, model.safetensors.index.json or *.safetensors file found", dir);
  }

  // Reading into memory (--no-mmap) a checkpoint larger than the memory left would end in the
  // OOM killer (e.g. a 31 GB bf16 DeepSeek-V2-Lite quantized at load on a 24 GiB machine): map it
  // instead, whose pages the kernel can drop and read again.
  FileLoadOptions file_options = options;
  if (!options.use_mmap) {
    uint64_t bytes = 0;
    for (const std::string& name : names) {
      struct stat shard;
      if (::stat((dir + "/" + name).c_str(), &shard) == 0) {
        bytes = CheckedAdd(bytes, static_cast<uint64_t>(shard.st_size)).value_or(UINT64_MAX);
      }
    }
    const MemoryInfo mem = ReadMemoryInfo();
    if (mem.available > 0 && bytes > mem.available) {
      DH_LOG(Warning, "{}: the checkpoint's {} exceed the {} of memory left ({}): mapping its "
             "files instead of reading them in (--no-mmap)", dir, FormatBytes(bytes),
             FormatBytes(mem.available), mem.source);
      file_options.use_mmap = true;
    }
  }
  Checkpoint ckpt;
  ckpt.dir_ = dir;
  ckpt.read_into_memory_ = !file_options.use_mmap;
  ckpt.mapped_to_fit_ = file_options.use_mmap && !options.use_mmap;
  std::map<std::string, const SafetensorsFile*> by_shard;
  for (size_t i = 0; i < names.size(); ++i) {
    DH_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                        SafetensorsFile::Open(dir + "/" + names[i], file_options));
    std::shared_ptr<SafetensorsFile> shared(std::move(file));
    for (const TensorInfo& t : shared->tensors()) {
      auto [it, inserted] = ckpt.by_name_.emplace(t.name, &t);
      if (!inserted) {
        return InvalidArgument("tensor '{}' is stored twice: in {} and in {}", t.name,
                               it->second->file, t.file);
      }
      ckpt.ordered_.push_back(&t);
      ckpt.total_bytes_ += t.nbytes;
    }
    by_shard[names[i]] = shared.get();
    ckpt.files_.push_back(std::move(shared));
    if (progress) progress(i + 1, names.size());
  }
  for (const auto& [tensor, shard] : weight_map) {
    const TensorInfo* t = ckpt.Find(tensor);
    if (t == nullptr || t->file != by_shard[shard]->path()) {
      return NotFound("{}: tensor '{}' is listed in shard '{}' but not found there", index_path,
                      tensor, shard);
    }
  }
  return ckpt;
}

}  // namespace dh
