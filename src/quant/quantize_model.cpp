#include "quant/quantize_model.h"

#include "core/check.h"
#include "core/dtype.h"
#include "quant/quantize.h"

namespace kiln::quant {

TargetType parse_target_type(std::string_view name) {
  for (TargetType t : {TargetType::bf16, TargetType::int8, TargetType::int4, TargetType::fp8})
    if (name == target_name(t)) return t;
  KILN_FAIL(invalid_argument, "--type must be int8, int4, fp8 or bf16, got '{}'", name);
}

std::string_view target_name(TargetType t) {
  switch (t) {
    case TargetType::bf16: return "bf16";
    case TargetType::int8: return "int8";
    case TargetType::int4: return "int4";
    case TargetType::fp8: return "fp8";
  }
  return "?";
}

void quantize_matrix(HostMatrix& m, TargetType t, int64_t int4_group) {
  switch (t) {
    case TargetType::bf16:
      for (float& v : m.data) v = round_to_bf16(v);
      m.quant = {};
      return;
    case TargetType::int8: m.quant = quantize_int8(m.data.data(), m.rows, m.cols); break;
    case TargetType::int4: {
      const int64_t group = int4_group_for(m.cols, int4_group);
      KILN_CHECK(group > 0, unsupported, "int4 needs rows whose length is a multiple of 32, not {}", m.cols);
      m.quant = quantize_int4(m.data.data(), m.rows, m.cols, group);
      break;
    }
    case TargetType::fp8: m.quant = quantize_fp8(m.data.data(), m.rows, m.cols); break;
  }
  dequantize(m.quant, m.data.data());
}

}  // namespace kiln::quant
