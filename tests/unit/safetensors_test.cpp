// The strict safetensors parser on files built in memory: a good file parses and converts; each
// kind of bad file (the reliability checklist's list) fails with its own invalid_model message,
// never a crash; every truncation fails; sharded sets resolve every tensor and refuse bad indexes.
#include <gtest/gtest.h>

#include "expect_error.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "core/dtype.h"
#include "kiln/error.h"
#include "model/safetensors/safetensors_file.h"

namespace kiln::safetensors {
namespace {

using Bytes = std::vector<uint8_t>;

// 8-byte LE size, header text, data bytes: exactly what it is told (bad files included).
Bytes build_raw(const std::string& header, const Bytes& data, uint64_t claimed_size = UINT64_MAX) {
  uint64_t n = claimed_size == UINT64_MAX ? header.size() : claimed_size;
  std::string raw(8, '\0');
  for (int i = 0; i < 8; ++i) raw[size_t(i)] = char(uint8_t(n >> (8 * i)));
  raw += header;
  raw.append(data.begin(), data.end());
  return Bytes(raw.begin(), raw.end());
}

Bytes f32_bytes(std::vector<float> v) {
  Bytes b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// A good file: "a" F32 [2,3] at 0..24, "b" BF16 [2] at 24..28, "c" F16 [1] at 28..30, metadata.
const std::string kGoodHeader =
    R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
    R"("b":{"dtype":"BF16","shape":[2],"data_offsets":[24,28]},"c":{"dtype":"F16","shape":[1],"data_offsets":[28,30]}})";

Bytes good_data() {
  Bytes d = f32_bytes({1, 2, 3, 4, 5, -6.5f});
  for (uint16_t h : {f32_to_bf16(1.5f), f32_to_bf16(-2.0f), f32_to_fp16(0.25f)}) {
    d.push_back(uint8_t(h));
    d.push_back(uint8_t(h >> 8));
  }
  return d;
}

void expect_error(const Bytes& bytes, const std::string& needle, Errc code = Errc::invalid_model) {
  test::expect_error([&] { SafetensorsFile::parse(bytes, "t.safetensors"); }, needle, code);
}

// One tensor "x" with the given fields, and `data_size` zero bytes of data.
Bytes one_tensor(const std::string& fields, size_t data_size) {
  return build_raw(R"({"x":{)" + fields + "}}", Bytes(data_size));
}

TEST(Safetensors, GoodFileParsesAndConverts) {
  Bytes bytes = build_raw(kGoodHeader, good_data());
  SafetensorsFile f = SafetensorsFile::parse(bytes);
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  const TensorInfo* a = f.find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->shape, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(a->shape_string(), "[2, 3]");
  EXPECT_EQ(a->n_elements, 6u);
  std::vector<float> out(6);
  to_f32(*a, out.data());
  EXPECT_EQ(out, (std::vector<float>{1, 2, 3, 4, 5, -6.5f}));
  to_f32(*a, out.data(), 4, 2);  // a row range
  EXPECT_EQ(out[0], 5.0f);
  EXPECT_EQ(out[1], -6.5f);
  to_f32(*f.find("b"), out.data());
  EXPECT_EQ(out[0], 1.5f);
  EXPECT_EQ(out[1], -2.0f);
  to_f32(*f.find("c"), out.data());
  EXPECT_EQ(out[0], 0.25f);
  EXPECT_EQ(f.find("missing"), nullptr);
}

TEST(Safetensors, HeaderPaddingAndEmptyFileAreFine) {
  // The format allows trailing spaces in the header; a file with no tensors has no data.
  EXPECT_EQ(SafetensorsFile::parse(build_raw(kGoodHeader + "        ", good_data())).tensors().size(), 3u);
  EXPECT_EQ(SafetensorsFile::parse(build_raw("{}", {})).tensors().size(), 0u);
  // A zero-element tensor occupies no bytes.
  auto f = SafetensorsFile::parse(one_tensor(R"("dtype":"F32","shape":[0,4],"data_offsets":[0,0])", 0));
  EXPECT_EQ(f.find("x")->n_elements, 0u);
}

TEST(Safetensors, TooShortForTheSize) { expect_error(Bytes{1, 0, 0}, "too short"); }

TEST(Safetensors, HeaderOver100MB) {
  expect_error(build_raw("{}", {}, 100'000'001), "exceeds the 100 MB limit");
  expect_error(build_raw("{}", {}, UINT64_MAX - 1), "exceeds the 100 MB limit");
}

TEST(Safetensors, HeaderPastEndOfFile) { expect_error(build_raw("{}", {}, 3000), "runs past the end of the file"); }

TEST(Safetensors, HeaderNotUtf8) {
  expect_error(build_raw("{\"\xff\":{}}", {}), "not valid UTF-8");
  expect_error(build_raw("{\"\xc0\xaf\":{}}", {}), "not valid UTF-8");          // overlong '/'
  expect_error(build_raw("{\"\xed\xa0\x80\":{}}", {}), "not valid UTF-8");      // a surrogate
  expect_error(build_raw("{\"\xe2\x82\":{}}", {}), "not valid UTF-8");          // cut short
  EXPECT_NO_THROW(SafetensorsFile::parse(build_raw("{\"__metadata__\":{\"k\":\"\xc3\xa9\xf0\x9f\x98\x80\"}}", {})));
}

TEST(Safetensors, HeaderNotAnObject) {
  expect_error(build_raw("[1,2]", {}), "not an object");
  expect_error(build_raw("\"text\"", {}), "not an object");
  expect_error(build_raw("{\"x\":", {}), "not valid JSON");
  expect_error(build_raw("", {}), "not valid JSON");
}

TEST(Safetensors, DuplicateNames) {
  std::string h = R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                  R"("x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  expect_error(build_raw(h, Bytes(8)), "has the key 'x' twice");
  // A duplicate field inside one tensor's description is just as ambiguous.
  expect_error(one_tensor(R"("dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4])", 4),
               "has the key 'dtype' twice");
  // The same field name in two different objects is fine (that is every file).
}

TEST(Safetensors, OffsetsMustTileTheData) {
  std::string two = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[%A]},"b":{"dtype":"F32","shape":[1],"data_offsets":[%B]}})";
  auto make = [&](const std::string& a, const std::string& b, size_t n) {
    std::string h = two;
    h.replace(h.find("%A"), 2, a);
    h.replace(h.find("%B"), 2, b);
    return build_raw(h, Bytes(n));
  };
  EXPECT_NO_THROW(SafetensorsFile::parse(make("4,8", "0,4", 8)));  // any order is fine
  expect_error(make("0,4", "8,12", 12), "a gap of 4 bytes before tensor 'b'");
  expect_error(make("4,8", "8,12", 12), "a gap of 4 bytes before tensor 'a'");
  expect_error(make("0,4", "2,6", 8), "overlaps");
  expect_error(make("0,4", "0,4", 4), "overlaps");
  expect_error(make("0,4", "4,8", 10), "2 trailing bytes after the last tensor");
  expect_error(make("0,4", "4,8", 7), "past its end");
}

