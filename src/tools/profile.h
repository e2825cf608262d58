// `deepharness profile`: where a forward step's time goes. The op totals a TracingBackend
// collected over a workload (backend/tracing_backend.h) become two tables per phase (prefill,
// decode): per op class, per layer type (the model's trace labels: attention.mla, ffn.moe, ...)
// and per op and kernel (backend/kernel_note.h), each row with calls, total and mean time, share of the time in ops, and the achieved
// GB/s and GFLOP/s against the machine's measured read bandwidth and FMA peak, so the op
// furthest from its limit stands out.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/tracing_backend.h"

namespace dh::tools {

struct ProfileRow {
  std::string name;
  OpTotals totals;
  double share = 0;  // of the phase's time in ops
  double gbs = 0, gflops = 0;
  double bandwidth_fraction = -1, peak_fraction = -1;  // < 0: yardstick not measured
};

struct ProfilePhase {
  std::string name;                         // "prefill", "decode"
  double wall_seconds = 0;                  // the whole workload of the phase
  double op_seconds = 0;                    // inside backend ops
  // By total time, largest first. by_kernel: per op and the kernel the backend named for it
  // ("MatMul gemv AVX3_ZEN4"; the op alone where it named none).
  std::vector<ProfileRow> by_op, by_layer, by_kernel;
};

struct ProfileReport {
  std::string label;                          // the model and workload
  double bandwidth_gbs = 0, peak_gflops = 0;  // <= 0: not measured
  std::vector<ProfilePhase> phases;
};

// Groups `rows` by op, by label ("" becomes "other") and by op and kernel.
ProfilePhase SummarizeProfile(const std::string& name, double wall_seconds,
                              const std::vector<OpTotalsRow>& rows, double bandwidth_gbs,
                              double peak_gflops);

std::string FormatProfile(const ProfileReport& report);
nlohmann::json ProfileJson(const ProfileReport& report);

}  // namespace dh::tools
