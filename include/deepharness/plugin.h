/* deepharness op plugins: the C ABI a shared library implements to replace a backend op
 * (docs/observability.md "Op plugins"). Load one with `--plugin FILE.so`.
 *
 * The library exports two functions:
 *   uint32_t dh_plugin_abi_version(void);           returns DH_PLUGIN_ABI_VERSION
 *   int dh_plugin_register(const dh_plugin_host*);  calls host->register_op once per op; 0 = ok
 * deepharness refuses a library whose version differs from its own, that lacks either symbol,
 * or that registers an op name it does not know, naming the file and the reason.
 *
 * Ops run on host memory (the cpu and reference backends), on contiguous row-major f32 arrays,
 * from the engine thread; a plugin op returns 0 on success. Where a call does not fit (strided
 * views), the built-in op runs instead. Bump DH_PLUGIN_ABI_VERSION on any change below. */
#ifndef DEEPHARNESS_PLUGIN_H_
#define DEEPHARNESS_PLUGIN_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DH_PLUGIN_ABI_VERSION 1u

/* "rms_norm": out[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * weight (out may equal x). */
typedef struct {
  const float* x;
  const float* weight; /* [cols] */
  float* out;
  int64_t rows, cols;
  float eps;
} dh_rms_norm_args;
typedef int (*dh_rms_norm_fn)(const dh_rms_norm_args* args);

/* "silu_mul": out[i] = gate[i] / (1 + exp(-gate[i])) * up[i] (out may equal gate or up). */
typedef struct {
  const float* gate;
  const float* up;
  float* out;
  int64_t n;
} dh_silu_mul_args;
typedef int (*dh_silu_mul_fn)(const dh_silu_mul_args* args);

typedef struct dh_plugin_host {
  uint32_t abi_version; /* the host's DH_PLUGIN_ABI_VERSION */
  void* context;        /* pass back to register_op */
  /* Registers `fn` (a dh_<op>_fn cast to void (*)(void)) for op `op_name`; non-zero when the
   * op is unknown or already registered. */
  int (*register_op)(void* context, const char* op_name, void (*fn)(void));
} dh_plugin_host;

uint32_t dh_plugin_abi_version(void);
int dh_plugin_register(const dh_plugin_host* host);

#ifdef __cplusplus
}
#endif

#endif /* DEEPHARNESS_PLUGIN_H_ */
