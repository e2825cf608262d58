// TracingBackend (tracing_backend.h).
#include "backend/tracing_backend.h"

#include <fmt/format.h>

#include <algorithm>

#include "backend/kernel_note.h"
#include "base/trace.h"

namespace dh {
namespace {

double Bytes(const Tensor& t) { return t.empty() ? 0.0 : static_cast<double>(t.nbytes()); }
double Numel(const Tensor& t) { return t.empty() ? 0.0 : static_cast<double>(t.numel()); }

std::string Shapes(std::initializer_list<std::pair<const char*, const Tensor*>> tensors) {
  std::string out;
  for (const auto& [name, t] : tensors) {
    if (!out.empty()) out += ", ";
    out += JsonArg(name, t->empty() ? std::string("-") : t->ShapeString());
  }
  return out;
}

std::string WeightArgs(const Weight& w) {
  return fmt::format("{}, {}", JsonArg("format", WeightFormatName(w.format)),
                     JsonArg("weight", fmt::format("[{}, {}]", w.rows, w.cols)));
}

}  // namespace

template <typename Call, typename Detail>
void TracingBackend::Timed(const char* op, double bytes, double flops, Call&& call,
                           Detail&& detail) {
  TakeKernelNote();  // a note left by an op that ran outside this decorator
  const auto start = Clock::now();
  call();
  inner().Synchronize();
  const auto end = Clock::now();
  const double seconds = std::chrono::duration<double>(end - start).count();
  const KernelNote note = TakeKernelNote();
  std::string kernel;
  if (note.name != nullptr) {
    kernel = note.name;
    if (note.variant != nullptr) (kernel += ' ') += note.variant();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    OpTotals& t = totals_[{CurrentTraceLabel(), op, kernel}];
    t.Add({1, seconds, bytes, flops});
  }
  if (Tracer* tracer = ActiveTracer()) {
    std::string args = detail();
    if (!kernel.empty()) args += ", " + JsonArg("kernel", kernel);
    tracer->Complete(
        op, "op", start, end,
        fmt::format("{}, {}, {}", args, JsonArg("bytes", bytes), JsonArg("flops", flops)));
  }
}

std::vector<OpTotalsRow> TracingBackend::Totals() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<OpTotalsRow> rows;
  for (const auto& [key, t] : totals_) {
    rows.push_back({std::get<0>(key), std::get<1>(key), std::get<2>(key), t});
  }
  return rows;
}

void TracingBackend::ResetTotals() {
  std::lock_guard<std::mutex> lock(mu_);
  totals_.clear();
}

void TracingBackend::Embedding(const Weight& table, const Tensor& ids, Tensor out) {
  Timed(
      "Embedding", 2 * Bytes(out) + Bytes(ids), 0, [&] { inner().Embedding(table, ids, out); },
      [&] {
        return Shapes({{"ids", &ids}, {"out", &out}}) + ", " + WeightArgs(table);
      });
}

void TracingBackend::RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor out) {
  Timed(
      "RmsNorm", Bytes(x) + Bytes(weight) + Bytes(out), 4 * Numel(x),
      [&] { inner().RmsNorm(x, weight, eps, out); },
      [&] {
        return Shapes({{"x", &x}, {"out", &out}});
      });
}

void TracingBackend::AddRmsNorm(Tensor residual, const Tensor& x, const Tensor& weight, float eps,
                                Tensor out) {
  Timed(
      "AddRmsNorm", 2 * Bytes(residual) + Bytes(x) + Bytes(weight) + Bytes(out), 5 * Numel(x),
      [&] { inner().AddRmsNorm(residual, x, weight, eps, out); },
      [&] {
        return Shapes({{"x", &x}, {"out", &out}});
      });
}

