#include "backend/cuda/device_weight.h"

#include <vector>

#include "core/check.h"
#include "core/dtype.h"
#include "kernels/cuda/random_fill.h"

namespace kiln::cuda {
namespace {

// The offset qgemv adds to every quantized value (qmatmul.h): min' = min - off * scale.
float value_offset(QuantFormat f) { return f == QuantFormat::int4 ? 128.0f : 2304.0f; }

bool quantized_together(std::initializer_list<const HostMatrix*> parts) {
  const HostMatrix* first = *parts.begin();
  const QuantizedMatrix& q0 = first->quant;
  if (q0.empty()) return false;
  for (const HostMatrix* m : parts) {
    const QuantizedMatrix& q = m->quant;
    if (q.format != q0.format || q.group_size != q0.group_size || q.cols != q0.cols) return false;
  }
  return qweight_packable(q0.format, q0.cols, q0.group_size);
}

DeviceWeight upload_bf16(std::initializer_list<const HostMatrix*> parts) {
  DeviceWeight w;
  std::vector<uint16_t> host;
  for (const HostMatrix* m : parts) {
    KILN_CHECK(w.cols == 0 || m->cols == w.cols, internal, "stacked matrices differ in columns");
    w.cols = m->cols;
    w.rows += m->rows;
    for (float f : m->data) host.push_back(f32_to_bf16(f));
  }
  w.group = w.cols;
  w.data = DeviceBuffer<uint8_t>(host.size() * 2);
  if (!host.empty())
    w.data.upload(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(host.data()), host.size() * 2));
  return w;
}

}  // namespace

DeviceWeight upload_weight(std::initializer_list<const HostMatrix*> parts) {
  if (parts.size() == 0 || !quantized_together(parts)) return upload_bf16(parts);
  const QuantizedMatrix& q0 = (*parts.begin())->quant;
  DeviceWeight w;
  w.format = q0.format;
  w.cols = q0.cols;
  w.group = q0.group_size;
  const int64_t groups = q0.groups();
  std::vector<uint8_t> raw;
  std::vector<float> scales;
  for (const HostMatrix* m : parts) {
    const QuantizedMatrix& q = m->quant;
    KILN_CHECK(q.rows == m->rows && q.cols == m->cols, invalid_model, "quantized form of a {}x{} matrix is {}x{}",
               m->rows, m->cols, q.rows, q.cols);
    KILN_CHECK(int64_t(q.q.size()) == qweight_data_bytes(q.format, q.rows, q.cols) &&
                   int64_t(q.scales.size()) == q.rows * groups &&
                   (q.format != QuantFormat::int4 || q.mins.size() == q.scales.size()),
               invalid_model, "quantized matrix ({}x{}) has inconsistent sizes", q.rows, q.cols);
    raw.insert(raw.end(), q.q.begin(), q.q.end());
    if (q.format == QuantFormat::fp8) {
      scales.insert(scales.end(), q.scales.begin(), q.scales.end());  // group == cols: one per row
    } else {
      const float off = value_offset(q.format);
      for (size_t i = 0; i < q.scales.size(); ++i) {
        const float s = q.scales[i], mn = q.format == QuantFormat::int4 ? q.mins[i] : 0.0f;
        scales.push_back(s);
        scales.push_back(mn - off * s);
      }
    }
    w.rows += q.rows;
  }
  DeviceBuffer<uint8_t> staging(raw.size());
  staging.upload(raw);
  w.data = DeviceBuffer<uint8_t>(size_t(qweight_data_bytes(w.format, w.rows, w.cols)));
  pack_quantized(w.format, staging.data(), w.rows, w.cols, w.data.data(), nullptr);
  w.scales = DeviceBuffer<float>(scales);
  cuda_synchronize();  // staging is freed on return
  return w;
}

DeviceWeight random_weight(QuantFormat format, int64_t cols, std::initializer_list<std::pair<uint64_t, int64_t>> parts,
                           uint64_t seed, float scale, cudaStream_t stream) {
  DeviceWeight w;
  w.cols = cols;
  for (auto& p : parts) w.rows += p.second;
  const int64_t group = format == QuantFormat::int4 ? 128 : cols;
  if (format != QuantFormat::none && !qweight_packable(format, cols, group)) format = QuantFormat::none;
  w.format = format;
  w.group = format == QuantFormat::none ? cols : group;
  w.data = DeviceBuffer<uint8_t>(size_t(qweight_data_bytes(format, w.rows, cols)));
  if (format == QuantFormat::none) {
    bf16* dst = reinterpret_cast<bf16*>(w.data.data());
    int64_t at = 0;
    for (auto& p : parts) {
      fill_random_bf16(dst + at, p.second * cols, seed, p.first, 0, scale, stream);
      at += p.second * cols;
    }
    return w;
  }
  w.scales = DeviceBuffer<float>(size_t(qweight_scale_floats(format, w.rows, cols, group)));
  fill_random_qweight(format, w.rows, cols, group, w.data.data(), w.scales.data(), seed, parts.begin()->first, scale,
                      stream);
  return w;
}

}  // namespace kiln::cuda
