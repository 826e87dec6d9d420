// Which GGUF tensor holds which part of ModelWeights (ggml's names: token_embd, blk.N.attn_q, ...),
// for writers that emit a model tensor by tensor.
#pragma once

#include <map>
#include <string>

#include "model/weights.h"

namespace kiln::gguf {

// Every tensor of `w` under its GGUF name (biases and output.weight only when present).
std::map<std::string, HostMatrix*> named_tensors(ModelWeights& w);

// True for the matrices of a layer's products: attn_q/k/v/output and ffn_gate/up/down weights.
bool is_linear_weight(const std::string& name);

}  // namespace kiln::gguf
