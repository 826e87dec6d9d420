#include "tokenizer/special_tokens.h"

#include <algorithm>

namespace kiln {

SpecialTokenMatcher::SpecialTokenMatcher(std::vector<Token> tokens) {
  std::erase_if(tokens, [](const Token& t) { return t.text.empty(); });
  tokens_ = std::move(tokens);
  for (uint32_t i = 0; i < tokens_.size(); ++i) by_first_byte_[uint8_t(tokens_[i].text[0])].push_back(i);
  for (auto& candidates : by_first_byte_) {
    // Longest first so the first hit at a position is the longest; ties (equal text) keep the
    // lower id, which is what a vocabulary lookup by text would give.
    std::stable_sort(candidates.begin(), candidates.end(), [&](uint32_t a, uint32_t b) {
      return tokens_[a].text.size() > tokens_[b].text.size();
    });
  }
}

std::vector<SpecialTokenMatcher::Segment> SpecialTokenMatcher::split(std::string_view text, bool match_control) const {
  std::vector<Segment> segments;
  size_t text_begin = 0;  // start of the ordinary text not yet emitted
  size_t pos = 0;
  while (pos < text.size()) {
    const Token* found = nullptr;
    for (uint32_t index : by_first_byte_[uint8_t(text[pos])]) {
      const Token& token = tokens_[index];
      if (token.control && !match_control) continue;
      if (text.substr(pos).starts_with(token.text)) {
        found = &token;
        break;
      }
    }
    if (found == nullptr) {
      ++pos;
      continue;
    }
    if (pos > text_begin) segments.push_back({text.substr(text_begin, pos - text_begin), -1});
    segments.push_back({text.substr(pos, found->text.size()), found->id});
    pos += found->text.size();
    text_begin = pos;
  }
  if (text_begin < text.size()) segments.push_back({text.substr(text_begin), -1});
  return segments;
}

}  // namespace kiln
