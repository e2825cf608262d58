#include "apps/memory_plan.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "io/model_config.h"
#include "io/safetensors.h"
#include "model/kv_storage.h"
#include "tensor/dtype.h"
#include "weights/weight_plan.h"

namespace dh::app {

namespace {

constexpr uint64_t kRuntimeBytes = 256ull << 20;  // code, tokenizer, thread stacks, buffers

// Resident bytes per weight element of a quantized format (scales and zero points included).
double QuantBytesPerElement(const QuantSpec& q) {
  const double group = q.group_size > 0 ? static_cast<double>(q.group_size) : 0;
  switch (q.format) {
    case WeightFormat::kInt8:
      return 1.0 + (group > 0 ? 2.0 / group : 0);  // f16 scale
    case WeightFormat::kInt4:
      return 0.5 + (group > 0 ? 2.5 / group : 0);  // f16 + 4-bit zero
    case WeightFormat::kFp8Block: return 1.0;
    case WeightFormat::kDense: break;
  }
  return 0;
}

// Resident bytes per element of tensor t under the plan, or 0 for "as stored". Only matrices
// take the policy's format (norms, biases and router vectors are loaded as they are); --dtype
// converts every floating tensor the policy leaves as stored.
double BytesPerElement(const TensorInfo& t, const WeightPlan& plan) {
  const bool floating = t.dtype == DType::kF32 || t.dtype == DType::kBF16 || t.dtype == DType::kF16;
  if (!floating) return 0;
  if (t.shape.size() == 2) {
    const PrecisionFormat f = plan.policy.FormatFor(t.name);
    if (f.kind == PrecisionFormat::Kind::kQuant) return QuantBytesPerElement(f.quant);
    if (f.kind == PrecisionFormat::Kind::kDense) return static_cast<double>(DTypeSize(f.dtype));
  }
  return plan.dtype ? static_cast<double>(DTypeSize(*plan.dtype)) : 0;
}

// The cache layout the architectures use (MLA: one latent row of kv_lora_rank + rope dims with
// a scale for each part; otherwise K and V per kv head), in the cache dtype.
uint64_t KvBytesPerToken(const ModelConfig& c, DType dtype) {
  KvCacheSpec spec;
  spec.num_layers = static_cast<int>(std::max<int64_t>(c.num_hidden_layers, 0));
  spec.dtype = dtype;
  if (c.kv_lora_rank > 0) {
    spec.k_heads = 1;
    spec.k_dim = c.kv_lora_rank + c.qk_rope_head_dim;
    spec.k_group = c.kv_lora_rank;
  } else {
    const int64_t kvh = c.num_key_value_heads > 0 ? c.num_key_value_heads : c.num_attention_heads;
    const int64_t d = c.head_dim > 0 ? c.head_dim
                                     : (c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0);
    spec.k_heads = spec.v_heads = std::max<int64_t>(kvh, 0);
    spec.k_dim = spec.v_dim = std::max<int64_t>(d, 0);
  }
  return spec.BytesPerToken();
}

}  // namespace

Result<MemoryPlan> PlanMemory(const PlanInputs& in) {
  MemoryPlan plan;
  DH_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(in.model.model_path));
  // Mapping reads only the headers (the data pages are never touched here).
  FileLoadOptions files;
  files.use_mmap = true;
  DH_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::Open(in.model.model_path, files));

  DH_ASSIGN_OR_RETURN(const WeightPlan weight_plan, ParseWeightPlan(WeightFlagsOf(in.model)));
  // The flags as given, for the printout.
  if (!in.model.policy.empty()) {
    plan.weight_format = "--policy " + in.model.policy;
  } else if (in.model.quant != "none") {
    plan.weight_format = in.model.quant;
  } else {
    plan.weight_format = in.model.dtype != "auto" ? in.model.dtype : "as stored";
  }
  double weights = 0;
  for (const TensorInfo* t : ckpt.tensors()) {
    plan.stored += t->nbytes;
    double numel = 1;
    for (int64_t d : t->shape) numel *= static_cast<double>(d);
    const double bytes = BytesPerElement(*t, weight_plan);
    weights += bytes > 0 ? numel * bytes : static_cast<double>(t->nbytes);
  }
  plan.weights = static_cast<uint64_t>(weights);

  plan.memory = ReadMemoryInfo();
  plan.context = in.max_seq_len > 0 ? in.max_seq_len : config.max_position_embeddings;
  DH_ASSIGN_OR_RETURN(const DType kv_dtype, ParseKvCacheDtype(in.model.kv_cache_dtype));
  plan.kv_cache_dtype = std::string(KvCacheDtypeName(kv_dtype));
  plan.kv_per_token = KvBytesPerToken(config, kv_dtype);
  constexpr uint64_t kBlock = 16;
  const uint64_t per_block = plan.kv_per_token * kBlock;
  if (in.num_kv_blocks > 0) {
    plan.kv_pool = per_block * static_cast<uint64_t>(in.num_kv_blocks);
  } else if (in.kv_cache_memory > 0) {
    plan.kv_pool = in.kv_cache_memory / std::max<uint64_t>(per_block, 1) * per_block;
  } else {
    // The engine's default: what max_num_seqs full-length sequences can use, at most half of
    // the memory left after the weights.
    const uint64_t blocks_per_seq = (static_cast<uint64_t>(plan.context) + kBlock - 1) / kBlock;
    const uint64_t useful = static_cast<uint64_t>(std::max(in.max_num_seqs, 1)) * blocks_per_seq * per_block;
    const uint64_t left = plan.memory.available > plan.weights ? plan.memory.available - plan.weights : 0;
    plan.kv_pool = std::min(useful, std::max<uint64_t>(left / 2, 64ull << 20));
  }

  // One step's arena: residual/normed/attention/MLP buffers per token, the attention scores of
  // a prefill chunk against the context, and the logits rows (f32).
  const double t = std::min<double>(std::max(in.max_num_batched_tokens, 1), static_cast<double>(plan.context));
  const double h = static_cast<double>(config.hidden_size);
  const double inter = static_cast<double>(std::max(config.intermediate_size, config.moe_intermediate_size));
  const double heads = static_cast<double>(std::max<int64_t>(config.num_attention_heads, 1));
  const double per_token = 10 * h + 3 * inter + heads * static_cast<double>(plan.context);
  plan.activations = static_cast<uint64_t>(4 * (t * per_token + static_cast<double>(config.vocab_size) *
                                                                   std::max(in.max_num_seqs, 1)));
  plan.kv_tokens = plan.kv_per_token > 0 ? plan.kv_pool / per_block * kBlock : 0;
  plan.runtime = kRuntimeBytes;
  plan.total = plan.weights + plan.kv_pool + plan.activations + plan.runtime;
  plan.fits = plan.memory.available == 0 || plan.total <= plan.memory.available;
  return plan;
}

