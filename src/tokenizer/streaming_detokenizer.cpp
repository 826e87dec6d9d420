// Ids -> text that is always valid UTF-8, whole or as a stream.
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace kiln {

std::string StreamingDetokenizer::push(int32_t id) {
  pending_ += tokenizer_.token_bytes(id);
  std::string text;
  const size_t consumed = utf8::append_replacing_invalid(text, pending_, /*final=*/false);
  // What is left is the start of a character that later tokens may complete (at most 3 bytes).
  pending_.erase(0, consumed);
  return text;
}

std::string StreamingDetokenizer::flush() {
  std::string text;
  utf8::append_replacing_invalid(text, pending_, /*final=*/true);
  pending_.clear();
  return text;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  // One pass over the concatenated bytes gives the same text as streaming token by token: the
  // replacement of an invalid sequence depends only on the bytes, not on where tokens end.
  std::string bytes;
  for (int32_t id : ids) bytes += token_bytes(id);
  std::string text;
  text.reserve(bytes.size());
  utf8::append_replacing_invalid(text, bytes, /*final=*/true);
  if (decode_strips_leading_space() && !text.empty() && text[0] == ' ') text.erase(0, 1);
  return text;
}

}  // namespace kiln
