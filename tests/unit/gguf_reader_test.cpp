// GgufFile::parse on good files (v2, v3, every value type, custom alignment) and on a corpus of bad
// ones, each built as a good file with one thing broken. Every bad file must give a kiln::Error
// whose message names the problem: never a crash, another exception type, or a huge allocation.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <span>
#include <string>

#include "gguf_builder.h"
#include "kiln/error.h"
#include "model/gguf/gguf_file.h"

namespace kiln::gguf {
namespace {

using namespace kiln::gguf::testing;

GgufFile parse(const Bytes& b) { return GgufFile::parse(std::span<const uint8_t>(b)); }

// Parses `bytes` expecting a kiln::Error with `code` whose message contains `needle`.
void expect_rejected(const Bytes& bytes, const std::string& needle, Errc code = Errc::invalid_model) {
  try {
    parse(bytes);
    ADD_FAILURE() << "parsed, but should fail with '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << needle;
    EXPECT_EQ(e.code(), code) << e.what();
  }
}

// A small valid file with two KVs and three tensors of different types.
GgufBuilder small_file() {
  GgufBuilder b;
  b.kv_string("general.architecture", "llama").kv_u32("llama.block_count", 1);
  b.tensor_f32("a.weight", {4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  b.tensor("b.weight", {32}, gt::Q8_0, Bytes(34, 1));
  b.tensor("c.weight", {3}, gt::F16, Bytes{0x00, 0x3c, 0x00, 0xc0, 0x00, 0x00});
  return b;
}

// Every scalar type and every array element type, with values at the edges of their ranges.
GgufBuilder every_value_type() {
  GgufBuilder b;
  b.kv_u8("t.u8", 200).kv_i8("t.i8", -100).kv_u16("t.u16", 60000).kv_i16("t.i16", -30000);
  b.kv_u32("t.u32", 4000000000u).kv_i32("t.i32", -2000000000).kv_f32("t.f32", 1.5f).kv_bool("t.bool", true);
  b.kv_string("t.string", "h\xc3\xa9llo").kv_u64("t.u64", (uint64_t(1) << 63) + 5);
  b.kv_i64("t.i64", -(int64_t(1) << 62)).kv_f64("t.f64", 1e300).kv_string("t.empty", "");
  b.kv_array<uint8_t>("a.u8", vt::U8, {0, 255}).kv_array<int8_t>("a.i8", vt::I8, {-128, 127});
  b.kv_array<uint16_t>("a.u16", vt::U16, {65535}).kv_array<int16_t>("a.i16", vt::I16, {-32768, 5});
  b.kv_array<uint32_t>("a.u32", vt::U32, {7, 4294967295u}).kv_array<int32_t>("a.i32", vt::I32, {-7});
  b.kv_array<float>("a.f32", vt::F32, {0.25f, -3.0f}).kv_array<uint8_t>("a.bool", vt::BOOL, {1, 0, 1});
  b.kv_string_array("a.string", {"a", "", "bc"}).kv_array<uint64_t>("a.u64", vt::U64, {1ull << 40});
  b.kv_array<int64_t>("a.i64", vt::I64, {-(1ll << 40)}).kv_array<double>("a.f64", vt::F64, {0.5, -1e-300});
  b.kv_array<uint32_t>("a.empty", vt::U32, {});
  b.tensor_f32("x", {2}, {1.0f, 2.0f});
  return b;
}

// ---------------------------------------------------------------------------------------------
// Good files

// v2 and v3 share the layout (v3 only added big-endian files, told apart by the version bytes).
void expect_every_value_type_parses(uint32_t version) {
  Bytes bytes = every_value_type().version(version).build();
  GgufFile f = parse(bytes);
  EXPECT_EQ(f.version(), version);
  EXPECT_EQ(f.metadata().size(), 26u);

  EXPECT_EQ(f.find("t.u8")->type, ValueType::U8);
  EXPECT_EQ(f.get_int("t.u8"), 200);
  EXPECT_EQ(f.get_int("t.i8"), -100);
  EXPECT_EQ(f.get_int("t.u16"), 60000);
  EXPECT_EQ(f.get_int("t.i16"), -30000);
  EXPECT_EQ(f.get_int("t.u32"), 4000000000);
  EXPECT_EQ(f.get_int("t.i32"), -2000000000);
  EXPECT_EQ(f.get_float("t.f32"), 1.5);
  EXPECT_EQ(f.get_bool("t.bool"), true);
  EXPECT_EQ(f.get_string("t.string"), "h\xc3\xa9llo");
  EXPECT_EQ(f.find("t.u64")->u, (uint64_t(1) << 63) + 5);
  EXPECT_EQ(f.get_int("t.i64"), -(int64_t(1) << 62));
  EXPECT_EQ(f.get_float("t.f64"), 1e300);
  EXPECT_EQ(f.get_string("t.empty"), "");
  EXPECT_EQ(f.get_float("t.u8"), 200.0);  // integers are acceptable floats

  auto numbers = [&](const char* key) { return *f.get_number_array(key); };
  EXPECT_EQ(numbers("a.u8"), (std::vector<double>{0, 255}));
  EXPECT_EQ(numbers("a.i8"), (std::vector<double>{-128, 127}));
  EXPECT_EQ(numbers("a.u16"), (std::vector<double>{65535}));
  EXPECT_EQ(numbers("a.i16"), (std::vector<double>{-32768, 5}));
  EXPECT_EQ(numbers("a.u32"), (std::vector<double>{7, 4294967295.0}));
  EXPECT_EQ(numbers("a.i32"), (std::vector<double>{-7}));
  EXPECT_EQ(numbers("a.f32"), (std::vector<double>{0.25, -3.0}));
  EXPECT_EQ(numbers("a.bool"), (std::vector<double>{1, 0, 1}));
  EXPECT_EQ(numbers("a.u64"), (std::vector<double>{double(1ull << 40)}));
  EXPECT_EQ(numbers("a.i64"), (std::vector<double>{-double(1ll << 40)}));
  EXPECT_EQ(numbers("a.f64"), (std::vector<double>{0.5, -1e-300}));
  EXPECT_TRUE(numbers("a.empty").empty());
  EXPECT_EQ(f.find("a.f64")->array_type, ValueType::F64);
  EXPECT_EQ(*f.get_string_array("a.string"), (std::vector<std::string>{"a", "", "bc"}));

  ASSERT_EQ(f.tensors().size(), 1u);
  EXPECT_EQ(f.alignment(), 32u);
}

TEST(GgufReader, ParsesEveryValueTypeV2) { expect_every_value_type_parses(2); }
TEST(GgufReader, ParsesEveryValueTypeV3) { expect_every_value_type_parses(3); }

TEST(GgufReader, TypedGettersRejectTheWrongType) {
  Bytes bytes = every_value_type().build();
  GgufFile f = parse(bytes);
  EXPECT_EQ(f.get_int("absent"), std::nullopt);
  EXPECT_EQ(f.get_string_array("absent"), nullptr);
  EXPECT_THROW(f.get_int("t.string"), Error);
  EXPECT_THROW(f.get_int("t.f32"), Error);
  EXPECT_THROW(f.get_bool("t.u8"), Error);
  EXPECT_THROW(f.get_string("t.u8"), Error);
  EXPECT_THROW(f.get_float("t.string"), Error);
  EXPECT_THROW(f.get_string_array("a.u8"), Error);
  EXPECT_THROW(f.get_number_array("a.string"), Error);
  EXPECT_THROW(f.get_number_array("t.u8"), Error);
  try {
    f.get_int("t.u64");  // 2^63 + 5 does not fit an int64
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'t.u64' is out of range"), std::string::npos) << e.what();
  }
}

TEST(GgufReader, TensorInfosPointIntoTheData) {
  Layout layout;
  Bytes bytes = small_file().build(&layout);
  GgufFile f = parse(bytes);
  ASSERT_EQ(f.tensors().size(), 3u);
  const TensorInfo* a = f.find_tensor("a.weight");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->ne, (std::vector<uint64_t>{4, 2}));
  EXPECT_EQ(a->shape_string(), "[4, 2]");
  EXPECT_EQ(a->type, gt::F32);
  EXPECT_EQ(a->n_elements, 8u);
  EXPECT_EQ(a->n_bytes, 32u);
  EXPECT_EQ(a->offset, 0u);
  EXPECT_EQ(a->data, bytes.data() + layout.tensor_data_at[0]);
  float first;
  std::memcpy(&first, a->data, 4);
  EXPECT_EQ(first, 1.0f);

  const TensorInfo* b = f.find_tensor("b.weight");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->n_bytes, 34u);
  EXPECT_EQ(b->offset, 32u);
  EXPECT_EQ(f.find_tensor("c.weight")->offset, 96u);  // 32 + 34, rounded up to 32
  EXPECT_EQ(f.find_tensor("c.weight")->data, bytes.data() + layout.tensor_data_at[2]);
  EXPECT_EQ(f.find_tensor("nope"), nullptr);
  EXPECT_EQ(layout.data_start % 32, 0u);
}

TEST(GgufReader, CustomAlignment) {
  for (uint32_t alignment : {1u, 8u, 64u, 4096u}) {
    SCOPED_TRACE(alignment);
    Layout layout;
    GgufBuilder b = small_file();
    Bytes bytes = b.alignment(alignment).build(&layout);
    GgufFile f = parse(bytes);
    EXPECT_EQ(f.alignment(), alignment);
    for (size_t i = 0; i < f.tensors().size(); ++i) {
      EXPECT_EQ(f.tensors()[i].data, bytes.data() + layout.tensor_data_at[i]);
      EXPECT_EQ(f.tensors()[i].offset % alignment, 0u);
    }
  }
}

TEST(GgufReader, HeaderOnlyFileIsValid) {
  Bytes bytes = GgufBuilder().build();
  ASSERT_EQ(bytes.size(), 24u);
  GgufFile f = parse(bytes);
  EXPECT_TRUE(f.metadata().empty());
  EXPECT_TRUE(f.tensors().empty());
}

TEST(GgufReader, OpenMapsAFileAndNamesItInErrors) {
  std::string path = ::testing::TempDir() + "kiln_gguf_reader_test.gguf";
  Bytes bytes = small_file().build();
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  float first;
  std::memcpy(&first, f.find_tensor("a.weight")->data, 4);
  EXPECT_EQ(first, 1.0f);

  bytes[0] = 'X';
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  try {
    GgufFile::open(path);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not a GGUF file"), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
  EXPECT_THROW(GgufFile::open(path), Error);  // now missing: an io error, not a crash
}

// ---------------------------------------------------------------------------------------------
// Bad header

TEST(GgufReaderBad, Magic) {
  Bytes bytes = small_file().build();
  bytes[3] = 'G';
  expect_rejected(bytes, "not a GGUF file");
  expect_rejected(Bytes{'G', 'G', 'U'}, "not a GGUF file");
  expect_rejected(Bytes{}, "not a GGUF file");
}

TEST(GgufReaderBad, Version1IsObsolete) {
  expect_rejected(small_file().version(1).build(), "version 1 is obsolete", Errc::unsupported);
}

TEST(GgufReaderBad, UnknownVersion) {
  expect_rejected(small_file().version(4).build(), "GGUF version 4 is unknown");
  expect_rejected(small_file().version(0).build(), "GGUF version 0 is unknown");
  // A big-endian v3 file reads as version 0x03000000.
  expect_rejected(small_file().version(0x03000000).build(), "GGUF version 50331648 is unknown");
}

// The parser bounds counts by the bytes that remain before reserving anything: a 64-byte file
// claiming 2^60 entries must fail at once, with a message that says the file is too small.
Bytes padded_to_64(GgufBuilder b) {
  Bytes bytes = b.build();
  bytes.resize(64, 0);
  return bytes;
}

TEST(GgufReaderBad, AbsurdTensorCount) {
  auto start = std::chrono::steady_clock::now();
  expect_rejected(padded_to_64(GgufBuilder().tensor_count(uint64_t(1) << 60)),
                  "claims 1152921504606846976 tensors; the file is too small");
  expect_rejected(padded_to_64(GgufBuilder().tensor_count(~uint64_t(0))), "the file is too small");
  // Plausible but still more tensor infos than the remaining bytes could hold.
  expect_rejected(small_file().tensor_count(100).build(), "claims 100 tensors; the file is too small");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
}

TEST(GgufReaderBad, AbsurdKvCount) {
  auto start = std::chrono::steady_clock::now();
  expect_rejected(padded_to_64(GgufBuilder().kv_count(uint64_t(1) << 60)),
                  "claims 1152921504606846976 metadata entries; the file is too small");
  expect_rejected(small_file().kv_count(1000).build(), "claims 1000 metadata entries; the file is too small");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
}

TEST(GgufReaderBad, HeaderCountLargerThanEntries) {
  // Within the bound, but the last "entry" is really the first tensor info: it must fail cleanly.
  Bytes bytes = small_file().kv_count(3).build();
  EXPECT_THROW(parse(bytes), Error);
}

// ---------------------------------------------------------------------------------------------
// Bad metadata

TEST(GgufReaderBad, StringLengthPastEndOfFile) {
  Bytes payload;
  put<uint64_t>(payload, 1000);  // claims 1000 bytes; a handful follow
  payload.insert(payload.end(), {'a', 'b', 'c'});
  expect_rejected(GgufBuilder().kv_raw("k", vt::STRING, payload).build(), "string value at byte 37");
  expect_rejected(GgufBuilder().kv_raw("k", vt::STRING, payload).build(), "claims 1000 bytes, 3 remain");

  GgufBuilder b;  // a key whose length runs past the end
  b.kv_u32("k", 1);
  Bytes bytes = b.build();
  patch<uint64_t>(bytes, 24, ~uint64_t(0));
  expect_rejected(bytes, "metadata key at byte 24 claims 18446744073709551615 bytes");
}

TEST(GgufReaderBad, KeyTooLongOrEmpty) {
  expect_rejected(GgufBuilder().kv_u8(std::string(65536, 'k'), 1).build(), "is 65536 bytes long (limit 65535)");
  expect_rejected(GgufBuilder().kv_u8("", 1).build(), "metadata key 0 at byte 24 is empty");
}

TEST(GgufReaderBad, HugeArrayCount) {
  auto start = std::chrono::steady_clock::now();
  for (uint32_t elem : {vt::U8, vt::U64, vt::STRING, vt::BOOL}) {
    SCOPED_TRACE(elem);
    Bytes payload;
    put<uint32_t>(payload, elem);
    put<uint64_t>(payload, uint64_t(1) << 60);
    expect_rejected(padded_to_64(GgufBuilder().kv_raw("arr", vt::ARRAY, payload)),
                    "array of 1152921504606846976 elements at byte 39 cannot fit in the");
  }
  // 2^61 u64 elements would be 2^64 bytes: the bound must not overflow into "fits".
  Bytes payload;
  put<uint32_t>(payload, vt::U64);
  put<uint64_t>(payload, uint64_t(1) << 61);
  expect_rejected(padded_to_64(GgufBuilder().kv_raw("arr", vt::ARRAY, payload)), "cannot fit");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
}

TEST(GgufReaderBad, ArrayOfStringsPastEndOfFile) {
  Bytes bytes = GgufBuilder().kv_string_array("arr", {"abc", "def"}).build();
  patch<uint64_t>(bytes, bytes.size() - 11, 1u << 20);  // second string's length
  expect_rejected(bytes, "array string at byte");
}

TEST(GgufReaderBad, UnknownValueType) {
  expect_rejected(GgufBuilder().kv_raw("k", 13, Bytes(8, 0)).build(), "GGUF key 'k' has unknown value type 13");
  expect_rejected(GgufBuilder().kv_raw("k", 0xffffffffu, Bytes(8, 0)).build(), "unknown value type 4294967295");
}

TEST(GgufReaderBad, UnknownArrayElementType) {
  Bytes payload;
  put<uint32_t>(payload, 13);
  put<uint64_t>(payload, 1);
  payload.resize(payload.size() + 8, 0);
  expect_rejected(GgufBuilder().kv_raw("arr", vt::ARRAY, payload).build(),
                  "GGUF key 'arr': unknown array element type 13");
}

TEST(GgufReaderBad, NestedArray) {
  Bytes inner;
  put<uint32_t>(inner, vt::U8);
  put<uint64_t>(inner, 1);
  put<uint8_t>(inner, 7);
  Bytes payload;
  put<uint32_t>(payload, vt::ARRAY);
  put<uint64_t>(payload, 1);
  payload.insert(payload.end(), inner.begin(), inner.end());
  // The spec allows arrays of arrays but no model uses them (llama.cpp rejects them too).
  expect_rejected(GgufBuilder().kv_raw("arr", vt::ARRAY, payload).build(),
                  "GGUF key 'arr': nested arrays are not supported", Errc::unsupported);
}

TEST(GgufReaderBad, BoolValueTwo) {
  expect_rejected(GgufBuilder().kv_scalar<uint8_t>("flag", vt::BOOL, 2).build(), "bool at byte 40 has value 2");
  expect_rejected(GgufBuilder().kv_array<uint8_t>("flags", vt::BOOL, {1, 0, 255}).build(), "has value 255");
}

TEST(GgufReaderBad, DuplicateKey) {
  expect_rejected(small_file().kv_u32("llama.block_count", 2).build(), "GGUF key 'llama.block_count' appears twice");
}

TEST(GgufReaderBad, Alignment) {
  expect_rejected(small_file().kv_u32("general.alignment", 0).build(),
                  "general.alignment is 0; it must be a power of two");
  expect_rejected(small_file().kv_u32("general.alignment", 3).build(),
                  "general.alignment is 3; it must be a power of two");
  expect_rejected(small_file().kv_u64("general.alignment", 32).build(), "general.alignment must be a u32");
}

// ---------------------------------------------------------------------------------------------
// Bad tensor infos

GgufBuilder one_tensor(std::vector<uint64_t> ne, uint32_t type, Bytes data = Bytes(64, 0),
                       std::optional<uint64_t> offset = std::nullopt) {
  GgufBuilder b;
  b.kv_string("general.architecture", "llama");
  b.tensor("w", std::move(ne), type, std::move(data), offset);
  return b;
}

TEST(GgufReaderBad, DimensionCount) {
  expect_rejected(one_tensor({}, gt::F32).build(), "tensor 'w' has 0 dimensions (1 to 4 allowed)");
  expect_rejected(one_tensor({1, 1, 1, 1, 1}, gt::F32).build(), "tensor 'w' has 5 dimensions (1 to 4 allowed)");
  EXPECT_NO_THROW(parse(one_tensor({1, 1, 1, 16}, gt::F32).build()));
}

TEST(GgufReaderBad, DimensionZero) {
  expect_rejected(one_tensor({4, 0}, gt::F32).build(), "tensor 'w' has dimension 1 of size 0");
  expect_rejected(one_tensor({0}, gt::F32).build(), "tensor 'w' has dimension 0 of size 0");
}

TEST(GgufReaderBad, ElementCountOverflow) {
  expect_rejected(one_tensor({uint64_t(1) << 32, uint64_t(1) << 32}, gt::F32).build(),
                  "tensor 'w': element count overflows");
  // 2^63 fits a uint64 but not the int64 the rest of kiln uses for sizes.
  expect_rejected(one_tensor({uint64_t(1) << 62, 2}, gt::I8).build(), "tensor 'w': element count overflows");
  expect_rejected(one_tensor({~uint64_t(0)}, gt::I8).build(), "element count overflows");
}

TEST(GgufReaderBad, ByteSizeOverflow) {
  expect_rejected(one_tensor({uint64_t(1) << 62}, gt::F32).build(), "tensor 'w': byte size overflows");
  expect_rejected(one_tensor({uint64_t(1) << 32, uint64_t(1) << 29}, gt::F64).build(), "byte size overflows");
}

TEST(GgufReaderBad, UnknownGgmlType) {
  for (uint32_t type : {4u, 5u, 16u, 31u, 39u, 1000u, 0xffffffffu}) {  // removed, IQ*, future
    SCOPED_TRACE(type);
    expect_rejected(one_tensor({32}, type).build(), "tensor 'w' has unknown ggml type " + std::to_string(type));
  }
}

TEST(GgufReaderBad, RowLengthNotAMultipleOfTheBlock) {
  expect_rejected(one_tensor({48, 2}, gt::Q4_0).build(),
                  "tensor 'w' (Q4_0): row length 48 is not a multiple of the Q4_0 block size 32");
  expect_rejected(one_tensor({32}, gt::Q4_K).build(), "row length 32 is not a multiple of the Q4_K block size 256");
}

TEST(GgufReaderBad, OffsetMisaligned) {
  expect_rejected(one_tensor({4}, gt::F32, Bytes(16, 0), 4).build(),
                  "tensor 'w': offset 4 is not a multiple of the alignment 32");
  GgufBuilder b = one_tensor({4}, gt::F32, Bytes(16, 0), 32);
  expect_rejected(b.alignment(64).build(), "offset 32 is not a multiple of the alignment 64");
}

TEST(GgufReaderBad, OffsetPastEnd) {
  expect_rejected(one_tensor({4}, gt::F32, Bytes(16, 0), uint64_t(1) << 40).build(),
                  "tensor 'w' (16 bytes at data offset 1099511627776) lies past the end of the file");
  // The largest aligned offset: offset + size would wrap around if added naively.
  expect_rejected(one_tensor({4}, gt::F32, Bytes(16, 0), ~uint64_t(31)).build(), "lies past the end of the file");
  // Starts inside the data section but runs past its end.
  GgufBuilder b = small_file();
  b.tensor("d.weight", {64}, gt::F32, Bytes(8, 0));
  expect_rejected(b.build(), "tensor 'd.weight' (256 bytes at data offset 128) lies past the end of the file");
  // Large but in range of a uint64: n_bytes alone exceeds the file.
  expect_rejected(one_tensor({uint64_t(1) << 40}, gt::F32).build(), "lies past the end of the file");
}

TEST(GgufReaderBad, DataSectionPastEnd) {
  Layout layout;
  Bytes bytes = one_tensor({4}, gt::F32, Bytes(16, 0)).build(&layout);
  ASSERT_NE(layout.infos_end % 32, 0u) << "the test needs padding between the infos and the data";
  bytes.resize(layout.infos_end + 1);
  expect_rejected(bytes, "the data section would start at byte " + std::to_string(layout.data_start));
}

TEST(GgufReaderBad, DuplicateTensorName) {
  GgufBuilder b = small_file();
  b.tensor_f32("a.weight", {2}, {1, 2});
  expect_rejected(b.build(), "tensor 'a.weight' appears twice");
}

TEST(GgufReaderBad, TensorNameEmptyOrTooLong) {
  GgufBuilder b;
  b.tensor_f32("", {1}, {1});
  expect_rejected(b.build(), "tensor 0 at byte 24 has an empty name");
  GgufBuilder c;
  c.tensor_f32(std::string(64, 'n'), {1}, {1});  // ggml names hold 63 bytes
  expect_rejected(c.build(), "is 64 bytes long (limit 63)");
  GgufBuilder d;
  d.tensor_f32(std::string(63, 'n'), {1}, {1});
  EXPECT_NO_THROW(parse(d.build()));
}

// ---------------------------------------------------------------------------------------------
// Truncation and corruption anywhere

// Every proper prefix of a valid file must be rejected with a kiln::Error: the builder does not pad
// after the last tensor, so any cut loses some header, metadata, info or tensor bytes.
void expect_every_prefix_rejected(const Bytes& whole) {
  ASSERT_NO_THROW(parse(whole));
  for (size_t n = 0; n < whole.size(); ++n) {
    Bytes prefix(whole.begin(), whole.begin() + ptrdiff_t(n));
    prefix.shrink_to_fit();  // so ASan would see any read past the prefix
    try {
      parse(prefix);
      ADD_FAILURE() << "a prefix of " << n << " of " << whole.size() << " bytes parsed";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_model) << "prefix " << n << ": " << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "prefix " << n << ": not a kiln::Error: " << e.what();
    }
  }
}

TEST(GgufReaderTruncated, EveryPrefixOfASmallFile) { expect_every_prefix_rejected(small_file().build()); }

TEST(GgufReaderTruncated, EveryPrefixOfAFileWithEveryValueType) {
  expect_every_prefix_rejected(every_value_type().build());
}

TEST(GgufReaderTruncated, EveryPrefixWithCustomAlignment) {
  GgufBuilder b = small_file();
  expect_every_prefix_rejected(b.alignment(128).build());
}

// A deterministic slice of what the fuzzer does: overwrite each byte with a few values; the file
// must then parse or fail with a kiln::Error, nothing else.
TEST(GgufReaderCorrupt, EveryByteOverwritten) {
  Bytes whole = every_value_type().build();
  for (uint8_t value : {0x00, 0x01, 0x7f, 0x80, 0xff}) {
    for (size_t at = 0; at < whole.size(); ++at) {
      Bytes bytes = whole;
      bytes[at] = value;
      try {
        parse(bytes);
      } catch (const Error&) {
      } catch (const std::exception& e) {
        ADD_FAILURE() << "byte " << at << " = " << int(value) << ": not a kiln::Error: " << e.what();
      }
    }
  }
}

}  // namespace
}  // namespace kiln::gguf
