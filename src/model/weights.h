// Host-side weights of a Llama-family model, fp32, row-major (out_features, in_features):
// what the CPU reference computes with and what the GPU backend uploads. A quantized matrix also
// carries its quantized form (`quant`); `data` then holds the dequantized values, so the CPU
// reference computes exactly what dequantize-then-compute in fp32 gives.
#pragma once

#include <cstdint>
#include <vector>

#include "model/quantized_matrix.h"

namespace kiln {

struct HostMatrix {
  std::vector<float> data;
  int64_t rows = 0;
  int64_t cols = 0;
  QuantizedMatrix quant;  // format none for a dense matrix

  HostMatrix() = default;
  HostMatrix(int64_t r, int64_t c) : data(size_t(r * c)), rows(r), cols(c) {}
  bool empty() const { return data.empty(); }
  const float* row(int64_t r) const { return data.data() + r * cols; }
};

struct LayerWeights {
  HostMatrix attn_norm;        // (1, hidden)
  HostMatrix wq, wk, wv, wo;   // (q_dim, hidden), (kv_dim, hidden) x2, (hidden, q_dim)
  HostMatrix bq, bk, bv;       // (1, q_dim|kv_dim); empty unless the family has q/k/v biases
  HostMatrix ffn_norm;         // (1, hidden)
  HostMatrix w_gate, w_up;     // (intermediate, hidden)
  HostMatrix w_down;           // (hidden, intermediate)
};

struct ModelWeights {
  HostMatrix embed;       // (vocab, hidden)
  std::vector<LayerWeights> layers;
  HostMatrix final_norm;  // (1, hidden)
  HostMatrix lm_head;     // (vocab, hidden); empty when tied to the embedding

  const HostMatrix& output() const { return lm_head.empty() ? embed : lm_head; }
};

}  // namespace kiln
