// The numbers behind `kiln perplexity`: negative log-likelihood of the next token, and KL
// divergence of a model's next-token distribution from a base model's, with the base's
// distributions stored compactly as llama-perplexity's --kl-divergence-base stores them: per
// token, the log-probabilities quantized to uint16 over [max - 16 nats, max] (anything less likely
// than e^-16 of the top token counts as that floor; it moves KL by well under 1e-4).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace kiln::quant {

// log softmax(logits)[i] - in double for the sum.
void log_softmax(std::span<const float> logits, std::vector<double>& out);

// One token's base distribution: log p_i ~= min_lp + scale * q[i].
struct LogProbRecord {
  float min_lp = 0;
  float scale = 0;
  std::vector<uint16_t> q;

  static LogProbRecord encode(std::span<const double> log_probs);
  double log_prob(size_t i) const { return double(min_lp) + double(scale) * double(q[i]); }
  // Bytes on disk: two floats, then vocab uint16.
  static size_t bytes(size_t vocab) { return 8 + 2 * vocab; }
  void write_to(uint8_t* out) const;
  static LogProbRecord read_from(const uint8_t* in, size_t vocab);
};

struct TokenComparison {
  double kl = 0;            // KL(base || this) in nats
  bool same_top1 = false;   // argmax of the two distributions agree
};

// Compares this model's log-probs with a base record (same vocabulary). The base probabilities are
// renormalized after dequantization so that they sum to one.
TokenComparison compare(const LogProbRecord& base, std::span<const double> log_probs);

}  // namespace kiln::quant
