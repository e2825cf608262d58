/* Example op plugin (include/deepharness/plugin.h): RmsNorm in plain C, accumulating each row's
 * sum of squares in double. Built by CMake as rms_norm_plugin.so; the tests also build it with
 * DH_EXAMPLE_BROKEN set to 1, 2 or 3 to check that deepharness refuses a plugin with the wrong
 * ABI version, without dh_plugin_register, or registering an op it does not know. */
#include <math.h>
#include <stddef.h>

#include "deepharness/plugin.h"

#ifndef DH_EXAMPLE_BROKEN
#define DH_EXAMPLE_BROKEN 0
#endif

static int RmsNorm(const dh_rms_norm_args* a) {
  for (int64_t r = 0; r < a->rows; ++r) {
    const float* x = a->x + r * a->cols;
    float* out = a->out + r * a->cols;
    double sum = 0;
    for (int64_t c = 0; c < a->cols; ++c) sum += (double)x[c] * x[c];
    const float scale = (float)(1.0 / sqrt(sum / (double)a->cols + a->eps));
    for (int64_t c = 0; c < a->cols; ++c) out[c] = x[c] * scale * a->weight[c];
  }
  return 0;
}

uint32_t dh_plugin_abi_version(void) {
  return DH_EXAMPLE_BROKEN == 1 ? DH_PLUGIN_ABI_VERSION + 1 : DH_PLUGIN_ABI_VERSION;
}

#if DH_EXAMPLE_BROKEN != 2
int dh_plugin_register(const dh_plugin_host* host) {
  const char* op = DH_EXAMPLE_BROKEN == 3 ? "fused_everything" : "rms_norm";
  return host->register_op(host->context, op, (void (*)(void))RmsNorm);
}
#endif
