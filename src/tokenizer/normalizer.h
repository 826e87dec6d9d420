// Text normalization applied before pre-tokenization, as Hugging Face tokenizers' normalizers do:
// Unicode NFC (Qwen2), and the two string edits SentencePiece-style tokenizer.json files use to
// spell spaces as U+2581 (Prepend "▁", Replace " " -> "▁").
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kiln {

// Canonical composition (NFC). Invalid UTF-8 is data, not an error: the valid runs between
// invalid bytes are normalized and the invalid bytes kept as they are.
std::string nfc(std::string_view text);

class Normalizer {
 public:
  struct Step {
    enum Kind { nfc, prepend, replace } kind;
    std::string pattern;  // replace: what to find
    std::string content;  // prepend: the prefix; replace: the replacement
  };

  void add(Step step) { steps_.push_back(std::move(step)); }
  bool empty() const { return steps_.empty(); }
  // Applies the steps in order. Prepend adds nothing to empty text (as Hugging Face's does).
  std::string apply(std::string_view text) const;

 private:
  std::vector<Step> steps_;
};

}  // namespace kiln
