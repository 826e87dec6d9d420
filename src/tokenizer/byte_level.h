// GPT-2's byte-level alphabet (openai/gpt-2 encoder.py, bytes_to_unicode): every byte is spelled
// as one printable code point, so a vocabulary of strings can hold arbitrary bytes. Printable
// Latin-1 bytes stand for themselves; the other 68 bytes map, in order, to U+0100..U+0143
// (so the space 0x20 is 'Ġ' U+0120 and the newline 0x0A is 'Ċ' U+010A).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kiln::byte_level {

// The code point that spells `byte`.
uint32_t byte_to_code_point(uint8_t byte);
// The byte a code point spells, or -1 when the code point is not part of the alphabet.
int code_point_to_byte(uint32_t code_point);

// The UTF-8 spelling of one byte (1 or 2 bytes long).
std::string_view spell_byte(uint8_t byte);

// Raw bytes -> their byte-level spelling.
std::string encode(std::string_view raw);
// Byte-level spelling -> raw bytes. Characters outside the alphabet (and invalid UTF-8) are
// copied through unchanged, so a token that is not byte-level (an added token) stays readable.
std::string decode(std::string_view spelled);

}  // namespace kiln::byte_level
