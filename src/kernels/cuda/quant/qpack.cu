// The device layouts of quantized weights (qmatmul.h): which shapes pack, their sizes, the packing
// kernel (raw QuantizedMatrix bytes -> layout), random packed weights for speed runs, and the
// dequantization to bf16 that the int8/int4 prefill path multiplies with.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"
#include "kernels/cuda/quant/qmatmul.h"
#include "model/random_weights.h"

namespace kiln::cuda {

bool qweight_packable(QuantFormat format, int64_t cols, int64_t group) {
  if (cols <= 0 || group <= 0 || cols % group != 0) return false;
  switch (format) {
    case QuantFormat::int4: return cols % 128 == 0 && (group == 32 || group % 128 == 0);
    case QuantFormat::int8: return cols % 64 == 0 && (group == 32 || group % 64 == 0);
    case QuantFormat::fp8: return cols % 16 == 0 && group == cols;
    default: return false;
  }
}

int64_t qweight_data_bytes(QuantFormat format, int64_t rows, int64_t cols) {
  switch (format) {
    case QuantFormat::int4: return rows * cols / 2;
    case QuantFormat::int8:
    case QuantFormat::fp8: return rows * cols;
    default: return rows * cols * 2;
  }
}

int64_t qweight_scale_floats(QuantFormat format, int64_t rows, int64_t cols, int64_t group) {
  if (format == QuantFormat::fp8) return rows;
  if (format == QuantFormat::int8 || format == QuantFormat::int4) return 2 * rows * (cols / group);
  return 0;
}

double qweight_bytes_per_weight(QuantFormat format, int64_t cols, int64_t group) {
  if (format == QuantFormat::none) return 2.0;
  const double data = format == QuantFormat::int4 ? 0.5 : 1.0;
  return data + 4.0 * double(qweight_scale_floats(format, 1, cols, group)) / double(cols);
}

namespace {

unsigned grid_for(int64_t n) {
  int64_t blocks = (n + 255) / 256;
  return unsigned(blocks < 132 * 32 ? blocks : 132 * 32);
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

// int8: the byte of a word that holds element i = 0..3 ({0, 2, 1, 3}).
__device__ __forceinline__ int byte_pos(int i) { return ((i & 1) << 1) | (i >> 1); }

// One packed 32-bit word per thread. Word index w of a row: super-chunk w / 16, lane t = w / 4 % 4,
// word j = w % 4 (qmatmul.h).
__global__ void pack_int4_kernel(const uint8_t* __restrict__ raw, int64_t rows, int64_t cols,
                                 uint32_t* __restrict__ dst) {
  const int64_t words_per_row = cols / 8, total = rows * words_per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / words_per_row, w = i % words_per_row;
    const int64_t k0 = (w / 16) * 128 + 32 * (w % 4) + 8 * (w / 4 % 4);
    const uint8_t* r = raw + row * (cols / 2);
    uint32_t out = 0;
#pragma unroll
    for (int i8 = 0; i8 < 8; ++i8) {
      const int64_t k = k0 + i8;
      const uint32_t nib = (r[k / 2] >> (4 * (k & 1))) & 0xFu;
      const int p = (i8 & 1) ? 4 + i8 / 2 : i8 / 2;
      out |= nib << (4 * p);
    }
    dst[i] = out;
  }
}

__global__ void pack_int8_kernel(const uint8_t* __restrict__ raw, int64_t rows, int64_t cols,
                                 uint32_t* __restrict__ dst) {
  const int64_t words_per_row = cols / 4, total = rows * words_per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / words_per_row, w = i % words_per_row;
    const int j = int(w % 4), t = int(w / 4 % 4);
    const int64_t k0 = (w / 16) * 64 + 32 * (j / 2) + 8 * t + 4 * (j % 2);
    const uint8_t* r = raw + row * cols;
    uint32_t out = 0;
#pragma unroll
    for (int i4 = 0; i4 < 4; ++i4) out |= uint32_t(r[k0 + i4] ^ 0x80u) << (8 * byte_pos(i4));
    dst[i] = out;
  }
}

__global__ void random_bytes_kernel(uint32_t* __restrict__ dst, int64_t words, uint64_t seed, uint64_t stream,
                                    bool fp8) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < words; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t v = uint32_t(kiln::splitmix64(kiln::splitmix64(seed ^ (stream * 0xd1b54a32d192ed03ull)) + uint64_t(i)));
    if (fp8) {
      // e4m3 NaN is S.1111.111 (0x7F / 0xFF): turn it into +-448 (0x7E / 0xFE).
#pragma unroll
      for (int b = 0; b < 4; ++b)
        if (((v >> (8 * b)) & 0x7Fu) == 0x7Fu) v ^= 1u << (8 * b);
    }
    dst[i] = v;
  }
}

// Scales for random weights: int formats {scale, min'} with values q * scale + min spanning about
// +-amplitude; fp8 one scale per row (e4m3 values up to 448).
__global__ void random_scales_kernel(float* __restrict__ s, int64_t n, QuantFormat format, uint64_t seed,
                                     uint64_t stream, float amplitude) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float u = 0.75f + 0.25f * kiln::random_uniform(seed, stream ^ 0x5ca1e5ull, uint64_t(i));  // 0.5 .. 1
    if (format == QuantFormat::fp8) {
      s[i] = amplitude * u / 448.0f;
    } else if (format == QuantFormat::int8) {
      const float sc = amplitude * u / 127.0f;
      s[2 * i] = sc;
      s[2 * i + 1] = -2304.0f * sc;  // min 0 (symmetric)
    } else {
      const float sc = amplitude * u / 7.5f;
      s[2 * i] = sc;
      s[2 * i + 1] = -7.5f * sc - 128.0f * sc;  // min = -7.5 scale
    }
  }
}

