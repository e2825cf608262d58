// Enforces docs/DESIGN.md "Layers and what each may use": every #include "..." under src/ must
// point at a layer the including layer may use, and third-party headers with a home layer
// (JSON, HTTP, Highway) stay in it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

// One generic rule for every backend folder backend/<x> (docs/backends.md): it may use itself,
// backend/reference (the oracle and the host fallback), backend, tensor and base. Nothing else
// names a concrete backend.
bool IsBackendFolder(const std::string& layer) {
  return layer.rfind("backend/", 0) == 0 && layer.find('/', 8) == std::string::npos &&
         layer.size() > 8;
}

// The layer of a path relative to src/: "backend/cpu/x.h" -> "backend/cpu", "comm/mpi/x.h" ->
// "comm/mpi", "model/arch/y" -> "model".
std::string LayerOf(const std::string& rel) {
  const size_t slash = rel.find('/');
  if (slash == std::string::npos) return rel;
  const std::string top = rel.substr(0, slash);
  if (top == "backend" || top == "comm") {
    const size_t next = rel.find('/', slash + 1);
    if (next != std::string::npos) return rel.substr(0, next);  // a concrete backend folder
  }
  return top;
}

const std::map<std::string, std::set<std::string>>& AllowedLayers() {
  static const std::map<std::string, std::set<std::string>> allowed = {
      {"base", {"base"}},
      {"tensor", {"tensor", "base"}},
      {"backend", {"backend", "tensor", "base"}},
      {"comm", {"comm", "tensor", "base"}},
      {"comm/mpi", {"comm/mpi", "comm", "tensor", "base"}},
      {"comm/nccl", {"comm/nccl", "comm", "tensor", "base"}},
      {"io", {"io", "tensor", "base"}},
      {"tokenizer", {"tokenizer", "io", "tensor", "base"}},
      {"chat", {"chat", "base"}},
      {"grammar", {"grammar", "tokenizer", "io", "tensor", "base"}},
      {"kvcache", {"kvcache", "base"}},
      {"weights", {"weights", "backend", "io", "tensor", "base"}},
      {"model", {"model", "weights", "comm", "backend", "io", "tensor", "base"}},
      {"engine", {"engine", "model", "weights", "comm", "kvcache", "tokenizer", "chat", "backend", "io", "tensor",
                  "base"}},
      {"server", {"server", "grammar", "engine", "model", "weights", "kvcache", "tokenizer", "chat", "backend", "io",
                  "tensor", "base"}},
      {"scan", {"scan", "base"}},
      {"tools", {"tools", "scan", "server", "grammar", "engine", "model", "weights", "kvcache", "tokenizer", "chat", "backend",
                 "io", "tensor", "base"}},
  };
  return allowed;
}

// Third-party headers that only some layers may include.
const std::map<std::string, std::set<std::string>>& RestrictedHeaders() {
  static const std::map<std::string, std::set<std::string>> restricted = {
      {"nlohmann/", {"io", "tokenizer", "chat", "grammar", "server", "scan", "tools"}},
      {"httplib.h", {"server", "tools"}},
      {"hwy/", {"backend/cpu"}},
      {"cuda", {"backend/cuda", "comm/nccl"}},
      {"cublas", {"backend/cuda"}},
      {"mpi.h", {"comm/mpi"}},
      {"nccl.h", {"comm/nccl"}},
  };
  return restricted;
}

struct Violation {
  std::string file, include;
};

std::vector<Violation> ScanTree(const fs::path& src) {
  std::vector<Violation> out;
  for (const auto& entry : fs::recursive_directory_iterator(src)) {
    if (!entry.is_regular_file()) continue;
    const std::string ext = entry.path().extension();
    if (ext != ".h" && ext != ".cc" && ext != ".cu" && ext != ".cuh") continue;
    const std::string rel = fs::relative(entry.path(), src).string();
    const std::string layer = LayerOf(rel);
    std::set<std::string> allowed;
    if (IsBackendFolder(layer)) {
      allowed = {layer, "backend/reference", "backend", "tensor", "base"};
    } else if (auto it = AllowedLayers().find(layer); it != AllowedLayers().end()) {
      allowed = it->second;
    }
    std::ifstream in(entry.path());
    std::string line;
    while (std::getline(in, line)) {
      const size_t p = line.find("#include");
      if (p == std::string::npos || line.find_first_not_of(" \t") != p) continue;
      const size_t q = line.find_first_of("\"<", p);
      if (q == std::string::npos) continue;
      const size_t e = line.find_first_of("\">", q + 1);
      const std::string inc = line.substr(q + 1, e - q - 1);
      const bool ours =
          AllowedLayers().count(LayerOf(inc)) > 0 || IsBackendFolder(LayerOf(inc));
      if (line[q] == '"' && ours) {
        if (!allowed.count(LayerOf(inc))) {
          out.push_back({rel, inc});
        }
      } else {
        for (const auto& [prefix, layers] : RestrictedHeaders()) {
          if (inc.rfind(prefix, 0) == 0 && !layers.count(layer)) out.push_back({rel, inc});
        }
      }
    }
  }
  return out;
}

TEST(IncludeMap, SourceTreeFollowsTheLayerMap) {
  const fs::path src = fs::path(DH_SOURCE_DIR) / "src";
  ASSERT_TRUE(fs::exists(src));
  for (const auto& v : ScanTree(src)) {
    ADD_FAILURE() << "src/" << v.file << " includes \"" << v.include
                  << "\", which its layer may not use (docs/DESIGN.md)";
  }
}

TEST(IncludeMap, DetectsAViolation) {
  // The scanner itself must catch a model file including a concrete backend.
  const fs::path tmp = fs::temp_directory_path() / "dh_include_map_test" / "src" / "model";
  fs::create_directories(tmp);
  std::ofstream(tmp / "bad.cc") << "#include \"backend/cpu/cpu_backend.h\"\n#include <httplib.h>\n";
  auto violations = ScanTree(tmp.parent_path());
  fs::remove_all(tmp.parent_path().parent_path());
  ASSERT_EQ(violations.size(), 2u);
  EXPECT_EQ(violations[0].include, "backend/cpu/cpu_backend.h");
}

TEST(IncludeMap, AnyBackendFolderFollowsTheGenericRule) {
  // A backend folder nobody listed (backend/npu) may use backend/reference but not another
  // backend, and no layer outside it may name it.
  const fs::path root = fs::temp_directory_path() / "dh_include_map_generic" / "src";
  fs::create_directories(root / "backend" / "npu");
  fs::create_directories(root / "model");
  std::ofstream(root / "backend" / "npu" / "ok.cc")
      << "#include \"backend/npu/npu.h\"\n#include \"backend/reference/host_fallback.h\"\n"
         "#include \"backend/backend.h\"\n";
  std::ofstream(root / "backend" / "npu" / "bad.cc") << "#include \"backend/cpu/gemm.h\"\n";
  std::ofstream(root / "model" / "bad.cc") << "#include \"backend/npu/npu.h\"\n";
  auto violations = ScanTree(root);
  fs::remove_all(root.parent_path());
  ASSERT_EQ(violations.size(), 2u);
  std::set<std::string> files;
  for (const auto& v : violations) files.insert(v.file);
  EXPECT_TRUE(files.count("backend/npu/bad.cc"));
  EXPECT_TRUE(files.count("model/bad.cc"));
}

}  // namespace
