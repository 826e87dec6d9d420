#include "model/gguf/gguf_names.h"

#include <fmt/format.h>

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
    LayerWeights& L = w.layers[l];
    auto n = [&](const char* suffix) { return fmt::format("blk.{}.{}", l, suffix); };
    add(n("attn_norm.weight"), L.attn_norm);
    add(n("attn_q.weight"), L.wq);
    add(n("attn_k.weight"), L.wk);
    add(n("attn_v.weight"), L.wv);
    add(n("attn_output.weight"), L.wo);
    add(n("attn_q.bias"), L.bq);
    add(n("attn_k.bias"), L.bk);
    add(n("attn_v.bias"), L.bv);
    add(n("ffn_norm.weight"), L.ffn_norm);
    add(n("ffn_gate.weight"), L.w_gate);
    add(n("ffn_up.weight"), L.w_up);
    add(n("ffn_down.weight"), L.w_down);
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
