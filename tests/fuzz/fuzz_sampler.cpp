// libFuzzer target on the CPU sampler (src/runtime/sampler.h), the reference the device sampler is
// tested against: the input supplies the sampling parameters, a row of logits (NaN and infinities
// included, as a diverging model can produce) and a history. Parameters validate() refuses and an
// all-NaN row throw kiln::Error; otherwise the token drawn must be in the vocabulary, must not be a
// NaN logit, and at temperature 0 must be the argmax.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kiln/error.h"
#include "runtime/sampler.h"

namespace {

struct Reader {
  const uint8_t* p;
  size_t n;
  template <typename T>
  T take() {
    T v{};
    const size_t k = n < sizeof(T) ? n : sizeof(T);
    std::memcpy(&v, p, k);
    p += k;
    n -= k;
    return v;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Reader r{data, size};
  kiln::SamplingParams params;
  params.temperature = r.take<float>();
  params.top_k = r.take<int32_t>();
  params.top_p = r.take<float>();
  params.min_p = r.take<float>();
  params.repetition_penalty = r.take<float>();
  params.presence_penalty = r.take<float>();
  params.frequency_penalty = r.take<float>();
  params.penalty_last_n = r.take<int32_t>();
  params.seed = r.take<uint64_t>();
  const size_t vocab = 1 + r.take<uint8_t>() % 64;
  std::vector<float> logits(vocab);
  for (float& l : logits) l = r.take<float>();
  std::vector<int32_t> history;
  while (r.n >= sizeof(int32_t) && history.size() < 256) history.push_back(r.take<int32_t>());

  const std::vector<float> original = logits;
  try {
    kiln::Sampler sampler(params);
    const int32_t token = sampler.sample(logits, history);
    if (token < 0 || size_t(token) >= vocab || std::isnan(original[size_t(token)])) __builtin_trap();
    if (params.temperature <= 0 && token != kiln::Sampler::argmax(logits)) __builtin_trap();
  } catch (const kiln::Error&) {
  }
  return 0;
}
