// The GPU's measured ceilings, which every roofline report divides by: copy bandwidth (a
// device-to-device cudaMemcpy, bytes read + written, as ../shared/GPU.md measures it) and bf16
// tensor-core throughput (cuBLAS on an 8192^3 GEMM: the best a library reaches on this GPU).
// `kiln profile --calibrate` measures them once and caches them per GPU name.
#pragma once

#include <optional>
#include <string>

namespace kiln::cuda {

struct Ceilings {
  std::string gpu;
  double copy_gbs = 0;
  double bf16_tflops = 0;
  bool measured = false;  // false: the assumed H200 figures (GPU.md), not measured on this machine
};

// Runs the two measurements on the current device (a few seconds).
Ceilings measure_ceilings();

// $XDG_CACHE_HOME/kiln/ceilings.json (else ~/.cache/kiln/ceilings.json).
std::string ceilings_cache_path();
// The cached measurement for this GPU, if any.
std::optional<Ceilings> load_cached_ceilings(const std::string& gpu);
void save_cached_ceilings(const Ceilings& c);
// Cached if present, else GPU.md's H200 figures (4250 GB/s, 700 TFLOP/s) marked not measured.
Ceilings current_ceilings();

}  // namespace kiln::cuda
