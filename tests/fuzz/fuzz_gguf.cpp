// libFuzzer target for the GGUF reader: any input must parse or throw kiln::Error, and a parsed
// file must be safe to use: every tensor's data range readable, config and weights loadable or
// rejected with kiln::Error, and its tokenizer (tokenizer.ggml.*) built or rejected the same way,
// a built one then encoding and decoding a fixed text. Built with ASan+UBSan (scripts/fuzz.sh) so an out-of-range read, UB
// or an allocation over -malloc_limit_mb is a crash.
//
// `fuzz_gguf --write-seeds DIR` writes a few valid files (the seed corpus) and exits.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <span>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/thread_pool.h"
#include "gguf_builder.h"
#include "kiln/error.h"
#include "model/gguf/gguf_file.h"
#include "model/gguf/gguf_model.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace kiln::gguf::testing;

// Reads every byte of every tensor: ASan reports a range that leaves the input.
uint8_t touch_tensor_data(const kiln::gguf::GgufFile& f) {
  uint8_t acc = 0;
  for (const auto& t : f.tensors())
    for (uint64_t i = 0; i < t.n_bytes; ++i) acc ^= t.data[i];
  return acc;
}

GgufBuilder every_kind_of_value() {
  GgufBuilder b;
  b.kv_u8("a", 1).kv_i8("b", -1).kv_u16("c", 2).kv_i16("d", -2).kv_u32("e", 3).kv_i32("f", -3);
  b.kv_f32("g", 0.5f).kv_bool("h", true).kv_string("i", "str").kv_u64("j", 4).kv_i64("k", -4).kv_f64("l", 0.25);
  b.kv_array<uint32_t>("m", vt::U32, {1, 2}).kv_string_array("n", {"x", "yz"});
  b.kv_array<uint8_t>("o", vt::BOOL, {0, 1}).kv_array<double>("p", vt::F64, {1.0});
  // One tensor of each type kiln dequantizes, one block each.
  b.tensor("f32", {2}, gt::F32, Bytes(8, 0x3f));
  b.tensor("f16", {2}, gt::F16, Bytes{0x00, 0x3c, 0x00, 0xc0});
  b.tensor("bf16", {2}, gt::BF16, Bytes{0x80, 0x3f, 0x80, 0xbf});
  b.tensor("q8_0", {32}, gt::Q8_0, Bytes(34, 0x11));
  b.tensor("q4_0", {32, 1}, gt::Q4_0, Bytes(18, 0x22));
  b.tensor("q4_1", {32, 1, 1}, gt::Q4_1, Bytes(20, 0x33));
  b.tensor("q4_k", {256}, gt::Q4_K, Bytes(144, 0x44));
  b.tensor("q6_k", {256, 1, 1, 1}, gt::Q6_K, Bytes(210, 0x55));
  return b;
}

void write_file(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

// Tokenizer-only files: byte-level BPE (256 byte tokens, <|im_end|>, merges "a b" and "ab c") and
// SentencePiece BPE (<unk> <s> </s>, 256 byte tokens, a few pieces with scores).
GgufBuilder bpe_tokenizer() {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  for (int b = 0; b < 256; ++b) {
    tokens.emplace_back(kiln::byte_level::spell_byte(uint8_t(b)));
    types.push_back(1);
  }
  for (const char* t : {"<|im_end|>", "ab", "abc"}) tokens.emplace_back(t);
  types.insert(types.end(), {3, 1, 1});
  GgufBuilder b;
  b.kv_string("tokenizer.ggml.model", "gpt2").kv_string("tokenizer.ggml.pre", "smollm");
  b.kv_string_array("tokenizer.ggml.tokens", tokens).kv_array("tokenizer.ggml.token_type", vt::I32, types);
  b.kv_string_array("tokenizer.ggml.merges", {"a b", "ab c"}).kv_u32("tokenizer.ggml.eos_token_id", 256);
  return b;
}

GgufBuilder spm_tokenizer() {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    tokens.emplace_back(name);
    types.push_back(6);
  }
  for (const char* t : {"\xe2\x96\x81", "a", "b", "\xe2\x96\x81" "a", "ab", "\xe2\x96\x81" "ab"}) {
    tokens.emplace_back(t);
    types.push_back(1);
  }
  std::vector<float> scores(tokens.size(), 0.0f);
  for (size_t i = 259; i < scores.size(); ++i) scores[i] = -float(i - 258);
  GgufBuilder b;
  b.kv_string("tokenizer.ggml.model", "llama").kv_string_array("tokenizer.ggml.tokens", tokens);
  b.kv_array("tokenizer.ggml.token_type", vt::I32, types).kv_array("tokenizer.ggml.scores", vt::F32, scores);
  b.kv_u32("tokenizer.ggml.unknown_token_id", 0).kv_u32("tokenizer.ggml.bos_token_id", 1);
  b.kv_u32("tokenizer.ggml.eos_token_id", 2);
  return b;
}