void TracingBackend::MatMul(const Tensor& x, const Weight& w, const Tensor& bias, Tensor out) {
  const double m = static_cast<double>(x.dim(0));
  Timed(
      "MatMul", Bytes(x) + static_cast<double>(w.nbytes()) + Bytes(bias) + Bytes(out),
      2 * m * static_cast<double>(w.rows) * static_cast<double>(w.cols),
      [&] { inner().MatMul(x, w, bias, out); },
      [&] {
        return Shapes({{"x", &x}, {"out", &out}}) + ", " + WeightArgs(w);
      });
}

// One op in the profile, as the products run together: "MatMul" with every weight's bytes and
// flops, the weights' shapes in the trace.
void TracingBackend::MatMuls(const Tensor& x, std::span<const MatMulTarget> targets) {
  const double m = static_cast<double>(x.dim(0));
  double bytes = Bytes(x), flops = 0;
  for (const MatMulTarget& t : targets) {
    bytes += static_cast<double>(t.w->nbytes()) + Bytes(t.bias) + Bytes(t.out);
    flops += 2 * m * static_cast<double>(t.w->rows) * static_cast<double>(t.w->cols);
  }
  Timed(
      "MatMul", bytes, flops, [&] { inner().MatMuls(x, targets); },
      [&] {
        std::string weights;
        for (const MatMulTarget& t : targets) {
          if (!weights.empty()) weights += ' ';
          weights += fmt::format("[{}, {}]", t.w->rows, t.w->cols);
        }
        return Shapes({{"x", &x}}) + ", " +
               (targets.empty() ? JsonArg("weights", 0.0)
                                : JsonArg("format", WeightFormatName(targets[0].w->format)) +
                                      ", " + JsonArg("weights", weights));
      });
}

void TracingBackend::BatchedMatMul(const Tensor& x, std::span<const Weight> w, Tensor out) {
  double weight_bytes = 0, flops = 0;
  for (const Weight& wh : w) {
    weight_bytes += static_cast<double>(wh.nbytes());
    flops += 2 * static_cast<double>(x.dim(0)) * static_cast<double>(wh.rows * wh.cols);
  }
  Timed(
      "BatchedMatMul", Bytes(x) + weight_bytes + Bytes(out), flops,
      [&] { inner().BatchedMatMul(x, w, out); },
      [&] {
        return Shapes({{"x", &x}, {"out", &out}}) + ", " +
               (w.empty() ? JsonArg("heads", 0.0) : WeightArgs(w[0]));
      });
}

void TracingBackend::Rope(Tensor x, const Tensor& positions, const RopeParams& p) {
  Timed(
      "Rope", 2 * Bytes(x) + Bytes(positions), 3 * Numel(x), [&] { inner().Rope(x, positions, p); },
      [&] {
        return Shapes({{"x", &x}});
      });
}

void TracingBackend::KvWrite(const Tensor& k, const Tensor& v, KvCacheView k_cache,
                             KvCacheView v_cache, const Tensor& slot_mapping) {
  Timed(
      "KvWrite", 2 * (Bytes(k) + Bytes(v)), 0,
      [&] { inner().KvWrite(k, v, k_cache, v_cache, slot_mapping); },
      [&] {
        return Shapes({{"k", &k}, {"v", &v}});
      });
}

void TracingBackend::Attention(const Tensor& q, const KvCacheView& k_cache,
                               const KvCacheView& v_cache, const AttentionMeta& meta, float scale,
                               Tensor out) {
  // Scores and the weighted sum: every query row against its sequence's cached rows.
  double pairs = 0, rows_read = 0;
  if (meta.host_query_start.size() == static_cast<size_t>(meta.num_seqs) + 1 &&
      meta.host_seq_lens.size() == static_cast<size_t>(meta.num_seqs)) {
    for (int s = 0; s < meta.num_seqs; ++s) {
      const double q_rows = meta.host_query_start[s + 1] - meta.host_query_start[s];
      pairs += q_rows * meta.host_seq_lens[s];
      rows_read += meta.host_seq_lens[s];
    }
  }
  const double heads = static_cast<double>(q.dim(1));
  const double dk = static_cast<double>(q.dim(2)), dv = static_cast<double>(out.dim(2));
  const double row_bytes = static_cast<double>(k_cache.dim(1)) * (dk + dv) *
                           static_cast<double>(DTypeSize(k_cache.data.dtype));
  Timed(
      "Attention", Bytes(q) + Bytes(out) + rows_read * row_bytes, 2 * pairs * heads * (dk + dv),
      [&] { inner().Attention(q, k_cache, v_cache, meta, scale, out); },
      [&] {
        return Shapes({{"q", &q}, {"out", &out}}) + ", " +
               JsonArg("max_seq_len", static_cast<double>(meta.max_seq_len));
      });
}

