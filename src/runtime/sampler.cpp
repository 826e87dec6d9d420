#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "core/argmax.h"
#include "core/check.h"

namespace kiln {

void SamplingParams::validate() const {
  KILN_CHECK(std::isfinite(temperature) && temperature >= 0 && temperature <= 100, invalid_argument,
             "temperature must be in [0, 100], got {}", temperature);
  KILN_CHECK(std::isfinite(top_p) && top_p > 0 && top_p <= 1, invalid_argument, "top_p must be in (0, 1], got {}",
             top_p);
  KILN_CHECK(std::isfinite(min_p) && min_p >= 0 && min_p <= 1, invalid_argument, "min_p must be in [0, 1], got {}",
             min_p);
  KILN_CHECK(std::isfinite(repetition_penalty) && repetition_penalty > 0 && repetition_penalty <= 100,
             invalid_argument, "repetition_penalty must be in (0, 100], got {}", repetition_penalty);
  KILN_CHECK(std::isfinite(presence_penalty) && std::fabs(presence_penalty) <= 2, invalid_argument,
             "presence_penalty must be in [-2, 2], got {}", presence_penalty);
  KILN_CHECK(std::isfinite(frequency_penalty) && std::fabs(frequency_penalty) <= 2, invalid_argument,
             "frequency_penalty must be in [-2, 2], got {}", frequency_penalty);
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) { params_.validate(); }

int32_t Sampler::argmax(std::span<const float> logits) {
  const int32_t best = kiln::argmax(logits);
  KILN_CHECK(best >= 0, invalid_argument, "every logit is NaN");
  return best;
}

bool has_penalties(const SamplingParams& p) {
  return p.repetition_penalty != 1.0f || p.presence_penalty != 0 || p.frequency_penalty != 0;
}

void penalty_window(const SamplingParams& params, std::span<const int32_t> history,
                    std::unordered_map<int32_t, int32_t>& counts) {
  counts.clear();
  const size_t window =
      params.penalty_last_n > 0 ? std::min(history.size(), size_t(params.penalty_last_n)) : history.size();
  for (int32_t id : history.last(window)) ++counts[id];
}

void Sampler::apply_penalties(std::span<float> logits, std::span<const int32_t> history) {
  if (!has_penalties(params_)) return;
  const bool repetition = params_.repetition_penalty != 1.0f;
  penalty_window(params_, history, counts_);
  for (auto [id, count] : counts_) {
    if (id < 0 || size_t(id) >= logits.size()) continue;
    float& l = logits[size_t(id)];
    if (repetition) l = l > 0 ? l / params_.repetition_penalty : l * params_.repetition_penalty;
    l -= params_.presence_penalty + params_.frequency_penalty * float(count);
  }
}

int32_t Sampler::sample(std::span<float> logits, std::span<const int32_t> history) {
  KILN_CHECK(!logits.empty(), invalid_argument, "cannot sample from an empty vocabulary");
  apply_penalties(logits, history);
  if (params_.temperature <= 0) return argmax(logits);

  // Candidates sorted by logit, descending; then cut by top-k, top-p, min-p.
  candidates_.clear();
  float inv_t = 1.0f / params_.temperature;
  for (size_t i = 0; i < logits.size(); ++i)
    if (!std::isnan(logits[i])) candidates_.emplace_back(logits[i] * inv_t, int32_t(i));
  KILN_CHECK(!candidates_.empty(), invalid_argument, "every logit is NaN");
  size_t keep = candidates_.size();
  if (params_.top_k > 0) keep = std::min(keep, size_t(params_.top_k));
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  std::partial_sort(candidates_.begin(), candidates_.begin() + ptrdiff_t(keep), candidates_.end(), by_logit);
  candidates_.resize(keep);

  // Softmax over the survivors (max subtracted), in double for the running sums. A max that is not
  // finite (an infinite logit, or a temperature so small that the scaling overflows) would make
  // inf - inf: that limit of the distribution is the argmax, which the device sampler also takes.
  float max_logit = candidates_[0].first;
  if (!std::isfinite(max_logit)) return candidates_[0].second;
  std::vector<double> probs(keep);
  double total = 0;
  for (size_t i = 0; i < keep; ++i) total += probs[i] = std::exp(double(candidates_[i].first - max_logit));
  for (double& p : probs) p /= total;

  size_t cut = keep;
  if (params_.top_p < 1.0f) {
    double cumulative = 0;
    for (size_t i = 0; i < keep; ++i) {
      cumulative += probs[i];
      if (cumulative >= params_.top_p) {
        cut = i + 1;
        break;
      }
    }
  }
  if (params_.min_p > 0) {
    double threshold = params_.min_p * probs[0];
    size_t n = 1;
    while (n < cut && probs[n] >= threshold) ++n;
    cut = n;
  }

  double mass = 0;
  for (size_t i = 0; i < cut; ++i) mass += probs[i];
  double r = std::uniform_real_distribution<double>(0.0, mass)(rng_);
  for (size_t i = 0; i < cut; ++i) {
    r -= probs[i];
    if (r < 0) return candidates_[i].second;
  }
  return candidates_[cut - 1].second;
}

}  // namespace kiln