TEST(Safetensors, ByteSizeMustMatchShape) {
  expect_error(one_tensor(R"("dtype":"F32","shape":[2,3],"data_offsets":[0,20])", 20),
               "tensor 'x' has 20 bytes but shape [2, 3] of F32 needs 24");
  expect_error(one_tensor(R"("dtype":"BF16","shape":[3],"data_offsets":[0,12])", 12), "needs 6");
  expect_error(one_tensor(R"("dtype":"F32","shape":[2],"data_offsets":[8,0])", 8), "end < begin");
}

TEST(Safetensors, ShapeProductOverflow) {
  // 2^32 * 2^32 elements overflows; 2^62 elements x 4 bytes overflows only at the byte size.
  expect_error(one_tensor(R"("dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0])", 0),
               "overflows 64 bits");
  expect_error(one_tensor(R"("dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0])", 0),
               "overflows 64 bits");
  // A product that wraps exactly to 0 must not pass as an empty tensor.
  expect_error(one_tensor(R"("dtype":"U8","shape":[4294967296,4294967296,0],"data_offsets":[0,0])", 0),
               "overflows 64 bits");
}

TEST(Safetensors, MalformedTensorEntries) {
  expect_error(one_tensor(R"("dtype":"F32","shape":[-1],"data_offsets":[0,0])", 0), "not a non-negative integer");
  expect_error(one_tensor(R"("dtype":"F32","shape":[1.5],"data_offsets":[0,0])", 0), "not a non-negative integer");
  expect_error(one_tensor(R"("dtype":"F32","shape":2,"data_offsets":[0,8])", 8), "no 'shape' array");
  expect_error(one_tensor(R"("shape":[1],"data_offsets":[0,4])", 4), "no string 'dtype'");
  expect_error(one_tensor(R"("dtype":"F32","shape":[1],"data_offsets":[0])", 4), "data_offsets");
  expect_error(one_tensor(R"("dtype":"F32","shape":[1],"data_offsets":[-4,0])", 4), "data_offsets");
  expect_error(one_tensor(R"("dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":1)", 4), "unknown field 'extra'");
  expect_error(one_tensor(R"("dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4])", 4), "9 dimensions");
  expect_error(build_raw(R"({"x":[1,2]})", {}), "not an object");
}

TEST(Safetensors, Metadata) {
  expect_error(build_raw(R"({"__metadata__":{"n":1}})", {}), "metadata values must be strings");
  expect_error(build_raw(R"({"__metadata__":[]})", {}), "__metadata__ is a array");
}

