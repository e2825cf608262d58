// TensorDumper (tensor_dump.h).
#include "model/tensor_dump.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <charconv>
#include <filesystem>

#include "base/glob.h"
#include "io/npy.h"

namespace dh {
namespace {

Result<int> ParseStep(std::string_view s, const std::string& whole) {
  int v = -1;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || v < 0) {
    return InvalidArgument("--dump-steps: '{}': expected A-B or A (steps from 0)", whole);
  }
  return v;
}

}  // namespace

Status ParseDumpSteps(const std::string& text, DumpOptions* o) {
  const size_t dash = text.find('-');
  if (dash == std::string::npos) {
    DH_ASSIGN_OR_RETURN(o->first_step, ParseStep(text, text));
    o->last_step = o->first_step;
    return Status::Ok();
  }
  DH_ASSIGN_OR_RETURN(o->first_step, ParseStep(std::string_view(text).substr(0, dash), text));
  DH_ASSIGN_OR_RETURN(o->last_step, ParseStep(std::string_view(text).substr(dash + 1), text));
  if (o->last_step < o->first_step) {
    return InvalidArgument("--dump-steps: '{}': the last step is before the first", text);
  }
  return Status::Ok();
}

Result<std::unique_ptr<TensorDumper>> TensorDumper::Create(const DumpOptions& options) {
  std::error_code ec;
  std::filesystem::create_directories(options.dir, ec);
  if (ec)
    return IoError("--dump-tensors: cannot create directory {}: {}", options.dir, ec.message());
  std::unique_ptr<TensorDumper> d(new TensorDumper(options));
  const std::string path = options.dir + "/manifest.tsv";
  d->manifest_ = std::fopen(path.c_str(), "w");
  if (!d->manifest_) return IoError("--dump-tensors: cannot write {}", path);
  std::fputs("step\ttap\tdtype\tshape\tfile\n", d->manifest_);
  return d;
}

TensorDumper::~TensorDumper() {
  if (manifest_) std::fclose(manifest_);
}

void TensorDumper::OnTap(Backend& backend, std::string_view name, const Tensor& t) {
  if (!error_.ok() || step_ < options_.first_step || step_ > options_.last_step) return;
  if (!GlobMatchAny(options_.filter, name)) return;
  DH_CHECK(t.contiguous(), "tap {} is a strided view {}", name, t.ShapeString());
  host_.resize(t.nbytes());
  backend.CopyToHost(host_.data(), t);
  const std::string file = fmt::format("s{}.{}.npy", step_, name);
  std::vector<int64_t> shape(t.shape.begin(), t.shape.begin() + t.ndim);
  error_ = WriteNpy(options_.dir + "/" + file, t.dtype, host_.data(), shape);
  if (!error_.ok()) return;
  fmt::print(manifest_, "{}\t{}\t{}\t{}\t{}\n", step_, name, DTypeName(t.dtype),
             fmt::join(shape, "x"), file);
  ++files_written_;
  bytes_written_ += t.nbytes();
}

Status TensorDumper::Finish() {
  if (manifest_) {
    const bool closed = std::fclose(manifest_) == 0;
    manifest_ = nullptr;
    if (!closed && error_.ok())
      error_ = IoError("--dump-tensors: cannot write {}/manifest.tsv", options_.dir);
  }
  return error_;
}

}  // namespace dh