void TracingBackend::KvGather(const KvCacheView& cache, const Tensor& slots, Tensor out) {
  Timed(
      "KvGather", 2 * Bytes(out), 0, [&] { inner().KvGather(cache, slots, out); },
      [&] { return Shapes({{"out", &out}}); });
}

void TracingBackend::SiluMul(const Tensor& gate, const Tensor& up, Tensor out) {
  Timed(
      "SiluMul", Bytes(gate) + Bytes(up) + Bytes(out), 4 * Numel(out),
      [&] { inner().SiluMul(gate, up, out); },
      [&] {
        return Shapes({{"out", &out}});
      });
}

void TracingBackend::Add(const Tensor& a, const Tensor& b, Tensor out) {
  Timed(
      "Add", Bytes(a) + Bytes(b) + Bytes(out), Numel(out), [&] { inner().Add(a, b, out); },
      [&] {
        return Shapes({{"out", &out}});
      });
}

void TracingBackend::Copy(const Tensor& src, Tensor dst) {
  Timed(
      "Copy", 2 * Bytes(dst), 0, [&] { inner().Copy(src, dst); },
      [&] {
        return Shapes({{"src", &src}, {"dst", &dst}});
      });
}

void TracingBackend::GatherRows(const Tensor& x, const Tensor& rows, Tensor out) {
  Timed(
      "GatherRows", 2 * Bytes(out) + Bytes(rows), 0, [&] { inner().GatherRows(x, rows, out); },
      [&] {
        return Shapes({{"x", &x}, {"out", &out}});
      });
}

void TracingBackend::MoeGate(const Tensor& logits, const Tensor& bias, const MoeGateParams& p,
                             Tensor topk_ids, Tensor topk_weights) {
  Timed(
      "MoeGate", Bytes(logits) + Bytes(bias) + Bytes(topk_ids) + Bytes(topk_weights),
      4 * Numel(logits), [&] { inner().MoeGate(logits, bias, p, topk_ids, topk_weights); },
      [&] {
        return Shapes({{"logits", &logits}, {"topk_ids", &topk_ids}});
      });
}

void TracingBackend::MoeExperts(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                                std::span<const ExpertWeights> experts, Tensor out) {
  // The experts read: at most one per routed (token, slot), at most all of them.
  double weight_bytes = 0, flops = 0;
  if (!experts.empty()) {
    const ExpertWeights& e = experts[0];
    const double per_expert =
        static_cast<double>(e.gate.nbytes() + e.up.nbytes() + e.down.nbytes());
    const double routed = Numel(topk_ids);
    weight_bytes = per_expert * std::min(routed, static_cast<double>(experts.size()));
    flops = 2 * routed *
            static_cast<double>(e.gate.rows * e.gate.cols + e.up.rows * e.up.cols +
                                e.down.rows * e.down.cols);
  }
  Timed(
      "MoeExperts", Bytes(x) + Bytes(topk_ids) + Bytes(topk_weights) + Bytes(out) + weight_bytes,
      flops, [&] { inner().MoeExperts(x, topk_ids, topk_weights, experts, out); },
      [&] {
        return Shapes({{"x", &x}, {"topk_ids", &topk_ids}}) + ", " +
               JsonArg("experts", static_cast<double>(experts.size()));
      });
}

}  // namespace dh
