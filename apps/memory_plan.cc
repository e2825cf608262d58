#include "apps/memory_plan.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "io/model_config.h"
#include "io/safetensors.h"
#include "tensor/dtype.h"

namespace dh::app {

namespace {

constexpr uint64_t kRuntimeBytes = 256ull << 20;  // code, tokenizer, thread stacks, buffers

// Resident bytes per weight element of a format (scales and minimums included).
double BytesPerElement(const std::string& format) {
  if (format == "int8" || format == "int8-g32") return 1.0 + 4.0 / 32;
  if (format == "int8-row") return 1.0;
  if (format == "int4" || format == "int4-g32") return 0.5 + 8.0 / 32;
  if (format == "int4-g128") return 0.5 + 8.0 / 128;
  if (format == "fp8") return 1.0;
  if (format == "bf16" || format == "f16" || format == "bfloat16" || format == "float16") return 2;
  if (format == "f32" || format == "float32") return 4;
  return 0;  // as stored
}

bool Contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// Tensors --quant leaves as stored: embeddings, norms, the MoE router, lm_head (unless asked).
bool QuantizedByFlag(const TensorInfo& t, bool quant_lm_head) {
  if (t.shape.size() != 2) return false;
  const std::string& n = t.name;
  if (Contains(n, "embed") || Contains(n, "norm")) return false;
  if (Contains(n, "lm_head")) return quant_lm_head;
  if (Contains(n, ".gate.weight") || Contains(n, "e_score_correction")) return false;
  return true;
}

uint64_t KvBytesPerToken(const ModelConfig& c) {
  const uint64_t layers = static_cast<uint64_t>(std::max<int64_t>(c.num_hidden_layers, 0));
  if (c.kv_lora_rank > 0)
    return layers * static_cast<uint64_t>(c.kv_lora_rank + c.qk_rope_head_dim) * 4;
  const int64_t kvh = c.num_key_value_heads > 0 ? c.num_key_value_heads : c.num_attention_heads;
  const int64_t d = c.head_dim > 0 ? c.head_dim
                                   : (c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0);
  return layers * 2 * static_cast<uint64_t>(std::max<int64_t>(kvh * d, 0)) * 4;
}

}  // namespace

Result<MemoryPlan> PlanMemory(const PlanInputs& in) {
  MemoryPlan plan;
  DH_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(in.model.model_path));
  // Mapping reads only the headers (the data pages are never touched here).
  FileLoadOptions files;
  files.use_mmap = true;
  DH_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::Open(in.model.model_path, files));

  const std::string quant = in.model.quant;
  const bool by_quant = quant != "none" && quant != "auto" && BytesPerElement(quant) > 0;
  const double dtype_bytes = in.model.dtype == "auto" ? 0 : BytesPerElement(in.model.dtype);
  plan.weight_format = by_quant ? quant : (dtype_bytes > 0 ? in.model.dtype : "as stored");
  if (!in.model.policy.empty()) plan.weight_format = "as stored (--policy is not estimated)";
  double weights = 0;
  for (const TensorInfo* t : ckpt.tensors()) {
    plan.stored += t->nbytes;
    double numel = 1;
    for (int64_t d : t->shape) numel *= static_cast<double>(d);
    const bool floating = t->dtype == DType::kF32 || t->dtype == DType::kBF16 || t->dtype == DType::kF16;
    if (in.model.policy.empty() && by_quant && floating && QuantizedByFlag(*t, in.model.quant_lm_head)) {
      weights += numel * BytesPerElement(quant);
    } else if (in.model.policy.empty() && dtype_bytes > 0 && floating) {
      weights += numel * dtype_bytes;
    } else {
      weights += static_cast<double>(t->nbytes);
    }
  }
  plan.weights = static_cast<uint64_t>(weights);

  plan.memory = ReadMemoryInfo();
  plan.context = in.max_seq_len > 0 ? in.max_seq_len : config.max_position_embeddings;
  plan.kv_per_token = KvBytesPerToken(config);
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
  plan.runtime = kRuntimeBytes;
  plan.total = plan.weights + plan.kv_pool + plan.activations + plan.runtime;
  plan.fits = plan.memory.available == 0 || plan.total <= plan.memory.available;
  return plan;
}

std::string FormatPlan(const MemoryPlan& p) {
  std::string out;
  out += fmt::format("weights            {} ({}; {} stored)\n", FormatBytes(p.weights),
                     p.weight_format, FormatBytes(p.stored));
  out += fmt::format("kv pool            {} ({} per token, context {})\n", FormatBytes(p.kv_pool),
                     FormatBytes(p.kv_per_token), p.context);
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
