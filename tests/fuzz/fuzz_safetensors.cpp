// libFuzzer target on the safetensors header parser (src/model/safetensors): any input must either
// parse or throw kiln::Error; a parsed file's tensors are then converted to fp32 (a bounded prefix
// of each), which touches exactly the byte ranges the header claimed.
//   fuzz_safetensors --write-seeds DIR   writes a few valid files to start from.
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "kiln/error.h"
#include "model/safetensors/safetensors_file.h"

namespace {

std::string make_file(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  out += header;
  for (size_t i = 0; i < data_bytes; ++i) out.push_back(char(i * 37 + 11));
  return out;
}

void write_seeds(const std::string& dir) {
  const std::vector<std::pair<std::string, size_t>> seeds = {
      {R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})", 24},
      {R"({"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]},"b":{"dtype":"F16","shape":[2,2],"data_offsets":[8,16]}})", 16},
      {R"({"x":{"dtype":"I8","shape":[5],"data_offsets":[0,5]},"y":{"dtype":"F32","shape":[],"data_offsets":[5,9]}})", 9},
  };
  int i = 0;
  for (const auto& [header, bytes] : seeds) {
    std::ofstream out(dir + "/seed" + std::to_string(i++) + ".safetensors", std::ios::binary);
    out << make_file(header, bytes);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  if (*argc >= 3 && std::string((*argv)[1]) == "--write-seeds") {
    write_seeds((*argv)[2]);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto file = kiln::safetensors::SafetensorsFile::parse({data, size});
    std::vector<float> out(256);
    for (const auto& t : file.tensors()) {
      try {
        kiln::safetensors::to_f32(t, out.data(), 0, std::min<uint64_t>(t.n_elements, out.size()));
      } catch (const kiln::Error&) {
      }
    }
  } catch (const kiln::Error&) {
  }
  return 0;
}
