#include "backend/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

namespace kiln::cpu {

void rmsnorm(const float* x, const float* weight, float* out, int64_t rows, int64_t dim, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    double sum_sq = 0;
    for (int64_t i = 0; i < dim; ++i) sum_sq += double(xr[i]) * xr[i];
    float scale = float(1.0 / std::sqrt(sum_sq / double(dim) + double(eps)));
    for (int64_t i = 0; i < dim; ++i) out[r * dim + i] = xr[i] * scale * weight[i];
  }
}

// Eight independent partial sums let the compiler vectorize without -ffast-math.
static float dot(const float* a, const float* b, int64_t k) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= k; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < k; ++i) sum += a[i] * b[i];
  return sum;
}

float rope_inv_freq(const RopeConfig& rope, int i) {
  double freq = std::pow(double(rope.theta), -2.0 * i / double(rope.rot_dim));
  if (rope.llama3_factor > 0) {
    // Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, the band between blended.
    double low_wavelen = rope.llama3_original_context / rope.llama3_low_freq_factor;
    double high_wavelen = rope.llama3_original_context / rope.llama3_high_freq_factor;
    double wavelen = 2 * std::numbers::pi / freq;
    if (wavelen > low_wavelen) {
      freq /= rope.llama3_factor;
    } else if (wavelen >= high_wavelen) {
      double smooth = (rope.llama3_original_context / wavelen - rope.llama3_low_freq_factor) /
                      (rope.llama3_high_freq_factor - rope.llama3_low_freq_factor);
      freq = (1 - smooth) * freq / rope.llama3_factor + smooth * freq;
    }
  }
  if (!rope.freq_factors.empty()) freq /= double(rope.freq_factors[size_t(i)]);
  return float(freq);
}

void rope(float* x, const int32_t* positions, int64_t tokens, int64_t heads, int64_t head_dim, const RopeConfig& rope) {
  int half = rope.rot_dim / 2;
  std::vector<float> inv_freq(half);
  for (int i = 0; i < half; ++i) inv_freq[i] = rope_inv_freq(rope, i);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int i = 0; i < half; ++i) {
      // Angles in double: fp32 position * freq loses digits at long context.
      double angle = double(positions[t]) * double(inv_freq[i]);
      float c = float(std::cos(angle)), s = float(std::sin(angle));
      for (int64_t h = 0; h < heads; ++h) {
        float* xh = x + (t * heads + h) * head_dim;
        int64_t a = rope.style == RopeStyle::interleaved ? 2 * i : i;
        int64_t b = rope.style == RopeStyle::interleaved ? 2 * i + 1 : i + half;
        float x0 = xh[a], x1 = xh[b];
        xh[a] = x0 * c - x1 * s;
        xh[b] = x0 * s + x1 * c;
      }
    }
  }
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void attention(const float* q, const float* k, const float* v, float* out, int64_t n_q, int64_t q_start,
               int64_t n_heads, int64_t n_kv_heads, int64_t head_dim) {
  int64_t group = n_heads / n_kv_heads;
  float scale = 1.0f / std::sqrt(float(head_dim));
  std::vector<float> scores(q_start + n_q);
  for (int64_t t = 0; t < n_q; ++t) {
    int64_t n_visible = q_start + t + 1;
    for (int64_t h = 0; h < n_heads; ++h) {
      const float* qh = q + (t * n_heads + h) * head_dim;
      int64_t kvh = h / group;
      float max_score = -INFINITY;
      for (int64_t p = 0; p < n_visible; ++p) {
        const float* kp = k + (p * n_kv_heads + kvh) * head_dim;
        scores[p] = dot(qh, kp, head_dim) * scale;
        max_score = std::max(max_score, scores[p]);
      }
      double denom = 0;
      for (int64_t p = 0; p < n_visible; ++p) {
        scores[p] = std::exp(scores[p] - max_score);
        denom += scores[p];
      }
      float* oh = out + (t * n_heads + h) * head_dim;
      std::fill(oh, oh + head_dim, 0.0f);
      for (int64_t p = 0; p < n_visible; ++p) {
        float w = float(scores[p] / denom);
        const float* vp = v + (p * n_kv_heads + kvh) * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) oh[d] += w * vp[d];
      }
    }
  }
}

}  // namespace kiln::cpu