std::string FormatPlan(const MemoryPlan& p) {
  std::string out;
  out += fmt::format("weights            {} ({}; {} stored)\n", FormatBytes(p.weights),
                     p.weight_format, FormatBytes(p.stored));
  out += fmt::format("kv pool            {} ({} tokens of {}, --kv-cache-dtype {}; context {})\n",
                     FormatBytes(p.kv_pool), p.kv_tokens, FormatBytes(p.kv_per_token),
                     p.kv_cache_dtype, p.context);
  out += fmt::format("activations        {} (peak of one step, estimate)\n", FormatBytes(p.activations));
  out += fmt::format("runtime            {}\n", FormatBytes(p.runtime));
  out += fmt::format("total              {}\n", FormatBytes(p.total));
  if (p.memory.available > 0) {
    out += fmt::format("available          {} ({})\n", FormatBytes(p.memory.available), p.memory.source);
    out += fmt::format("verdict            {}\n", p.fits ? "fits" : "does NOT fit");
  } else {
    out += "available          unknown\n";
  }
  return out;
}

Status CheckPlanFits(const PlanInputs& in, const MemoryPlan& plan) {
  if (plan.fits) return Status::Ok();
  // Suggest only what would fit.
  const uint64_t avail = plan.memory.available;
  std::string advice;
  auto add = [&advice](const std::string& s) { advice += (advice.empty() ? "" : " or ") + s; };
  if (in.model.quant == "none" && in.model.policy.empty()) {
    PlanInputs q = in;
    q.model.quant = "int4";
    auto alt = PlanMemory(q);
    if (alt.ok() && alt->total <= avail) add(fmt::format("--quant int4 (≈ {})", FormatBytes(alt->total)));
  }
  if (plan.context > 4096) {
    PlanInputs s = in;
    s.max_seq_len = 4096;
    auto alt = PlanMemory(s);
    if (alt.ok() && alt->total <= avail) add(fmt::format("--max-seq-len 4096 (≈ {})", FormatBytes(alt->total)));
  }
  if (in.kv_cache_memory > 0 || in.num_kv_blocks > 0) {
    const uint64_t rest = plan.total - plan.kv_pool;
    if (rest < avail) add(fmt::format("--kv-cache-memory {}MiB", (avail - rest) >> 20));
  }
  if (advice.empty()) advice = "a smaller model or a machine with more memory";
  return InvalidArgument(
      "{}: needs {} (weights {}, KV pool {}, activations {}, runtime {}), {} available ({}): try "
      "{} (`deepharness info --plan` shows the plan; --no-memory-check skips this check)",
      in.model.model_path, FormatBytes(plan.total), FormatBytes(plan.weights),
      FormatBytes(plan.kv_pool), FormatBytes(plan.activations), FormatBytes(plan.runtime),
      FormatBytes(avail), plan.memory.source, advice);
}

}  // namespace dh::app
