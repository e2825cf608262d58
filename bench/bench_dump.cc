// Tensor dump write rate (issue 19): TensorDumper::OnTap of one tap (host copy + .npy write +
// manifest line) on the reference backend (host memory), for a hidden-state-sized tap and a
// prefill's logits of a 151936-token vocabulary, into a temporary directory. Bytes/s is the
// tap's size per call.
#include <benchmark/benchmark.h>

#include <filesystem>
#include <vector>

#include "backend/reference/reference_backend.h"
#include "model/tensor_dump.h"

namespace dh {
namespace {

void BM_DumpTap(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  const std::string dir =
      (std::filesystem::temp_directory_path() / "dh_bench_dump").string();
  DumpOptions o;
  o.dir = dir;
  auto dumper = TensorDumper::Create(o);
  if (!dumper.ok()) {
    state.SkipWithError(dumper.status().message().c_str());
    return;
  }
  ReferenceBackend backend(BackendOptions{.num_threads = 1});
  std::vector<float> data(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i % 1000) * 0.001f;
  const Tensor t(data.data(), DType::kF32, {rows, cols});
  for (auto _ : state) {
    (*dumper)->BeginStep();  // a new file name per call, as successive steps write
    (*dumper)->OnTap(backend, "logits", t);
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(t.nbytes()));
  if (Status st = (*dumper)->Finish(); !st.ok()) state.SkipWithError(st.message().c_str());
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_DumpTap)
    ->Args({64, 1536})
    ->Args({64, 151936})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace dh

BENCHMARK_MAIN();
