// `deepharness diff-dumps A B [--rtol R] [--atol A]`: the first tap where two tensor dumps
// differ (tools/dump_diff.h). Exit 0 when every tap of A matches B, 1 when one differs, 2 on
// bad input.
#include <cstdio>

#include "apps/command.h"
#include "apps/model_options.h"
#include "tools/dump_diff.h"

namespace dh::app {
namespace {

std::function<int()> SetupDiffDumps(CLI::App* sub) {
  struct Args {
    std::string a, b;
    DumpDiffOptions options;
  };
  auto a = std::make_shared<Args>();
  sub->add_option("A", a->a, "First dump directory (written by --dump-tensors)")->required();
  sub->add_option("B", a->b, "Second dump directory")->required();
  sub->add_option("--rtol", a->options.rtol,
                  "Relative tolerance, as numpy.allclose (default 1e-5)");
  sub->add_option("--atol", a->options.atol,
                  "Absolute tolerance, as numpy.allclose (default 1e-8)");
  return [a]() -> int {
    auto diff = DiffDumps(a->a, a->b, a->options);
    if (!diff.ok()) return ReportError(diff.status());
    std::fputs(FormatDumpDiff(*diff, a->options).c_str(), stdout);
    return diff->same() ? kExitOk : kExitFailure;
  };
}

DH_REGISTER_COMMAND(kDiffDumps, "diff-dumps",
                    "Compare two tensor dumps tap by tap and name the first that differs",
                    SetupDiffDumps);

}  // namespace
}  // namespace dh::app
