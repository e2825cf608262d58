// PluginBackend: a decorator that runs ops registered by shared libraries (--plugin FILE.so,
// include/deepharness/plugin.h) in place of the wrapped backend's, and every other op (and
// every call a plugin cannot take: strided views) on the wrapped backend. Plugins work on host
// memory, so only host backends (cpu, reference) accept them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/forwarding_backend.h"
#include "deepharness/plugin.h"

namespace dh {

class PluginBackend final : public ForwardingBackend {
 public:
  // Loads each library in order and registers its ops. Refused, naming the file: a library
  // that cannot be loaded, lacks dh_plugin_abi_version or dh_plugin_register, has another ABI
  // version, registers an unknown op or one already registered, or whose registration fails.
  static Result<std::unique_ptr<PluginBackend>> Create(std::unique_ptr<Backend> inner,
                                                       const std::vector<std::string>& paths);
  ~PluginBackend() override;

  // One line per registered op: "rms_norm from rms_norm_plugin.so: 12 calls".
  std::vector<std::string> Usage() const;

  void RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor out) override;
  void SiluMul(const Tensor& gate, const Tensor& up, Tensor out) override;

  // Op names a plugin may register.
  static const std::vector<std::string>& KnownOps();

 private:
  explicit PluginBackend(std::unique_ptr<Backend> inner) : ForwardingBackend(std::move(inner)) {}
  Status Load(const std::string& path);
  // register_op of the host table: the context is the PluginBackend.
  static int RegisterOp(void* context, const char* op_name, void (*fn)(void));

  struct Op {
    std::string name, library;
    void (*fn)(void) = nullptr;
    int64_t calls = 0;
  };
  Op* Find(const std::string& name);

  std::vector<void*> handles_;
  std::vector<Op> ops_;
  std::string loading_;        // the library being registered
  std::string register_error_;  // set by RegisterOp
};

}  // namespace dh
