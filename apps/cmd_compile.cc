// `deepharness compile`: loads a checkpoint once with the given weight options (--dtype, --quant,
// --policy) and writes the compiled weight cache that `run`, `serve`, `generate`, `bench`, ...
// then load instead of the checkpoint (docs/compile-cache.md).
#include <cstdio>

#include "apps/command.h"
#include "apps/model_options.h"
#include "weights/compile_cache.h"

namespace dh::app {
namespace {

std::string Size(uint64_t bytes) {
  if (bytes >= (1ull << 30)) return fmt::format("{:.2f} GiB", bytes / double(1ull << 30));
  return fmt::format("{:.1f} MiB", bytes / double(1ull << 20));
}

std::function<int()> SetupCompile(CLI::App* sub) {
  struct Args {
    ModelOptions model;
    std::string output;
    bool force = false;
  };
  auto a = std::make_shared<Args>();
  AddModelOptions(sub, &a->model);
  sub->add_option("--output,-o", a->output,
                  "Directory to write the cache file to (default: --compile-cache, else "
                  "$XDG_CACHE_HOME/deepharness or ~/.cache/deepharness); give the same directory "
                  "to run/serve with --compile-cache");
  sub->add_flag("--force", a->force, "Rebuild even when an up-to-date cache file exists");
  return [a]() -> int {
    ModelOptions m = a->model;
    if (m.no_compile_cache) {
      return ReportError(InvalidArgument("--no-compile-cache: compile writes a cache"));
    }
    if (!a->output.empty()) m.compile_cache_dir = a->output;
    if (m.compile_cache_dir.empty()) m.compile_cache_dir = DefaultCompileCacheDir();
    if (m.compile_cache_dir.empty()) {
      return ReportError(InvalidArgument(
          "--output: none given, and neither XDG_CACHE_HOME nor HOME names a directory"));
    }
    m.compile_cache_write = CompileCacheOptions::Write::kAlways;
    m.compile_cache_force = a->force;
    // Each checkpoint tensor is read once: map the files rather than copying them first (an
    // up-to-date cache is then also only mapped to check it).
    if (!m.no_mmap) m.mmap = true;
    // The file holds int4 weights in the backend's tiles where they serve every product (a load
    // then makes none); nothing runs on this load, so each copy goes back once written.
    m.compile_only = true;
    auto loaded = LoadFromOptions(m);
    if (!loaded.ok()) return ReportError(loaded.status());
    const CompileCacheResult& r = loaded->compile_cache;
    using O = CompileCacheResult::Outcome;
    switch (r.outcome) {
      case O::kHit:
        std::printf("up to date: %s (%s); --force rebuilds it\n", r.path.c_str(),
                    Size(r.file_bytes).c_str());
        return kExitOk;
      case O::kWritten:
        std::printf("compiled %s -> %s (%s) in %.1f s (%.1f s of it syncing the file)\n",
                    m.model_path.c_str(), r.path.c_str(), Size(r.file_bytes).c_str(),
                    loaded->load_seconds, r.write_seconds);
        return kExitOk;
      case O::kWriteFailed:
        return ReportError(IoError("{}: {}", r.path, r.reason));
      default:
        return ReportError(Internal("compile cache outcome '{}' for {}",
                                    CompileCacheOutcomeName(r.outcome), r.path));
    }
  };
}

DH_REGISTER_COMMAND(compile_cmd, "compile",
                    "Compile a checkpoint into a weight cache file that later starts load "
                    "directly (docs/compile-cache.md)",
                    SetupCompile);

}  // namespace
}  // namespace dh::app
