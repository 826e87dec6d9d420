#include "backend/cuda/ceilings.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include <cuda_runtime.h>
#include <nlohmann/json.hpp>

#include "backend/cuda/cublas_ref.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_buffer.h"
#include "kernels/cuda/random_fill.h"

namespace kiln::cuda {
namespace {

template <typename F>
double median_ms(F&& work, int reps) {
  EventTimer timer;
  work();  // warm-up
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    timer.start();
    work();
    timer.stop();
    ms.push_back(timer.elapsed_ms());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

Ceilings measure_ceilings() {
  Ceilings c;
  c.gpu = device_info().name;
  c.measured = true;
  {
    const size_t bytes = size_t(1) << 30;
    RawDeviceBuffer a(bytes), b(bytes);
    const double ms = median_ms([&] { KILN_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, nullptr)); }, 20);
    c.copy_gbs = 2.0 * double(bytes) / (ms * 1e-3) / 1e9;
  }
  {
    const int64_t n = 8192;
    DeviceBuffer<bf16> x(size_t(n * n)), w(size_t(n * n)), y(size_t(n * n));
    // Random values, not zeros: a GEMM of zeros toggles fewer bits and clocks higher.
    fill_random_bf16(x.data(), n * n, 1, 1, 0, 1.0f, nullptr);
    fill_random_bf16(w.data(), n * n, 1, 2, 0, 0.02f, nullptr);
    CublasGemm gemm;
    const double ms = median_ms([&] { gemm.gemm_bf16(x.data(), w.data(), y.data(), n, n, n, nullptr); }, 10);
    c.bf16_tflops = 2.0 * double(n) * double(n) * double(n) / (ms * 1e-3) / 1e12;
  }
  return c;
}

std::string ceilings_cache_path() {
  namespace fs = std::filesystem;
  fs::path base;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) {
    base = xdg;
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    base = fs::path(home) / ".cache";
  } else {
    base = fs::temp_directory_path();
  }
  return (base / "kiln" / "ceilings.json").string();
}

std::optional<Ceilings> load_cached_ceilings(const std::string& gpu) {
  std::ifstream in(ceilings_cache_path());
  if (!in) return std::nullopt;
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains(gpu) || !j[gpu].is_object()) return std::nullopt;
  const nlohmann::json& e = j[gpu];
  if (!e.contains("copy_gbs") || !e.contains("bf16_tflops") || !e["copy_gbs"].is_number() ||
      !e["bf16_tflops"].is_number())
    return std::nullopt;
  return Ceilings{gpu, e["copy_gbs"].get<double>(), e["bf16_tflops"].get<double>(), true};
}

void save_cached_ceilings(const Ceilings& c) {
  namespace fs = std::filesystem;
  const fs::path path = ceilings_cache_path();
  nlohmann::json j = nlohmann::json::object();
  if (std::ifstream in(path); in) {
    j = nlohmann::json::parse(in, nullptr, false);
    if (!j.is_object()) j = nlohmann::json::object();
  }
  j[c.gpu] = {{"copy_gbs", c.copy_gbs}, {"bf16_tflops", c.bf16_tflops}};
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  std::ofstream(path) << j.dump(2) << "\n";
}

Ceilings current_ceilings() {
  const std::string gpu = device_info().name;
  if (auto cached = load_cached_ceilings(gpu)) return *cached;
  return Ceilings{gpu, 4250, 700, false};
}

}  // namespace kiln::cuda
