// PluginBackend (plugin_backend.h).
#include "backend/plugin_backend.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>

#include "backend/kernel_note.h"
#include "base/check.h"

namespace dh {
namespace {

bool Contiguous(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) {
    if (t->dtype != DType::kF32 || !t->contiguous()) return false;
  }
  return true;
}

}  // namespace

const std::vector<std::string>& PluginBackend::KnownOps() {
  static const std::vector<std::string> ops = {"rms_norm", "silu_mul"};
  return ops;
}

Result<std::unique_ptr<PluginBackend>> PluginBackend::Create(
    std::unique_ptr<Backend> inner, const std::vector<std::string>& paths) {
  const std::string device = inner->name();
  if (device != "cpu" && device != "reference") {
    return Unsupported(
        "--plugin: plugin ops run on host memory; the {} backend's is not "
        "(use --device cpu)",
        device);
  }
  std::unique_ptr<PluginBackend> b(new PluginBackend(std::move(inner)));
  for (const std::string& path : paths) {
    Status st = b->Load(path);
    if (!st.ok()) return st.WithContext("--plugin " + path);
  }
  return b;
}

PluginBackend::~PluginBackend() {
  for (void* h : handles_) dlclose(h);
}

Status PluginBackend::Load(const std::string& path) {
  // dlopen searches the library path for a bare name: a plugin is always a file.
  const std::string file = path.find('/') == std::string::npos ? "./" + path : path;
  void* h = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) return InvalidArgument("cannot load: {}", dlerror());
  handles_.push_back(h);
  auto version = reinterpret_cast<uint32_t (*)()>(dlsym(h, "dh_plugin_abi_version"));
  if (!version) return InvalidArgument("missing symbol dh_plugin_abi_version");
  auto reg = reinterpret_cast<int (*)(const dh_plugin_host*)>(dlsym(h, "dh_plugin_register"));
  if (!reg) return InvalidArgument("missing symbol dh_plugin_register");
  const uint32_t v = version();
  if (v != DH_PLUGIN_ABI_VERSION) {
    return InvalidArgument("plugin ABI version {}, this deepharness expects {}", v,
                           DH_PLUGIN_ABI_VERSION);
  }
  loading_ = std::filesystem::path(path).filename().string();
  register_error_.clear();
  const dh_plugin_host host{DH_PLUGIN_ABI_VERSION, this, &PluginBackend::RegisterOp};
  const int rc = reg(&host);
  if (!register_error_.empty()) return InvalidArgument("{}", register_error_);
  if (rc != 0) return InvalidArgument("dh_plugin_register returned {}", rc);
  return Status::Ok();
}

int PluginBackend::RegisterOp(void* context, const char* op_name, void (*fn)(void)) {
  auto* self = static_cast<PluginBackend*>(context);
  const std::string name = op_name ? op_name : "";
  if (!self->register_error_.empty()) return 1;
  const auto& known = KnownOps();
  if (std::find(known.begin(), known.end(), name) == known.end()) {
    self->register_error_ =
        fmt::format("registers unknown op '{}' (known: {})", name, fmt::join(known, ", "));
    return 1;
  }
  if (!fn) {
    self->register_error_ = fmt::format("registers op '{}' with a null function", name);
    return 1;
  }
  if (Op* op = self->Find(name)) {
    self->register_error_ = fmt::format("op '{}' is already registered by {}", name, op->library);
    return 1;
  }
  self->ops_.push_back({name, self->loading_, fn, 0});
  return 0;
}

PluginBackend::Op* PluginBackend::Find(const std::string& name) {
  for (Op& op : ops_) {
    if (op.name == name) return &op;
  }
  return nullptr;
}

std::vector<std::string> PluginBackend::Usage() const {
  std::vector<std::string> out;
  for (const Op& op : ops_) {
    out.push_back(fmt::format("{} from {}: {} calls", op.name, op.library, op.calls));
  }
  return out;
}

void PluginBackend::RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor out) {
  Op* op = ops_.empty() ? nullptr : Find("rms_norm");
  if (!op || !Contiguous({&x, &weight, &out})) return inner().RmsNorm(x, weight, eps, out);
  const dh_rms_norm_args args{x.as<const float>(), weight.as<const float>(),
                              out.as<float>(),     x.numel() / x.dim(-1),
                              x.dim(-1),           eps};
  NoteKernel(op->library.c_str());
  const int rc = reinterpret_cast<dh_rms_norm_fn>(op->fn)(&args);
  DH_CHECK(rc == 0, "plugin {}: rms_norm returned {}", op->library, rc);
  ++op->calls;
}

void PluginBackend::SiluMul(const Tensor& gate, const Tensor& up, Tensor out) {
  Op* op = ops_.empty() ? nullptr : Find("silu_mul");
  if (!op || !Contiguous({&gate, &up, &out})) return inner().SiluMul(gate, up, out);
  const dh_silu_mul_args args{gate.as<const float>(), up.as<const float>(), out.as<float>(),
                              out.numel()};
  NoteKernel(op->library.c_str());
  const int rc = reinterpret_cast<dh_silu_mul_fn>(op->fn)(&args);
  DH_CHECK(rc == 0, "plugin {}: silu_mul returned {}", op->library, rc);
  ++op->calls;
}

}  // namespace dh
