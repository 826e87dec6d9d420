#include "quant/kl_divergence.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kiln::quant {

void log_softmax(std::span<const float> logits, std::vector<double>& out) {
  const float mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float v : logits) sum += std::exp(double(v) - double(mx));
  const double lse = double(mx) + std::log(sum);
  out.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = double(logits[i]) - lse;
}

LogProbRecord LogProbRecord::encode(std::span<const double> lp) {
  LogProbRecord r;
  const double mx = *std::max_element(lp.begin(), lp.end());
  r.min_lp = float(mx - 16.0);
  r.scale = float((mx - double(r.min_lp)) / 65535.0);
  r.q.resize(lp.size());
  for (size_t i = 0; i < lp.size(); ++i) {
    const double v = std::round((lp[i] - double(r.min_lp)) / double(r.scale));
    r.q[i] = uint16_t(std::clamp(v, 0.0, 65535.0));
  }
  return r;
}

void LogProbRecord::write_to(uint8_t* out) const {
  std::memcpy(out, &min_lp, 4);
  std::memcpy(out + 4, &scale, 4);
  std::memcpy(out + 8, q.data(), q.size() * 2);
}

LogProbRecord LogProbRecord::read_from(const uint8_t* in, size_t vocab) {
  LogProbRecord r;
  std::memcpy(&r.min_lp, in, 4);
  std::memcpy(&r.scale, in + 4, 4);
  r.q.resize(vocab);
  std::memcpy(r.q.data(), in + 8, vocab * 2);
  return r;
}

TokenComparison compare(const LogProbRecord& base, std::span<const double> lp) {
  TokenComparison c;
  double z = 0;
  size_t base_top = 0, top = 0;
  for (size_t i = 0; i < lp.size(); ++i) {
    z += std::exp(base.log_prob(i));
    if (base.q[i] > base.q[base_top]) base_top = i;
    if (lp[i] > lp[top]) top = i;
  }
  const double log_z = std::log(z);
  double kl = 0;
  for (size_t i = 0; i < lp.size(); ++i) {
    const double lb = base.log_prob(i) - log_z;
    kl += std::exp(lb) * (lb - lp[i]);
  }
  c.kl = std::max(kl, 0.0);
  c.same_top1 = base_top == top;
  return c;
}

}  // namespace kiln::quant
