#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "kiln/error.h"
#include "model/gguf/gguf_file.h"
#include "tokenizer/bpe.h"
#include "tokenizer/byte_level.h"
#include "gguf_builder.h"

namespace kiln {
namespace {

// A vocabulary of the 256 byte tokens (ids 0..255) followed by `extra` tokens (ids from 256).
BpeVocab tiny_vocab(const std::vector<std::pair<std::string, TokenType>>& extra, std::vector<std::string> merges) {
  BpeVocab vocab;
  for (int b = 0; b < 256; ++b) {
    vocab.tokens.emplace_back(byte_level::spell_byte(uint8_t(b)));
    vocab.types.push_back(TokenType::normal);
  }
  for (const auto& [text, type] : extra) {
    vocab.tokens.push_back(text);
    vocab.types.push_back(type);
  }
  vocab.merges = std::move(merges);
  vocab.pre = "gpt2";
  return vocab;
}

constexpr auto kNormal = TokenType::normal;

TEST(TokenizerBpe, LowestRankMergesFirst) {
  // ids: ab 256, bc 257, abc 258
  const std::vector<std::pair<std::string, TokenType>> extra = {{"ab", kNormal}, {"bc", kNormal}, {"abc", kNormal}};
  {
    BpeTokenizer t(tiny_vocab(extra, {"b c", "a b", "a bc"}));
    EXPECT_EQ(t.encode("abc", false, false), (std::vector<int32_t>{258}));  // b+c first, then a+bc
    EXPECT_EQ(t.encode("abd", false, false), (std::vector<int32_t>{256, 'd'}));
  }
  {
    BpeTokenizer t(tiny_vocab(extra, {"a b", "b c"}));  // no "ab c": stuck at ab + c
    EXPECT_EQ(t.encode("abc", false, false), (std::vector<int32_t>{256, 'c'}));
  }
}

TEST(TokenizerBpe, EqualRanksMergeLeftmostFirst) {
  BpeTokenizer t(tiny_vocab({{"aa", kNormal}}, {"a a"}));
  EXPECT_EQ(t.encode("aaa", false, false), (std::vector<int32_t>{256, 'a'}));
  EXPECT_EQ(t.encode("aaaa", false, false), (std::vector<int32_t>{256, 256}));
}

TEST(TokenizerBpe, ShortAndLongPiecesMergeAlike) {
  // Pieces over 64 bytes take the heap path; the result must not depend on the path.
  BpeTokenizer t(tiny_vocab({{"aa", kNormal}, {"aaaa", kNormal}, {"ab", kNormal}}, {"a b", "a a", "aa aa"}));
  for (size_t n : {7u, 20u, 63u, 64u, 65u, 101u, 1000u}) {
    std::vector<int32_t> expected(n / 4, 257);
    if (n % 4 >= 2) expected.push_back(256);
    if (n % 2) expected.push_back('a');
    EXPECT_EQ(t.encode(std::string(n, 'a'), false, false), expected) << n;
    // "a b" outranks "a a": every a before a b pairs with it first.
    std::string abab;
    for (size_t i = 0; i < n; ++i) abab += "aab";
    const std::vector<int32_t> ids = t.encode(abab, false, false);
    EXPECT_EQ(ids.size(), 2 * n) << n;
    for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(ids[i], i % 2 ? 258 : 'a');
  }
}

TEST(TokenizerBpe, MergesStayInsidePreTokens) {
  // "a b" is two pre-tokens ("a", " b"): the merge "a Ġ" must not join across the cut.
  BpeTokenizer t(tiny_vocab({{"a\xC4\xA0", kNormal}, {"\xC4\xA0" "b", kNormal}}, {"a \xC4\xA0", "\xC4\xA0 b"}));
  EXPECT_EQ(t.encode("a b", false, false), (std::vector<int32_t>{'a', 257}));
}

TEST(TokenizerBpe, MergesNamingUnknownTokensAreSkipped) {
  BpeTokenizer t(tiny_vocab({{"ab", kNormal}}, {"x yz", "a b", "c d"}));  // "yz" and "cd" are not tokens
  EXPECT_EQ(t.encode("abcd", false, false), (std::vector<int32_t>{256, 'c', 'd'}));
}

TEST(TokenizerBpe, ControlTokensOnlyWithParseSpecial) {
  BpeTokenizer t(tiny_vocab({{"<|im_start|>", TokenType::control}, {"<|im_end|>", TokenType::control}}, {}));
  EXPECT_EQ(t.encode("<|im_start|>hi<|im_end|>", false, true), (std::vector<int32_t>{256, 'h', 'i', 257}));
  const std::vector<int32_t> as_text = t.encode("<|im_start|>", false, false);
  EXPECT_EQ(as_text.size(), 12u);
  EXPECT_EQ(t.decode(as_text), "<|im_start|>");
}

TEST(TokenizerBpe, UserDefinedTokensAlwaysMatchLongestFirst) {
  BpeTokenizer t(tiny_vocab({{"<t>", TokenType::user_defined}, {"<t>x", TokenType::user_defined}}, {}));
  EXPECT_EQ(t.encode("a<t>xb<t>", false, false), (std::vector<int32_t>{'a', 257, 'b', 256}));
  EXPECT_EQ(t.token_bytes(257), "<t>x");
}

TEST(TokenizerBpe, BosIsAddedOnlyWhenAskedAndPresent) {
  BpeVocab vocab = tiny_vocab({{"<s>", TokenType::control}}, {});
  vocab.bos_id = 256;
  BpeTokenizer t(vocab);
  EXPECT_EQ(t.encode("a", true, false), (std::vector<int32_t>{256, 'a'}));
  EXPECT_EQ(t.encode("a", false, false), (std::vector<int32_t>{'a'}));
  BpeTokenizer no_bos(tiny_vocab({}, {}));
  EXPECT_EQ(no_bos.encode("a", true, false), (std::vector<int32_t>{'a'}));
}

TEST(TokenizerBpe, IgnoreMergesTakesWholePiecesFromTheVocabulary) {
  // "abc" is a token but no merge builds it: Llama 3's ignore_merges still emits it whole.
  BpeVocab vocab = tiny_vocab({{"abc", kNormal}}, {});
  vocab.pre = "llama-bpe";
  EXPECT_EQ(BpeTokenizer(vocab).encode("abc", false, false), (std::vector<int32_t>{256}));
  vocab.pre = "qwen2";
  EXPECT_EQ(BpeTokenizer(vocab).encode("abc", false, false), (std::vector<int32_t>{'a', 'b', 'c'}));
}

TEST(TokenizerBpe, EndOfGenerationIsEosAndTurnEnders) {
  BpeVocab vocab = tiny_vocab({{"<|endoftext|>", TokenType::control}, {"<|im_end|>", TokenType::control},
                               {"<|im_start|>", TokenType::control}, {"<|eot_custom|>", TokenType::control}}, {});
  vocab.eos_id = 256;
  vocab.extra_end_ids = {259};
  BpeTokenizer t(vocab);
  EXPECT_TRUE(t.is_end_of_generation(256));
  EXPECT_TRUE(t.is_end_of_generation(257));
  EXPECT_FALSE(t.is_end_of_generation(258));
  EXPECT_TRUE(t.is_end_of_generation(259));
  EXPECT_FALSE(t.is_end_of_generation('a'));
  EXPECT_FALSE(t.is_end_of_generation(-1));
  EXPECT_FALSE(t.is_end_of_generation(100000));
  EXPECT_EQ(t.find_token("<|im_end|>"), 257);
  EXPECT_EQ(t.find_token("nope"), -1);
}

TEST(TokenizerBpe, TokenBytesMapsBackToRawBytes) {
  BpeTokenizer t(tiny_vocab({{"\xC4\xA0" "a", kNormal}}, {"\xC4\xA0 a"}));
  EXPECT_EQ(t.token_bytes(' '), " ");
  EXPECT_EQ(t.token_bytes(256), " a");
  EXPECT_EQ(t.token_bytes(0xC3), "\xC3");  // half a character: bytes, not text
  EXPECT_THROW(t.token_bytes(-1), Error);
  EXPECT_THROW(t.token_bytes(257), Error);
}

TEST(TokenizerBpe, AnyBytesEncodeLosslessly) {
  BpeTokenizer t(tiny_vocab({}, {}));
  std::string all;
  for (int b = 0; b < 256; ++b) all += char(b);
  std::string joined;
  for (int32_t id : t.encode(all, false, true)) joined += t.token_bytes(id);
  EXPECT_EQ(joined, all);
}

TEST(TokenizerBpe, BytesWithoutATokenAreDroppedBeforeMerging) {
  // As in Hugging Face: SmolLM2 has no token for 0x04, and "!\x04!" encodes as "!!".
  BpeVocab vocab = tiny_vocab({{"!!", kNormal}}, {"! !"});
  vocab.tokens[0x04] = "not-a-byte";
  BpeTokenizer t(vocab);
  EXPECT_EQ(t.encode("!\x04!", false, false), (std::vector<int32_t>{256}));  // one pre-token
  EXPECT_EQ(t.encode("\x04", false, false), (std::vector<int32_t>{}));
  EXPECT_EQ(t.encode("\x04\x04", false, false), (std::vector<int32_t>{}));
}

TEST(TokenizerBpe, RejectsBrokenVocabularies) {
  auto code_of = [](BpeVocab vocab) {
    try {
      BpeTokenizer t(std::move(vocab));
    } catch (const Error& e) {
      return e.code();
    }
    return Errc::internal;  // did not throw
  };
  BpeVocab bad_merge = tiny_vocab({}, {"nospace"});
  EXPECT_EQ(code_of(bad_merge), Errc::invalid_model);
  BpeVocab bad_eos = tiny_vocab({}, {});
  bad_eos.eos_id = 256;
  EXPECT_EQ(code_of(bad_eos), Errc::invalid_model);
  BpeVocab bad_types = tiny_vocab({}, {});
  bad_types.types.pop_back();
  EXPECT_EQ(code_of(bad_types), Errc::invalid_model);
  EXPECT_EQ(code_of(BpeVocab{}), Errc::invalid_model);
  BpeVocab bad_pre = tiny_vocab({}, {});
  bad_pre.pre = "mystery";
  EXPECT_EQ(code_of(bad_pre), Errc::unsupported);
}

// ---- from_gguf ----

// A GGUF holding only a tokenizer: 256 byte tokens, <|im_end|> (256, control, EOS), "ab" (257).
gguf::testing::GgufBuilder tokenizer_gguf(std::string_view model, std::string_view pre,
                                          std::optional<std::vector<int32_t>> types_override = std::nullopt) {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  for (int b = 0; b < 256; ++b) {
    tokens.emplace_back(byte_level::spell_byte(uint8_t(b)));
    types.push_back(1);
  }
  tokens.push_back("<|im_end|>");
  types.push_back(3);
  tokens.push_back("ab");
  types.push_back(1);
  gguf::testing::GgufBuilder builder;
  builder.kv_string("tokenizer.ggml.model", model)
      .kv_string("tokenizer.ggml.pre", pre)
      .kv_string_array("tokenizer.ggml.tokens", tokens)
      .kv_array("tokenizer.ggml.token_type", gguf::testing::vt::I32, types_override.value_or(types))
      .kv_string_array("tokenizer.ggml.merges", {"a b"})
      .kv_u32("tokenizer.ggml.eos_token_id", 256)
      .kv_bool("tokenizer.ggml.add_bos_token", false);
  return builder;
}

Errc from_gguf_error(const gguf::testing::Bytes& bytes, std::string* message = nullptr) {
  const gguf::GgufFile file = gguf::GgufFile::parse(bytes);
  try {
    Tokenizer::from_gguf(file);
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.code();
  }
  return Errc::internal;  // did not throw
}

TEST(TokenizerFromGguf, BuildsByteLevelBpe) {
  const gguf::testing::Bytes bytes = tokenizer_gguf("gpt2", "smollm").build();
  const gguf::GgufFile file = gguf::GgufFile::parse(bytes);
  const std::unique_ptr<Tokenizer> t = Tokenizer::from_gguf(file);
  EXPECT_EQ(t->vocab_size(), 258);
  EXPECT_EQ(t->eos_id(), 256);
  EXPECT_EQ(t->bos_id(), -1);
  EXPECT_FALSE(t->add_bos_default());
  EXPECT_TRUE(t->is_end_of_generation(256));
  EXPECT_EQ(t->encode("ab12<|im_end|>", false, true), (std::vector<int32_t>{257, '1', '2', 256}));
}

TEST(TokenizerFromGguf, SentencePieceNeedsScoresAndOtherModelsAreUnsupported) {
  std::string message;
  EXPECT_EQ(from_gguf_error(tokenizer_gguf("llama", "default").build(), &message), Errc::invalid_model);
  EXPECT_NE(message.find("tokenizer.ggml.scores"), std::string::npos) << message;
  EXPECT_EQ(from_gguf_error(tokenizer_gguf("bert", "default").build(), &message), Errc::unsupported);
  EXPECT_NE(message.find("'bert'"), std::string::npos) << message;
}

TEST(TokenizerFromGguf, UnknownPreTokenizerIsUnsupportedAndNamed) {
  std::string message;
  EXPECT_EQ(from_gguf_error(tokenizer_gguf("gpt2", "fancy-new-pre").build(), &message), Errc::unsupported);
  EXPECT_NE(message.find("fancy-new-pre"), std::string::npos) << message;
}

TEST(TokenizerFromGguf, RejectsOutOfRangeIds) {
  EXPECT_EQ(from_gguf_error(tokenizer_gguf("gpt2", "smollm").kv_u32("tokenizer.ggml.bos_token_id", 258).build()),
            Errc::invalid_model);
  EXPECT_EQ(from_gguf_error(tokenizer_gguf("gpt2", "smollm").kv_i32("tokenizer.ggml.eot_token_id", -5).build()),
            Errc::invalid_model);
}

TEST(TokenizerFromGguf, RejectsMissingOrMismatchedArrays) {
  gguf::testing::GgufBuilder no_model;
  no_model.kv_string("general.architecture", "llama");
  EXPECT_EQ(from_gguf_error(no_model.build()), Errc::invalid_model);
  gguf::testing::GgufBuilder no_tokens;
  no_tokens.kv_string("tokenizer.ggml.model", "gpt2");
  EXPECT_EQ(from_gguf_error(no_tokens.build()), Errc::invalid_model);
  std::string message;
  EXPECT_EQ(from_gguf_error(tokenizer_gguf("gpt2", "smollm", std::vector<int32_t>{1, 1}).build(), &message),
            Errc::invalid_model);
  EXPECT_NE(message.find("token_type"), std::string::npos) << message;
}

}  // namespace
}  // namespace kiln
