// Activation statistics of a model on a calibration text, for the AWQ scale search (awq.h).
//
// The CPU reference runs the text in windows; an observer on every matrix product's input keeps,
// per layer and site (model: cpu_backend.h's LinearSite), the mean |x| of each input channel over
// all tokens (AWQ's "activation scale") and an evenly spaced sample of whole input rows, on which
// the search measures each candidate's output error. For GPTQ it can instead sum the input Hessian
// H = sum x x^T over evenly spaced rows as they pass (cols x cols a site, whatever the row count),
// so its calibration text is not bounded by the memory that kept rows would take.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/thread_pool.h"
#include "model/config.h"
#include "model/weights.h"

namespace kiln::quant {

struct SiteStats {
  int64_t cols = 0;
  std::vector<double> abs_sum;  // cols: sum over tokens of |x|
  int64_t tokens = 0;
  std::vector<float> samples;   // n_samples x cols, row-major
  int64_t n_samples = 0;
  std::vector<double> hessian;  // cols x cols, row-major (both triangles): sum of x x^T over hessian_rows rows
  int64_t hessian_rows = 0;

  std::vector<float> mean_abs() const;
};

struct Calibration {
  std::vector<std::array<SiteStats, 4>> layers;  // [layer][LinearSite]
  int64_t tokens = 0;
};

// H (cols x cols, row-major) += X^T X over the given rows of x (rows x cols): one fp32 product over
// those rows (a window's worth at most, as calibrate passes them), summed into the fp64 total.
void add_gram(std::vector<double>& H, const float* x, std::span<const int64_t> rows, int64_t cols, ThreadPool& pool);

// Runs `tokens` through a CPU copy of the model in windows of `window` tokens (each window a fresh
// sequence, as perplexity does) and keeps up to `max_samples` rows per site; with hessian_rows > 0
// it also sums every site's H over up to that many evenly spaced rows (the rows max_samples = hessian_rows
// would keep, so the two ways give the same H up to fp32 rounding: each window's product is fp32).
Calibration calibrate(const ModelConfig& config, const ModelWeights& weights, ThreadPool& pool,
                      std::span<const int32_t> tokens, int64_t window, int64_t max_samples,
                      int64_t hessian_rows = 0);

// forward_windows' observer: a site's input for every window at once, with the weights the forward
// runs on, which it may change (cpu_backend.h's ActivationObserver, and the weights with it).
using WindowObserver =
    std::function<void(ModelWeights& w, int64_t layer, LinearSite site, float* x, int64_t rows, int64_t cols)>;

// Every whole window of `window` tokens of `tokens` as a sequence of its own, all in one batched
// forward of a CPU backend over w (the sequential GPTQ and gain-fit passes). w is moved into the
// backend and given back, also when the forward throws: the caller keeps what the observer changed.
void forward_windows(const ModelConfig& config, ModelWeights& w, ThreadPool& pool, std::span<const int32_t> tokens,
                     int64_t window, const WindowObserver& observer);

}  // namespace kiln::quant
