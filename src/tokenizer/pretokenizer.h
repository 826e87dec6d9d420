// Pre-tokenization: cutting text into the pieces BPE merges within (words, number groups,
// punctuation runs, whitespace), with the regexes llama.cpp uses for each `tokenizer.ggml.pre`.
//
// A pre-tokenizer is a list of regexes applied in turn. Each regex cuts every piece produced so
// far into its matches and the gaps between them, keeping both (llama.cpp unicode_regex_split; in
// Hugging Face terms a Sequence of Split(behavior="isolated")). A regex sees one piece at a time,
// so look-arounds such as `\s+(?!\S)` stop at the piece's edges.
//
// Regexes run on PCRE2 in UTF mode with Unicode properties (\p{L}, \p{N}; \s and \d Unicode-aware),
// JIT-compiled when the library supports it. The compiled patterns are read-only after
// construction, so one PreTokenizer may be used from many threads at once.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

// What a `tokenizer.ggml.pre` value means for a byte-level BPE vocabulary.
struct PreTokenizerConfig {
  std::vector<std::string> regexes;
  // A pre-token that is itself in the vocabulary is emitted whole, without running the merges
  // (Hugging Face BPE `ignore_merges`, set by Llama 3's tokenizer).
  bool ignore_merges = false;
};

// The configuration llama.cpp uses for a `tokenizer.ggml.pre` value; throws kiln::Error
// (unsupported) naming the value when kiln does not know it.
PreTokenizerConfig pretokenizer_config(std::string_view pre_name);

class PreTokenizer {
 public:
  // Compiles the regexes; throws kiln::Error(invalid_argument) naming a regex that does not compile.
  explicit PreTokenizer(const std::vector<std::string>& regexes);
  ~PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;

  // The pieces of `text`, in order, as views into it; together they cover it exactly and none is
  // empty. Bytes that are not valid UTF-8 never reach a regex: each becomes a piece of its own.
  std::vector<std::string_view> split(std::string_view text) const;

 public:
  struct Regex;  // a compiled PCRE2 pattern (defined in pretokenizer.cpp)

 private:
  std::vector<std::unique_ptr<Regex>> regexes_;
};

}  // namespace kiln
