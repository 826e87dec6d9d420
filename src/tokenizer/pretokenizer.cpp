#include "tokenizer/pretokenizer.h"

#include <pcre2.h>

#include <array>
#include <initializer_list>

#include "core/check.h"
#include "tokenizer/utf8.h"

namespace kiln {
namespace {

// The regexes of llama.cpp's llm_tokenizer_bpe (src/llama-vocab.cpp), by pre-tokenizer family.
// Llama 3 and Qwen2 spell the case-insensitive contractions `(?i:'s|...)` of their tokenizer.json
// as explicit classes, as llama.cpp does; PCRE2 would take either.
constexpr const char* kGpt2Regex =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
constexpr const char* kLlama3Regex =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kQwen2Regex =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kSingleDigitRegex = "\\p{N}";

struct PreTokenizerFamily {
  std::initializer_list<std::string_view> names;  // tokenizer.ggml.pre values
  std::initializer_list<const char*> regexes;
  bool ignore_merges;
};

const std::array<PreTokenizerFamily, 5>& families() {
  static const std::array<PreTokenizerFamily, 5> table = {{
      // GPT-2's own regex. "default" follows it too: llama.cpp's default adds three more
      // regexes, but the models that say "default" are GPT-2-like in practice.
      {{"gpt2", "gpt-2", "default", "phi-2", "mpt", "olmo", "jais", "roberta-bpe"}, {kGpt2Regex}, false},
      // GPT-2's regex after cutting every digit apart (HF Digits(individual_digits=True)).
      {{"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"},
       {kSingleDigitRegex, kGpt2Regex},
       false},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral"}, {kLlama3Regex}, true},
      {{"dbrx", "smaug-bpe"}, {kLlama3Regex}, false},
      {{"qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"}, {kQwen2Regex}, false},
  }};
  return table;
}

}  // namespace

PreTokenizerConfig pretokenizer_config(std::string_view pre_name) {
  for (const PreTokenizerFamily& family : families()) {
    for (std::string_view name : family.names) {
      if (name == pre_name) {
        PreTokenizerConfig config;
        for (const char* regex : family.regexes) config.regexes.emplace_back(regex);
        config.ignore_merges = family.ignore_merges;
        return config;
      }
    }
  }
  std::string known;
  for (const PreTokenizerFamily& family : families()) {
    for (std::string_view name : family.names) known += fmt::format("{}{}", known.empty() ? "" : ", ", name);
  }
  KILN_FAIL(unsupported, "tokenizer.ggml.pre '{}' is not a pre-tokenizer kiln knows (known: {})", pre_name, known);
}

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  std::string pattern;

  ~Regex() { pcre2_code_free(code); }
};

namespace {

// Match data sized for the pattern, freed on scope exit. One per split() call: the compiled code
// is shared between threads, the match data cannot be.
struct MatchData {
  explicit MatchData(const pcre2_code* code) : data(pcre2_match_data_create_from_pattern(code, nullptr)) {
    KILN_CHECK(data != nullptr, internal, "PCRE2 could not allocate match data");
  }
  ~MatchData() { pcre2_match_data_free(data); }
  MatchData(const MatchData&) = delete;
  MatchData& operator=(const MatchData&) = delete;
  pcre2_match_data* data;
};

std::string pcre2_message(int error_code) {
  std::array<PCRE2_UCHAR, 256> buffer{};
  pcre2_get_error_message(error_code, buffer.data(), buffer.size());
  return reinterpret_cast<const char*>(buffer.data());
}

bool jit_available() {
  uint32_t jit = 0;
  return pcre2_config(PCRE2_CONFIG_JIT, &jit) >= 0 && jit == 1;
}

// Cuts `piece` into the regex's matches and the gaps between them, appending both to `out`.
void split_piece(const PreTokenizer::Regex& regex, MatchData& match, std::string_view piece,
                 std::vector<std::string_view>& out) {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
  size_t search_from = 0;  // where the next match may start
  size_t gap_begin = 0;    // start of the text not yet emitted
  while (search_from < piece.size()) {
    const int rc = pcre2_match(regex.code, subject, piece.size(), search_from, PCRE2_NO_UTF_CHECK, match.data, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    // rc == 0 only means the ovector could not hold every group; the whole match is still there.
    KILN_CHECK(rc >= 0, internal, "pre-tokenizer regex '{}' failed on a {}-byte piece: {}", regex.pattern,
               piece.size(), pcre2_message(rc));
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.data);
    const size_t begin = ovector[0], end = ovector[1];
    if (end == begin) {
      // An empty match cuts nothing; step over one character so the search moves on.
      if (begin >= piece.size()) break;
      search_from = begin + utf8::scan(piece.substr(begin)).length;
      continue;
    }
    if (begin > gap_begin) out.push_back(piece.substr(gap_begin, begin - gap_begin));
    out.push_back(piece.substr(begin, end - begin));
    gap_begin = search_from = end;
  }
  if (gap_begin < piece.size()) out.push_back(piece.substr(gap_begin));
}

}  // namespace

PreTokenizer::PreTokenizer(const std::vector<std::string>& regexes) {
  const bool use_jit = jit_available();
  for (const std::string& pattern : regexes) {
    auto regex = std::make_unique<Regex>();
    regex->pattern = pattern;
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    // UCP makes \s, \d and \w Unicode-aware, as they are in the Hugging Face (Oniguruma) regexes.
    regex->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                                &error_code, &error_offset, nullptr);
    KILN_CHECK(regex->code != nullptr, invalid_argument, "pre-tokenizer regex '{}' does not compile at offset {}: {}",
               pattern, error_offset, pcre2_message(error_code));
    // JIT failing (e.g. no executable memory) is not an error: the interpreter gives the same matches.
    if (use_jit) pcre2_jit_compile(regex->code, PCRE2_JIT_COMPLETE);
    regexes_.push_back(std::move(regex));
  }
}

PreTokenizer::~PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;

std::vector<std::string_view> PreTokenizer::split(std::string_view text) const {
  std::vector<std::string_view> pieces;
  // Regexes run in UTF mode without re-checking the subject on every call (which would make
  // splitting quadratic), so only valid UTF-8 may reach them: cut the rest out first, one piece
  // per invalid byte, each of which BPE then spells as a byte token.
  for (size_t pos = 0; pos < text.size();) {
    const size_t valid = utf8::valid_prefix_length(text.substr(pos));
    if (valid > 0) {
      pieces.push_back(text.substr(pos, valid));
      pos += valid;
    } else {
      const utf8::Scan s = utf8::scan(text.substr(pos));
      for (size_t i = 0; i < s.length; ++i) pieces.push_back(text.substr(pos + i, 1));
      pos += s.length;
    }
  }
  std::vector<std::string_view> next;
  for (const auto& regex : regexes_) {
    MatchData match(regex->code);
    next.clear();
    next.reserve(pieces.size() * 2);
    for (std::string_view piece : pieces) {
      if (piece.size() == 1 && uint8_t(piece[0]) >= 0x80) {
        next.push_back(piece);  // an invalid byte cut out above
      } else {
        split_piece(*regex, match, piece, next);
      }
    }
    pieces.swap(next);
  }
  return pieces;
}

}  // namespace kiln