TEST(Safetensors, UnsupportedDtypes) {
  // Unknown names cannot even be sized.
  expect_error(one_tensor(R"("dtype":"Q4","shape":[1],"data_offsets":[0,1])", 1), "dtype 'Q4'", Errc::unsupported);
  // Known but not loadable as weights: parses (so the file validates), fails at conversion.
  SafetensorsFile f = SafetensorsFile::parse(one_tensor(R"("dtype":"I64","shape":[2],"data_offsets":[0,16])", 16));
  float out[2];
  try {
    to_f32(*f.find("x"), out);
    ADD_FAILURE() << "converted an I64 tensor";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::unsupported);
    EXPECT_NE(std::string(e.what()).find("dtype I64"), std::string::npos) << e.what();
  }
}

TEST(Safetensors, EveryTruncationFails) {
  Bytes full = build_raw(kGoodHeader, good_data());
  for (size_t n = 0; n < full.size(); ++n) {
    Bytes cut(full.begin(), full.begin() + ptrdiff_t(n));
    EXPECT_THROW(SafetensorsFile::parse(cut), Error) << "prefix of " << n << " bytes";
  }
}

TEST(Safetensors, RandomByteFlipsNeverCrash) {
  Bytes full = build_raw(kGoodHeader, good_data());
  uint32_t state = 12345;
  for (int iter = 0; iter < 3000; ++iter) {
    Bytes b = full;
    for (int k = 0; k < 3; ++k) {
      state = state * 1664525u + 1013904223u;
      b[(state >> 8) % b.size()] = uint8_t(state >> 24);
    }
    try {
      SafetensorsFile f = SafetensorsFile::parse(b);
      for (const auto& t : f.tensors()) {
        if (t.dtype != DType::F32 && t.dtype != DType::F16 && t.dtype != DType::BF16) continue;
        std::vector<float> out(t.n_elements);
        to_f32(t, out.data());
      }
    } catch (const Error&) {
    }
  }
}

// ---- sharded sets -------------------------------------------------------------------------

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    path = std::filesystem::temp_directory_path() /
           ("kiln_st_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string write(const std::string& name, const Bytes& bytes) const {
    std::ofstream out(path / name, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    return (path / name).string();
  }
  std::string write(const std::string& name, const std::string& text) const {
    return write(name, Bytes(text.begin(), text.end()));
  }
};

Bytes shard(const std::string& name, float value) {
  return build_raw(R"({")" + name + R"(":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", f32_bytes({value}));
}

TEST(SafetensorsSharded, ResolvesEveryTensor) {
  TempDir d;
  d.write("m-1.safetensors", shard("a", 1.0f));
  d.write("m-2.safetensors", shard("b", 2.0f));
  std::string idx = d.write("model.safetensors.index.json",
                            R"({"metadata":{"total_size":8},"weight_map":{"a":"m-1.safetensors","b":"m-2.safetensors"}})");
  TensorSet s = TensorSet::open_index(idx);
  EXPECT_EQ(s.n_files(), 2u);
  EXPECT_EQ(s.names(), (std::vector<std::string>{"a", "b"}));
  float v = 0;
  to_f32(*s.find("b"), &v);
  EXPECT_EQ(v, 2.0f);
  EXPECT_EQ(s.find("c"), nullptr);
}

void expect_index_error(const TempDir& d, const std::string& index, const std::string& needle,
                        Errc code = Errc::invalid_model) {
  std::string idx = d.write("model.safetensors.index.json", index);
  try {
    TensorSet::open_index(idx);
    ADD_FAILURE() << "opened, but should fail with '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
    EXPECT_EQ(e.code(), code) << e.what();
  }
}

TEST(SafetensorsSharded, BadIndexes) {
  TempDir d;
  d.write("m-1.safetensors", shard("a", 1.0f));
  d.write("m-2.safetensors", shard("a", 2.0f));
  expect_index_error(d, R"({"weight_map":{"a":"m-1.safetensors","b":"m-1.safetensors"}})",
                     "puts tensor 'b' in");
  expect_index_error(d, R"({"weight_map":{"a":"m-1.safetensors","x":"m-2.safetensors"}})", "in two shards");
  expect_index_error(d, R"({"weight_map":{"a":"../m-1.safetensors"}})", "plain file name");
  expect_index_error(d, R"({"weight_map":{"a":"missing.safetensors"}})", "does not exist", Errc::io);
  expect_index_error(d, R"({"weight_map":{"a":1}})", "not a file name");
  expect_index_error(d, R"({"metadata":{}})", "no 'weight_map'");
  expect_index_error(d, R"({"weight_map":{"a":"m-1.safetensors","a":"m-2.safetensors"}})", "twice");
  d.write("bad.safetensors", build_raw("{}", {}, 99));
  expect_index_error(d, R"({"weight_map":{"a":"bad.safetensors"}})", "runs past the end");
}

}  // namespace
}  // namespace kiln::safetensors
