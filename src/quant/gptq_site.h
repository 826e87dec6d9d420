// The pieces of GPTQ that apply_gptq (gptq.cpp) and the sequential forms (gptq_sequential.cpp)
// share: one site's quantization and a Hessian from kept rows.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/thread_pool.h"
#include "model/weights.h"
#include "quant/gptq.h"

namespace kiln::quant {

// GPTQ (and the refit and descent rounds) on every matrix that reads one layer's site (LinearSite
// order: 0 q/k/v, 1 o, 2 gate/up, 3 down), from that site's H. With `input_map` (cols x cols,
// row-major) each matrix W is first replaced by W * input_map, the target asymmetric calibration
// fits (gptq_sequential.cpp).
void gptq_site(LayerWeights& layer_w, int64_t layer, int site, int64_t cols, const std::vector<double>& H,
               ThreadPool& pool, int64_t int4_group, const std::function<void(const GptqReport&)>& on_matrix,
               const GptqOptions& options, const std::vector<float>* input_map = nullptr);

// H = X^T X over the rows of x, one fp32 product per `chunk` rows summed in fp64 (as calibrate
// sums a window at a time).
std::vector<double> hessian_of(const float* x, int64_t rows, int64_t cols, int64_t chunk, ThreadPool& pool);

}  // namespace kiln::quant
