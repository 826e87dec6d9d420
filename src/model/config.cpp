#include "model/config.h"

#include "core/check.h"

namespace kiln {

int64_t ModelConfig::n_params() const {
  int64_t per_layer = hidden_size * (q_dim() + 2 * kv_dim()) + q_dim() * hidden_size +
                      3 * hidden_size * intermediate_size + 2 * hidden_size;
  int64_t embed = vocab_size * hidden_size;
  return n_layers * per_layer + embed * (tied_embeddings ? 1 : 2) + hidden_size;
}

void ModelConfig::validate() const {
  auto positive = [](int64_t v, const char* what) {
    KILN_CHECK(v > 0 && v < (int64_t(1) << 31), invalid_model, "model config: {} is {}; it must be positive", what, v);
  };
  positive(vocab_size, "vocab_size");
  positive(hidden_size, "hidden_size");
  positive(intermediate_size, "intermediate_size");
  positive(n_layers, "n_layers");
  positive(n_heads, "n_heads");
  positive(n_kv_heads, "n_kv_heads");
  positive(head_dim, "head_dim");
  positive(context_length, "context_length");
  KILN_CHECK(n_heads % n_kv_heads == 0, invalid_model, "model config: {} query heads are not a multiple of {} kv heads",
             n_heads, n_kv_heads);
  KILN_CHECK(rope.rot_dim > 0 && rope.rot_dim <= head_dim && rope.rot_dim % 2 == 0, invalid_model,
             "model config: RoPE dimension {} must be even and at most head_dim {}", rope.rot_dim, head_dim);
  KILN_CHECK(rope.theta > 0, invalid_model, "model config: rope theta {} must be positive", rope.theta);
  KILN_CHECK(rms_eps > 0 && rms_eps < 1, invalid_model, "model config: rms eps {} is out of range", rms_eps);
}

}  // namespace kiln
