// The analytic cost of every op of a forward step: the fewest bytes it must move through device
// memory (each input read once, each output written once) and the FLOPs it must do. One place,
// used by the CUDA backend's per-kernel profile, `kiln bench`'s roofline columns and (later) the
// server's bandwidth metrics, so every report divides by the same numbers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace kiln::profile {

struct Cost {
  double bytes = 0;
  double flops = 0;
  Cost& operator+=(const Cost& o) {
    bytes += o.bytes;
    flops += o.flops;
    return *this;
  }
};

// Bytes per element of what the engine stores. Defaults: the CUDA backend (bf16 weights, KV cache
// and activations between kernels, an fp32 residual stream).
struct Widths {
  double weight = 2, kv = 2, act = 2, residual = 4;
  // Bytes per weight of the layers' projections (q/k/v, o, gate/up, down) when they are quantized
  // (data + scales, e.g. 0.5625 for int4 in groups of 128 with fp32 scale and min); 0: `weight`.
  // The embedding keeps `weight`, and so does the head unless head_weight says otherwise (`kiln
  // quantize --head`, `--quant-head`: the output head quantized too).
  double proj_weight = 0;
  double head_weight = 0;
  Widths projections() const {
    Widths p = *this;
    if (proj_weight > 0) p.weight = proj_weight;
    return p;
  }
  Widths head() const {
    Widths p = *this;
    if (head_weight > 0) p.weight = head_weight;
    return p;
  }
};

// y(m, n) = x(m, k) W(n, k)^T: W once, x once, y once (out_bytes per element of y; an output
// added into the fp32 residual is read and written: 8).
Cost linear(int64_t m, int64_t n, int64_t k, double out_bytes, const Widths& w = {});
Cost embed(int64_t tokens, int64_t hidden, const Widths& w = {});           // gather rows into the residual
Cost rmsnorm(int64_t rows, int64_t hidden, const Widths& w = {});           // residual in, activation out
Cost rope_qkv(int64_t tokens, const ModelConfig& c, const Widths& w = {});  // split qkv, rotate q/k, write q and K/V
Cost silu_mul(int64_t tokens, int64_t intermediate, const Widths& w = {});  // gate|up in, h out
// Causal attention of n_new query tokens after `past` cached positions: every visible K/V row
// read once per kv head (GQA shares it across the group), q read and the output written once.
Cost attention(int64_t n_new, int64_t past, const ModelConfig& c, const Widths& w = {});

struct OpCost {
  std::string name;  // as the backend names its launches: "qkv.gemv", "attention.decode", ...
  Cost cost;
};

// Every op of one forward of n_new tokens after `past` cached ones, logits for the last n_out.
std::vector<OpCost> step_ops(const ModelConfig& c, int64_t n_new, int64_t past, int64_t n_out, const Widths& w = {});
Cost step_cost(const ModelConfig& c, int64_t n_new, int64_t past, int64_t n_out, const Widths& w = {});

// One sequence's share of a batched step: n_new tokens after `past` cached ones.
struct SeqShape {
  int64_t n_new = 1;
  int64_t past = 0;
};
// Every op of one batched step (continuous batching): the matrix products see all tokens of all
// sequences as one matrix; attention is summed over the decode sequences (one op) and over the
// prefill ones (another); logits for n_out rows. step_ops is this with one sequence.
std::vector<OpCost> batch_ops(const ModelConfig& c, const std::vector<SeqShape>& seqs, int64_t n_out,
                              const Widths& w = {});
Cost batch_cost(const ModelConfig& c, const std::vector<SeqShape>& seqs, int64_t n_out, const Widths& w = {});

// Bytes of all weights at the given width (norms included).
double weight_bytes(const ModelConfig& c, const Widths& w = {});

// Matrix products with at most this many rows run as GEMV (decode) kernels.
constexpr int64_t kGemvMaxRows = 16;

}  // namespace kiln::profile
