#include "tokenizer/jinja/lexer.h"

#include "core/check.h"
#include "tokenizer/utf8.h"

namespace kiln::jinja {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

int count_newlines(std::string_view s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

// Jinja reads templates with universal newlines and, with keep_trailing_newline=False, drops one
// final newline.
std::string normalize_newlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

int hex_value(char c) {
  if (is_digit(c)) return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The body of a string literal with Python's unicode-escape rules, which Jinja applies.
std::string decode_string_literal(std::string_view body, int line) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 == body.size()) {
      out += body[i];
      continue;
    }
    const char e = body[++i];
    switch (e) {
      case '\n': break;  // a backslash-newline continues the line
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'v': out += '\v'; break;
      case 'x': case 'u': case 'U': {
        const size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        uint32_t cp = 0;
        for (size_t k = 0; k < digits; ++k) {
          const int h = i + 1 + k < body.size() ? hex_value(body[i + 1 + k]) : -1;
          KILN_CHECK(h >= 0, invalid_argument, "chat template line {}: truncated \\{} escape in a string literal",
                     line, e);
          cp = cp * 16 + uint32_t(h);
        }
        KILN_CHECK(cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF), unsupported,
                   "chat template line {}: the escape \\{} names no encodable character", line, e);
        i += digits;
        utf8::append(out, cp);
        break;
      }
      case 'N':
        KILN_FAIL(unsupported, "chat template line {}: \\N{{...}} escapes in string literals are not supported", line);
      default:
        if (e >= '0' && e <= '7') {  // up to three octal digits
          uint32_t cp = uint32_t(e - '0');
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; ++k)
            cp = cp * 8 + uint32_t(body[++i] - '0');
          utf8::append(out, cp);
        } else {  // Python keeps unknown escapes as written
          out += '\\';
          out += e;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) : src_(normalize_newlines(source)) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      const size_t tag = find_tag_start(pos_);
      if (tag == std::string::npos) {
        emit_text(src_.substr(pos_));
        pos_ = src_.size();
        break;
      }
      const char kind = src_[tag + 1];  // '{', '%' or '#'
      const char sign = tag + 2 < src_.size() && (src_[tag + 2] == '-' || src_[tag + 2] == '+') ? src_[tag + 2] : 0;
      const bool raw = kind == '%' && raw_begin_length(tag) > 0;
      emit_text(strip_before_tag(src_.substr(pos_, tag - pos_), sign, kind != '{'));
      line_ += count_newlines(src_.substr(pos_, tag - pos_));
      line_starting_ = false;
      if (raw) {
        lex_raw(tag);
      } else if (kind == '#') {
        lex_comment(tag + 2 + (sign ? 1 : 0));
      } else {
        lex_tag(tag + 2 + (sign ? 1 : 0), kind == '%');
      }
    }
    tokens_.push_back({Token::Kind::end, "", line_});
    return std::move(tokens_);
  }

 private:
  size_t find_tag_start(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return std::string::npos;
  }

  // Whitespace control on the text before a tag: "-" strips all whitespace; otherwise
  // lstrip_blocks removes the spaces and tabs between the line start and a {% or {# tag.
  std::string strip_before_tag(std::string_view text, char sign, bool is_block_or_comment) const {
    if (sign == '-') {
      size_t end = text.size();
      while (end > 0 && is_space(text[end - 1])) --end;
      return std::string(text.substr(0, end));
    }
    if (sign == '+' || !is_block_or_comment) return std::string(text);
    const size_t nl = text.rfind('\n');
    const size_t line_start = nl == std::string_view::npos ? 0 : nl + 1;
    if (line_start == 0 && !line_starting_) return std::string(text);
    const std::string_view tail = text.substr(line_start);
    bool only_space = !tail.empty();
    for (char c : tail) only_space = only_space && is_space(c);
    return std::string(only_space ? text.substr(0, line_start) : text);
  }

  void emit_text(const std::string& text) {
    if (!text.empty()) tokens_.push_back({Token::Kind::text, text, line_});
  }

  // After an end delimiter: "-" strips the whitespace that follows; a plain %} or #} drops one
  // newline (trim_blocks).
  void consume_after_end(char sign, bool trims_newline) {
    const size_t start = pos_;
    if (sign == '-') {
      while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
    } else if (sign != '+' && trims_newline && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
    }
    line_ += count_newlines(std::string_view(src_).substr(start, pos_ - start));
    // Jinja asks whether the whole match of the end delimiter ended with a newline.
    line_starting_ = pos_ > start && src_[pos_ - 1] == '\n';
  }

  void lex_comment(size_t body_start) {
    const size_t close = src_.find("#}", body_start);
    KILN_CHECK(close != std::string::npos, invalid_argument, "chat template line {}: missing end of comment tag #}}",
               line_);
    char sign = 0;
    if (close > body_start && (src_[close - 1] == '-' || src_[close - 1] == '+')) sign = src_[close - 1];
    line_ += count_newlines(std::string_view(src_).substr(body_start, close - body_start));
    pos_ = close + 2;
    consume_after_end(sign, true);
  }

  // Length of "{% raw %}" (with signs and spaces) at `tag`, or 0 when the block is not raw.
  size_t raw_begin_length(size_t tag) const {
    size_t i = tag + 2;
    if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) ++i;
    while (i < src_.size() && is_space(src_[i])) ++i;
    if (src_.compare(i, 3, "raw") != 0) return 0;
    i += 3;
    while (i < src_.size() && is_space(src_[i])) ++i;
    if (src_.compare(i, 3, "-%}") == 0) return i + 3 - tag;
    if (src_.compare(i, 2, "%}") == 0) return i + 2 - tag;
    return 0;
  }

  void lex_raw(size_t tag) {
    const int begin_line = line_;
    const size_t begin_len = raw_begin_length(tag);
    pos_ = tag + begin_len;
    // {% raw -%} strips what follows; a plain {% raw %} keeps its newline (no trim_blocks here).
    consume_after_end(src_[tag + begin_len - 3] == '-' ? '-' : '+', false);
    for (size_t i = src_.find("{%", pos_); i != std::string::npos; i = src_.find("{%", i + 1)) {
      size_t j = i + 2;
      const char sign = j < src_.size() && (src_[j] == '-' || src_[j] == '+') ? src_[j] : 0;
      if (sign) ++j;
      while (j < src_.size() && is_space(src_[j])) ++j;
      if (src_.compare(j, 6, "endraw") != 0) continue;
      j += 6;
      while (j < src_.size() && is_space(src_[j])) ++j;
      char end_sign = 0;
      if (j < src_.size() && (src_[j] == '-' || src_[j] == '+')) end_sign = src_[j++];
      if (src_.compare(j, 2, "%}") != 0) continue;
      const std::string_view body = std::string_view(src_).substr(pos_, i - pos_);
      emit_text(strip_before_tag(body, sign, true));
      line_ += count_newlines(body);
      pos_ = j + 2;
      consume_after_end(end_sign, true);
      return;
    }
    KILN_FAIL(invalid_argument, "chat template line {}: {{% raw %}} without {{% endraw %}}", begin_line);
  }

  void lex_tag(size_t start, bool is_block) {
    const int tag_line = line_;
    tokens_.push_back({is_block ? Token::Kind::block_begin : Token::Kind::print_begin, "", line_});
    pos_ = start;
    std::vector<char> open;  // brackets awaiting their closer; end delimiters count only outside them
    for (;;) {
      while (pos_ < src_.size() && is_space(src_[pos_])) line_ += src_[pos_++] == '\n';
      KILN_CHECK(pos_ < src_.size(), invalid_argument, "chat template line {}: {} is never closed", tag_line,
                 is_block ? "{%" : "{{");
      if (open.empty() && try_end_delimiter(is_block)) return;
      lex_expression_token(open);
    }
  }

  bool try_end_delimiter(bool is_block) {
    const std::string_view rest = std::string_view(src_).substr(pos_);
    const std::string_view close = is_block ? "%}" : "}}";
    char sign = 0;
    if ((rest.size() >= 3 && (rest[0] == '-' || (rest[0] == '+' && is_block)) && rest.substr(1, 2) == close)) {
      sign = rest[0];
      pos_ += 3;
    } else if (rest.substr(0, 2) == close) {
      pos_ += 2;
    } else {
      return false;
    }
    tokens_.push_back({is_block ? Token::Kind::block_end : Token::Kind::print_end, "", line_});
    consume_after_end(sign, is_block);
    return true;
  }

  void lex_expression_token(std::vector<char>& open) {
    const char c = src_[pos_];
    if (is_name_start(c)) {
      size_t end = pos_;
      while (end < src_.size() && is_name_char(src_[end])) ++end;
      tokens_.push_back({Token::Kind::name, src_.substr(pos_, end - pos_), line_});
      pos_ = end;
    } else if (is_digit(c)) {
      lex_number();
    } else if (c == '\'' || c == '"') {
      lex_string(c);
    } else {
      lex_operator(open);
    }
  }

  void lex_number() {
    auto digits = [&](size_t i) {
      std::string d;
      while (i < src_.size() && (is_digit(src_[i]) || (src_[i] == '_' && i + 1 < src_.size() && is_digit(src_[i + 1]))))
        if (src_[i++] != '_') d += src_[i - 1];
      return std::make_pair(d, i);
    };
    if (src_[pos_] == '0' && pos_ + 1 < src_.size() && std::string_view("xXoObB").find(src_[pos_ + 1]) != std::string_view::npos) {
      const int base = (src_[pos_ + 1] | 0x20) == 'x' ? 16 : (src_[pos_ + 1] | 0x20) == 'o' ? 8 : 2;
      size_t i = pos_ + 2;
      int64_t v = 0;
      bool any = false;
      for (; i < src_.size(); ++i) {
        if (src_[i] == '_') continue;
        const int h = hex_value(src_[i]);
        if (h < 0 || h >= base) break;
        v = v * base + h;
        any = true;
      }
      KILN_CHECK(any, invalid_argument, "chat template line {}: malformed number literal", line_);
      tokens_.push_back({Token::Kind::integer, std::to_string(v), line_});
      pos_ = i;
      return;
    }
    auto [whole, i] = digits(pos_);
    std::string text = whole;
    bool is_float = false;
    if (i + 1 < src_.size() && src_[i] == '.' && is_digit(src_[i + 1])) {
      auto [frac, j] = digits(i + 1);
      text += "." + frac;
      i = j;
      is_float = true;
    }
    if (i < src_.size() && (src_[i] == 'e' || src_[i] == 'E')) {
      size_t j = i + 1;
      std::string exp = "e";
      if (j < src_.size() && (src_[j] == '+' || src_[j] == '-')) exp += src_[j++];
      if (j < src_.size() && is_digit(src_[j])) {
        auto [e, k] = digits(j);
        text += exp + e;
        i = k;
        is_float = true;
      }
    }
    tokens_.push_back({is_float ? Token::Kind::floating : Token::Kind::integer, text, line_});
    pos_ = i;
  }

  void lex_string(char quote) {
    size_t i = pos_ + 1;
    const int start_line = line_;
    while (i < src_.size() && src_[i] != quote) {
      if (src_[i] == '\\') ++i;
      ++i;
    }
    KILN_CHECK(i < src_.size(), invalid_argument, "chat template line {}: unterminated string literal", start_line);
    const std::string_view body = std::string_view(src_).substr(pos_ + 1, i - pos_ - 1);
    tokens_.push_back({Token::Kind::string, decode_string_literal(body, start_line), start_line});
    line_ += count_newlines(body);
    pos_ = i + 1;
  }

  void lex_operator(std::vector<char>& open) {
    static const char* const kTwoChar[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* op : kTwoChar) {
      if (src_.compare(pos_, 2, op) == 0) {
        tokens_.push_back({Token::Kind::op, op, line_});
        pos_ += 2;
        return;
      }
    }
    const char c = src_[pos_];
    KILN_CHECK(std::string_view("+-/*%~[](){}><=.:|,;").find(c) != std::string_view::npos, invalid_argument,
               "chat template line {}: unexpected character '{}'", line_, c);
    if (c == '(' || c == '[' || c == '{') open.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    if (c == ')' || c == ']' || c == '}') {
      KILN_CHECK(!open.empty(), invalid_argument, "chat template line {}: unexpected '{}'", line_, c);
      KILN_CHECK(open.back() == c, invalid_argument, "chat template line {}: unexpected '{}', expected '{}'", line_, c,
                 open.back());
      open.pop_back();
    }
    tokens_.push_back({Token::Kind::op, std::string(1, c), line_});
    ++pos_;
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;  // the previous match ended a line: lstrip_blocks may apply at column 0
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source) { return Lexer(source).run(); }

}  // namespace kiln::jinja
