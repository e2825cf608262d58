// `deepharness verify --model-path DIR [--manifest FILE] [--json]`: checks a checkpoint before it
// is served (docs/migration.md). Exit codes: 0 clean, 1 problems found, 2 could not run.
#include <cstdio>

#include "apps/command.h"
#include "apps/model_options.h"
#include "backend/registry.h"
#include "base/log.h"
#include "tools/verify.h"

namespace dh::app {
namespace {

std::function<int()> SetupVerify(CLI::App* sub) {
  struct Args {
    VerifyOptions o;
    bool json = false;
    bool no_load = false;
    bool quiet = false;
    std::string device = "reference";
  };
  auto a = std::make_shared<Args>();
  sub->add_option("--model-path", a->o.model_path, "Checkpoint directory")->required();
  sub->add_option("--manifest", a->o.manifest,
                  "sha256sum-format file of the checkpoint's files (paths relative to the "
                  "directory); every listed file is hashed and compared");
  sub->add_flag("--json", a->json, "Print the report as JSON");
  sub->add_option("--threads", a->o.threads, "Threads for statistics and hashing (0: all CPUs)")
      ->capture_default_str();
  sub->add_option("--max-abs", a->o.max_abs, "Flag weights with |x| above this")
      ->capture_default_str();
  sub->add_flag("--no-load", a->no_load,
                "Skip the expected-tensor check (the architecture's factory run over the "
                "headers: no weight is read or loaded)");
  sub->add_option("--device", a->device,
                  "Backend for the small tables a model builds when constructed (rope; "
                  "registered: " + RegisteredBackendList() + ")")
      ->capture_default_str();
  sub->add_flag("--quiet,-q", a->quiet, "No progress bar or log lines");
  return [a]() -> int {
    if (a->o.threads < 0) return ReportError(InvalidArgument("--threads: expected >= 0"));
    if (!(a->o.max_abs > 0)) return ReportError(InvalidArgument("--max-abs: expected > 0"));
    a->o.load_model = !a->no_load;
    a->o.progress = !a->quiet && !a->json;
    if (a->quiet || a->json) SetLogLevel(LogLevel::kError);
    std::unique_ptr<Backend> backend;
    if (a->o.load_model) {
      BackendOptions bo;
      bo.num_threads = a->o.threads;
      auto b = CreateBackend(a->device, bo);
      if (!b.ok()) return ReportError(b.status());
      backend = std::move(*b);
    }
    auto report = VerifyCheckpoint(a->o, backend.get());
    if (!report.ok()) return ReportError(report.status());
    const std::string text = a->json ? FormatVerifyJson(*report) : FormatVerifyText(*report);
    std::fwrite(text.data(), 1, text.size(), stdout);
    return report->clean() ? kExitOk : kExitFailure;
  };
}

DH_REGISTER_COMMAND(verify_cmd, "verify", "Check a checkpoint before serving it (exit 0/1/2)",
                    SetupVerify);

}  // namespace
}  // namespace dh::app
