// UTF-8 helpers the tokenizer needs: encoding a code point, measuring valid text, and decoding
// with replacement. Invalid input is data here, never an error: the tokenizer must accept any
// bytes, and the detokenizer must always produce valid UTF-8.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kiln::utf8 {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Appends the UTF-8 encoding of a code point (<= U+10FFFF, not a surrogate).
void append(std::string& out, uint32_t code_point);

// What the bytes at the front of `bytes` are.
struct Scan {
  enum Kind { valid, invalid, incomplete } kind;
  // valid: the character's length. invalid: how many bytes one U+FFFD replaces (the maximal
  // subpart, as Unicode §3.9 and Python's errors="replace" count it). incomplete: the length of
  // the prefix seen so far, which more bytes could still complete.
  size_t length;
};
// `bytes` must not be empty.
Scan scan(std::string_view bytes);

// Length of the longest prefix of `bytes` that is valid UTF-8.
size_t valid_prefix_length(std::string_view bytes);

// Appends `bytes` to `out` with each invalid sequence replaced by U+FFFD. When `final` is false,
// a trailing incomplete character is left out instead; returns how many bytes were consumed.
size_t append_replacing_invalid(std::string& out, std::string_view bytes, bool final);

}  // namespace kiln::utf8