// One packed 32-bit word per thread (int4: 8 consecutive k, one 16-byte store; int8 / fp8: 4, one
// 8-byte store), 32-bit index math (the first version divided 64-bit indices per element and ran
// gate_up's dequantization at ~0.5 ms instead of ~0.08). Value = (off + q) * scale + min' (= q * scale
// + min), rounded to bf16.
__global__ void dequant_kernel(const uint32_t* __restrict__ q, const float* __restrict__ scales, QuantFormat format,
                               uint32_t rows, uint32_t cols, uint32_t group, bf16* __restrict__ dst) {
  const uint32_t per_word = format == QuantFormat::int4 ? 8 : 4;
  const uint32_t words_per_row = cols / per_word, groups = cols / group;
  const uint64_t total = uint64_t(rows) * words_per_row;
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < total; i += uint64_t(gridDim.x) * blockDim.x) {
    const uint32_t row = uint32_t(i / words_per_row), w = uint32_t(i % words_per_row);
    const uint32_t word = q[i];
    float v[8];
    uint32_t k0;
    if (format == QuantFormat::fp8) {
      k0 = 4 * w;
      const float s = scales[row];
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        __nv_fp8_e4m3 e;
        e.__x = uint8_t(word >> (8 * b));
        v[b] = float(e) * s;
      }
    } else if (format == QuantFormat::int4) {
      k0 = (w / 16) * 128 + 32 * (w % 4) + 8 * (w / 4 % 4);
      const float2 sm = reinterpret_cast<const float2*>(scales)[size_t(row) * groups + k0 / group];
#pragma unroll
      for (int i8 = 0; i8 < 8; ++i8) {
        const int p = (i8 & 1) ? 4 + i8 / 2 : i8 / 2;
        v[i8] = fmaf(float(128u + ((word >> (4 * p)) & 0xFu)), sm.x, sm.y);
      }
    } else {
      const uint32_t j = w % 4, t = w / 4 % 4;
      k0 = (w / 16) * 64 + 32 * (j / 2) + 8 * t + 4 * (j % 2);
      const float2 sm = reinterpret_cast<const float2*>(scales)[size_t(row) * groups + k0 / group];
#pragma unroll
      for (int i4 = 0; i4 < 4; ++i4)
        v[i4] = fmaf(float(2176u + ((word >> (8 * byte_pos(i4))) & 0xFFu)), sm.x, sm.y);  // off + q = 2304 + u - 128
    }
    bf16* out = dst + size_t(row) * cols + k0;
    if (per_word == 8) {
      uint4 o;
      o.x = pack_bf16x2(v[0], v[1]);
      o.y = pack_bf16x2(v[2], v[3]);
      o.z = pack_bf16x2(v[4], v[5]);
      o.w = pack_bf16x2(v[6], v[7]);
      *reinterpret_cast<uint4*>(out) = o;
    } else {
      *reinterpret_cast<uint2*>(out) = make_uint2(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]));
    }
  }
}

}  // namespace

void pack_quantized(QuantFormat format, const uint8_t* raw, int64_t rows, int64_t cols, uint8_t* dst,
                    cudaStream_t stream) {
  const int64_t bytes = qweight_data_bytes(format, rows, cols);
  if (bytes == 0) return;
  if (format == QuantFormat::int4)
    pack_int4_kernel<<<grid_for(bytes / 4), 256, 0, stream>>>(raw, rows, cols, reinterpret_cast<uint32_t*>(dst));
  else if (format == QuantFormat::int8)
    pack_int8_kernel<<<grid_for(bytes / 4), 256, 0, stream>>>(raw, rows, cols, reinterpret_cast<uint32_t*>(dst));
  else
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, raw, size_t(bytes), cudaMemcpyDeviceToDevice, stream));
  KILN_CUDA_CHECK_LAUNCH();
}

void fill_random_qweight(QuantFormat format, int64_t rows, int64_t cols, int64_t group, uint8_t* data, float* scales,
                         uint64_t seed, uint64_t stream_id, float amplitude, cudaStream_t stream) {
  const int64_t words = qweight_data_bytes(format, rows, cols) / 4;
  if (words > 0)
    random_bytes_kernel<<<grid_for(words), 256, 0, stream>>>(reinterpret_cast<uint32_t*>(data), words, seed,
                                                             stream_id, format == QuantFormat::fp8);
  const int64_t n_scales = format == QuantFormat::fp8 ? rows : rows * (cols / group);
  if (n_scales > 0)
    random_scales_kernel<<<grid_for(n_scales), 256, 0, stream>>>(scales, n_scales, format, seed, stream_id, amplitude);
  KILN_CUDA_CHECK_LAUNCH();
}

void dequantize_to_bf16(const QWeight& w, bf16* dst, cudaStream_t stream) {
  KILN_CUDA_REQUIRE(w.format != QuantFormat::none && qweight_packable(w.format, w.cols, w.group),
                    "dequantize_to_bf16: a packed quantized weight");
  const int64_t words = qweight_data_bytes(w.format, w.rows, w.cols) / 4;
  if (words == 0) return;
  KILN_CUDA_REQUIRE(w.rows < (int64_t(1) << 32) && w.cols < (int64_t(1) << 32), "dequantize_to_bf16: shape too large");
  dequant_kernel<<<grid_for(words), 256, 0, stream>>>(static_cast<const uint32_t*>(w.data), w.scales, w.format,
                                                      uint32_t(w.rows), uint32_t(w.cols), uint32_t(w.group), dst);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