// Encodes and decodes a fixed text with the file's tokenizer, when it has one that builds.
void use_tokenizer(const kiln::gguf::GgufFile& f) {
  static const std::string text = "ab abc a\xc3\xa9 <|im_end|><s> 12\n\xf0\x9f\x99\x82\xff";
  const std::unique_ptr<kiln::Tokenizer> t = kiln::Tokenizer::from_gguf(f);
  for (const bool parse_special : {false, true}) {
    const std::vector<int32_t> ids = t->encode(text, true, parse_special);
    for (int32_t id : ids)
      if (id < 0 || id >= t->vocab_size()) __builtin_trap();  // encode must give ids of the vocabulary
    (void)t->decode(ids);
  }
}

void write_seeds(const std::string& dir) {
  // Small dimensions keep each model seed a few KB, so libFuzzer mutates them quickly.
  TinyModel llama{.vocab = 4, .hidden = 8, .intermediate = 16, .layers = 1, .heads = 2, .kv_heads = 1, .context = 16};
  TinyModel qwen = llama;
  qwen.arch = "qwen2";
  qwen.qkv_bias = true;
  qwen.tied = true;
  GgufBuilder aligned = every_kind_of_value();
  write_file(dir + "/values.gguf", every_kind_of_value().build());
  write_file(dir + "/values_v2_align64.gguf", aligned.version(2).alignment(64).build());
  write_file(dir + "/llama.gguf", tiny_model(llama).build());
  write_file(dir + "/qwen2.gguf", tiny_model(qwen).build());
  write_file(dir + "/header_only.gguf", GgufBuilder().build());
  for (auto [name, builder] : {std::pair{"tokenizer_bpe.gguf", bpe_tokenizer()}, {"tokenizer_spm.gguf", spm_tokenizer()}}) {
    const Bytes bytes = builder.build();
    use_tokenizer(kiln::gguf::GgufFile::parse(std::span<const uint8_t>(bytes)));  // a seed must build
    write_file(dir + "/" + name, bytes);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  // libFuzzer calls this before reading its own flags, so the seed writer needs no second binary.
  if (*argc >= 3 && std::strcmp((*argv)[1], "--write-seeds") == 0) {
    write_seeds((*argv)[2]);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static kiln::ThreadPool pool(1);
  try {
    kiln::gguf::GgufFile f = kiln::gguf::GgufFile::parse(std::span<const uint8_t>(data, size));
    volatile uint8_t sink = touch_tensor_data(f);
    (void)sink;
    try {
      use_tokenizer(f);
    } catch (const kiln::Error&) {
    }
    kiln::ModelConfig config = kiln::gguf::config_from_gguf(f);
    kiln::gguf::weights_from_gguf(f, config, pool);
  } catch (const kiln::Error&) {
    // Rejecting a bad file is the expected outcome; anything else escapes and aborts.
  }
  return 0;
}
