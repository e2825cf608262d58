// The compile cache key and file name: what a cache file must have been compiled from to be used
// (compile_cache.h lists the inputs).
#include "weights/compile_cache_key.h"

#include <elf.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <link.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include <xxhash.h>

#include "base/file_io.h"
#include "base/mapped_file.h"
#include "io/safetensors.h"
#include "weights/compile_cache.h"
#include "weights/compile_cache_format.h"

namespace dh {
namespace {

namespace fs = std::filesystem;
using compile_cache::HashHex;
using compile_cache::Hex;

// The ELF build id of the running executable (a hash of its contents the linker records), or a
// hash of /proc/self/exe when there is none.
int BuildIdCallback(struct dl_phdr_info* info, size_t, void* data) {
  auto* out = static_cast<std::string*>(data);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_NOTE) continue;
    const auto* p = reinterpret_cast<const uint8_t*>(info->dlpi_addr + ph.p_vaddr);
    size_t left = ph.p_memsz;
    while (left >= sizeof(ElfW(Nhdr))) {
      ElfW(Nhdr) nh;
      std::memcpy(&nh, p, sizeof(nh));
      const size_t name_sz = (nh.n_namesz + 3u) & ~size_t{3};
      const size_t desc_sz = (nh.n_descsz + 3u) & ~size_t{3};
      const size_t total = sizeof(nh) + name_sz + desc_sz;
      if (total > left) break;
      if (nh.n_type == NT_GNU_BUILD_ID && nh.n_namesz == 4 &&
          std::memcmp(p + sizeof(nh), "GNU", 4) == 0) {
        *out = Hex(p + sizeof(nh) + name_sz, nh.n_descsz);
        return 1;
      }
      p += total;
      left -= total;
    }
  }
  return 1;  // the first object is the executable; stop there
}

const std::string& BuildId() {
  static const std::string id = [] {
    std::string s;
    dl_iterate_phdr(BuildIdCallback, &s);
    if (!s.empty()) return "elf:" + s;
    auto exe = ReadTextFile("/proc/self/exe", 1ull << 32);
    return exe.ok() ? "exe:" + HashHex(*exe) : std::string("unknown");
  }();
  return id;
}

// The options that change the weights a load produces, as the parsed plan's canonical text (so
// `--quant int8` and `--policy custom:default=int8,lm_head=auto` share one file). A new
// LoadOptions field that changes weights must enter WeightPlan::Canonical or be added here (the
// file name takes it through CompileCachePath too).
std::string WeightOptionLines(const LoadOptions& o) {
  return fmt::format("weights={}\n", o.plan.Canonical());
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// "size=N mtime_ns=T header_xxh3=H" for one safetensors file: its header bytes, never its data.
Result<std::string> SafetensorsKeyLine(const std::string& path) {
  UniqueFd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!f.valid()) return IoError("{}: open failed: {}", path, ErrnoText(errno));
  struct stat st;
  if (::fstat(f.get(), &st) != 0) return IoError("{}: stat failed: {}", path, ErrnoText(errno));
  if (!S_ISREG(st.st_mode)) return InvalidArgument("{}: not a regular file", path);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  const int64_t mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  std::string header_hash = "unreadable";
  uint64_t n = 0;
  if (size >= 8 && PreadAll(f.get(), &n, 8, 0, path).ok() && n <= kMaxSafetensorsHeaderBytes &&
      n <= size - 8) {
    std::string header(static_cast<size_t>(n), '\0');
    if (PreadAll(f.get(), header.data(), n, 8, path).ok()) header_hash = HashHex(header);
  }
  return fmt::format("size={} mtime_ns={} header_xxh3={}", size, mtime_ns, header_hash);
}

}  // namespace

Result<std::string> CompileCacheKey(const std::string& model_dir, const LoadOptions& options,
                                    const std::string& backend_name,
                                    const std::string& kernel_tag) {
  std::string k = "deepharness compile cache\n";
  k += fmt::format("format={}\n", kCompileCacheVersion);
  k += fmt::format("build={}\n", BuildId());
  k += fmt::format("backend={}\n", backend_name);
  k += fmt::format("kernels={}\n", kernel_tag);
  k += WeightOptionLines(options);
  DH_ASSIGN_OR_RETURN(std::string config, ReadTextFile(model_dir + "/config.json"));
  k += fmt::format("config.json size={} xxh3={}\n", config.size(), HashHex(config));
  std::error_code ec;
  std::vector<std::string> names;
  for (fs::directory_iterator it(model_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (EndsWith(name, ".safetensors") || EndsWith(name, ".safetensors.index.json")) {
      names.push_back(name);
    }
  }
  if (ec) return IoError("{}: cannot list the directory: {}", model_dir, ec.message());
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    const std::string path = model_dir + "/" + name;
    if (EndsWith(name, ".json")) {
      DH_ASSIGN_OR_RETURN(std::string index, ReadTextFile(path));
      k += fmt::format("{} size={} xxh3={}\n", name, index.size(), HashHex(index));
    } else {
      DH_ASSIGN_OR_RETURN(std::string line, SafetensorsKeyLine(path));
      k += fmt::format("{} {}\n", name, line);
    }
  }
  return k;
}

// The first line where two keys differ, for the log line saying why a file is stale.
std::string KeyDifference(std::string_view file_key, std::string_view expected) {
  auto lines = [](std::string_view s) {
    std::vector<std::string_view> out;
    size_t i = 0;
    while (i < s.size()) {
      size_t e = s.find('\n', i);
      if (e == std::string_view::npos) e = s.size();
      out.push_back(s.substr(i, e - i));
      i = e + 1;
    }
    return out;
  };
  auto shorten = [](std::string_view s) {
    return s.size() > 160 ? std::string(s.substr(0, 160)) + "..." : std::string(s);
  };
  const auto a = lines(file_key), b = lines(expected);
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    const std::string_view x = i < a.size() ? a[i] : "(none)", y = i < b.size() ? b[i] : "(none)";
    if (x != y) {
      return fmt::format("it was compiled from '{}', now '{}'", shorten(x), shorten(y));
    }
  }
  return "keys differ";
}

std::string DefaultCompileCacheDir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && x[0] == '/') {
    return std::string(x) + "/deepharness";
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && home[0] == '/') {
    return std::string(home) + "/.cache/deepharness";
  }
  return "";
}

std::string CompileCachePath(const std::string& cache_dir, const std::string& model_dir,
                             const LoadOptions& options, const std::string& backend_name) {
  std::error_code ec;
  fs::path real = fs::weakly_canonical(fs::absolute(model_dir, ec), ec);
  if (ec) real = fs::path(model_dir);
  std::string base = real.filename().string();
  if (base.empty()) base = real.parent_path().filename().string();
  std::string clean;
  for (char c : base) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_' || c == '.';
    if (clean.size() < 64) clean += ok ? c : '_';
  }
  if (clean.empty() || clean[0] == '.') clean = "model" + clean;
  const std::string id =
      fmt::format("{}\n{}\n{}", real.string(), backend_name, WeightOptionLines(options));
  return fmt::format("{}/{}-{:016x}{}", cache_dir, clean, XXH3_64bits(id.data(), id.size()),
                     kCompileCacheExtension);
}

}  // namespace dh
