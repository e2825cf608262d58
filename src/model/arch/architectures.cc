// The architecture table: HF `architectures` name -> factory.
#include "model/arch/architectures.h"

namespace dh {

void RegisterBuiltinArchitectures() {
  RegisterArchitecture("LlamaForCausalLM", MakeLlama);
  RegisterArchitecture("Qwen2ForCausalLM", MakeQwen2);
  RegisterArchitecture("DeepseekV2ForCausalLM", MakeDeepseekV2V3);
  RegisterArchitecture("DeepseekV3ForCausalLM", MakeDeepseekV2V3);
  RegisterArchitecture("DeepseekForCausalLM", MakeDeepseekMoe);
}

}  // namespace dh
