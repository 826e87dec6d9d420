#include "model/gguf/gguf_names.h"

#include <fmt/format.h>

#include "model/layer_tensors.h"

namespace kiln::gguf {

std::map<std::string, HostMatrix*> named_tensors(ModelWeights& w) {
  std::map<std::string, HostMatrix*> m;
  auto add = [&](std::string name, HostMatrix& h) {
    if (!h.empty()) m.emplace(std::move(name), &h);
  };
  add("token_embd.weight", w.embed);
  add("output_norm.weight", w.final_norm);
  add("output.weight", w.lm_head);
  for (size_t l = 0; l < w.layers.size(); ++l) {
    for (const LayerTensor& t : kLayerTensors) add(fmt::format("blk.{}.{}", l, t.gguf), w.layers[l].*t.field);
  }
  return m;
}

bool is_linear_weight(const std::string& name) {
  if (!name.starts_with("blk.")) return false;
  for (const char* s : {".attn_q.weight", ".attn_k.weight", ".attn_v.weight", ".attn_output.weight",
                        ".ffn_gate.weight", ".ffn_up.weight", ".ffn_down.weight"})
    if (name.ends_with(s)) return true;
  return false;
}

}  // namespace kiln::gguf
