// Added tokens (control tokens such as "<|im_start|>", and user-defined tokens) are found in the
// raw text before pre-tokenization, so that the regexes never cut them apart.
//
// Matching is leftmost-longest, as in Hugging Face tokenizers (its AddedVocabulary runs an
// Aho-Corasick automaton in LeftmostLongest mode): scanning from the left, the first position
// where any token matches wins, and there the longest token.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

class SpecialTokenMatcher {
 public:
  struct Token {
    std::string text;  // raw text, as written in the input
    int32_t id;
    // Control tokens are matched only when the caller asks (parse_special); user-defined tokens
    // always, as llama.cpp and Hugging Face do, because they are ordinary text to the model.
    bool control;
  };
  // Tokens with empty text are ignored: they would match everywhere.
  explicit SpecialTokenMatcher(std::vector<Token> tokens);

  struct Segment {
    std::string_view text;  // a view into the input
    int32_t id;             // the token's id, or -1 for text to pre-tokenize
  };
  // `text` cut into special tokens and the text between them, in order, none of it empty.
  std::vector<Segment> split(std::string_view text, bool match_control) const;

  bool empty() const { return tokens_.empty(); }

 private:
  std::vector<Token> tokens_;
  // For each first byte, the indices into tokens_ of the tokens that start with it, longest first.
  std::array<std::vector<uint32_t>, 256> by_first_byte_;
};

}  // namespace kiln
