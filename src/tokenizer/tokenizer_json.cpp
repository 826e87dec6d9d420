#include "tokenizer/tokenizer_json.h"

#include <array>
#include <filesystem>
#include <optional>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/text_file.h"
#include "model/safetensors/strict_json.h"
#include "tokenizer/json_bpe_tokenizer.h"

namespace kiln {
namespace {

using nlohmann::json;

// Hugging Face ByteLevel(use_regex=True): GPT-2's regex.
constexpr const char* kGpt2Regex =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

using Spec = TokenizerJsonSpec;

// j[key], or null when j lacks it.
json member(const json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() ? json() : *it;
}

std::string type_of(const json& j) {
  if (!j.is_object()) return j.is_null() ? "null" : j.dump();
  auto it = j.find("type");
  return it != j.end() && it->is_string() ? it->get<std::string>() : "(no type)";
}

bool flag(const json& j, const char* key, bool fallback = false) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  KILN_CHECK(it->is_boolean(), invalid_model, "tokenizer.json: '{}' is not a boolean", key);
  return it->get<bool>();
}

void read_model(const json& model, Spec& spec) {
  KILN_CHECK(model.is_object(), invalid_model, "tokenizer.json has no 'model' object");
  const std::string type = type_of(model);
  // Old files may omit model.type; a vocab plus merges is BPE.
  if (!(type == "BPE" || (type == "(no type)" && model.contains("merges")))) {
    KILN_FAIL(unsupported, "tokenizer.json model type '{}' is not supported; kiln reads byte-level BPE ('BPE')", type);
  }
  spec.byte_fallback = flag(model, "byte_fallback");
  spec.fuse_unk = flag(model, "fuse_unk");
  if (auto it = model.find("unk_token"); it != model.end() && !it->is_null()) {
    KILN_CHECK(it->is_string(), invalid_model, "tokenizer.json model.unk_token is not a string");
    spec.unk_token = it->get<std::string>();
  }
  if (auto it = model.find("dropout"); it != model.end() && !it->is_null()) {
    KILN_CHECK(it->is_number() && it->get<double>() == 0.0, unsupported,
               "tokenizer.json BPE dropout {} is not supported", it->dump());
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = model.find(key);
    KILN_CHECK(it == model.end() || it->is_null() || (it->is_string() && it->get<std::string>().empty()), unsupported,
               "tokenizer.json BPE {} {} is not supported", key, it->dump());
  }
  spec.ignore_merges = flag(model, "ignore_merges");

  const json& vocab = model.at("vocab");
  KILN_CHECK(vocab.is_object(), invalid_model, "tokenizer.json model.vocab is not an object");
  KILN_CHECK(vocab.size() <= size_t(INT32_MAX), invalid_model, "tokenizer.json model.vocab is too large");
  for (const auto& [text, id_json] : vocab.items()) {
    KILN_CHECK(id_json.is_number_integer(), invalid_model, "tokenizer.json vocab entry '{}' has a non-integer id",
               text);
    const int64_t id = id_json.get<int64_t>();
    KILN_CHECK(id >= 0 && id < int64_t(vocab.size()) * 2 + 1024, invalid_model,
               "tokenizer.json vocab entry '{}' has id {} (out of range)", text, id);
    KILN_CHECK(!text.empty(), invalid_model, "tokenizer.json vocab has an empty token");
    if (size_t(id) >= spec.vocab.size()) spec.vocab.resize(size_t(id) + 1);
    KILN_CHECK(spec.vocab[id].empty(), invalid_model, "tokenizer.json vocab gives id {} to both '{}' and '{}'", id,
               spec.vocab[id], text);
    spec.vocab[id] = text;
  }

  auto merges_it = model.find("merges");
  if (merges_it == model.end() || merges_it->is_null()) return;
  KILN_CHECK(merges_it->is_array(), invalid_model, "tokenizer.json model.merges is not an array");
  spec.merges.reserve(merges_it->size());
  for (const json& m : *merges_it) {
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      KILN_CHECK(space != std::string::npos && s.find(' ', space + 1) == std::string::npos, invalid_model,
                 "tokenizer.json merge '{}' is not two tokens separated by one space", s);
      spec.merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else {
      KILN_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(), invalid_model,
                 "tokenizer.json merge {} is neither \"a b\" nor [a, b]", m.dump());
      spec.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    }
  }
}

// One step of the pre-tokenizer; returns true for ByteLevel (which must come last).
bool read_pre_step(const json& step, Spec& spec) {
  const std::string type = type_of(step);
  if (type == "ByteLevel") {
    KILN_CHECK(!flag(step, "add_prefix_space"), unsupported,
               "tokenizer.json pre_tokenizer ByteLevel with add_prefix_space true is not supported");
    if (flag(step, "use_regex", true)) spec.regexes.emplace_back(kGpt2Regex);
    return true;
  }
  if (type == "Split") {
    const std::string behavior = step.contains("behavior") && step["behavior"].is_string()
                                     ? step["behavior"].get<std::string>()
                                     : "(none)";
    KILN_CHECK(behavior == "Isolated", unsupported,
               "tokenizer.json pre_tokenizer Split with behavior '{}' is not supported (only Isolated)", behavior);
    KILN_CHECK(!flag(step, "invert"), unsupported, "tokenizer.json pre_tokenizer Split with invert true is not supported");
    const json* pattern = step.contains("pattern") ? &step["pattern"] : nullptr;
    KILN_CHECK(pattern != nullptr && pattern->is_object(), invalid_model, "tokenizer.json Split has no pattern object");
    auto regex = pattern->find("Regex");
    KILN_CHECK(regex != pattern->end() && regex->is_string(), unsupported,
               "tokenizer.json pre_tokenizer Split pattern {} is not supported (only {{\"Regex\": ...}})",
               pattern->dump());
    spec.regexes.push_back(regex->get<std::string>());
    return false;
  }
  if (type == "Digits") {
    spec.regexes.emplace_back(flag(step, "individual_digits") ? "\\p{N}" : "\\p{N}+");
    return false;
  }
  KILN_FAIL(unsupported,
            "tokenizer.json pre_tokenizer '{}' is not supported (kiln reads ByteLevel, Split, Digits, Metaspace)", type);
}

void read_metaspace(const json& step, Spec& spec) {
  spec.byte_level = false;
  spec.metaspace.enabled = true;
  spec.metaspace.replacement = step.value("replacement", std::string("\xE2\x96\x81"));
  KILN_CHECK(!spec.metaspace.replacement.empty(), invalid_model, "tokenizer.json Metaspace replacement is empty");
  spec.metaspace.split = flag(step, "split", true);
  // Files from before prepend_scheme existed say add_prefix_space instead.
  const std::string scheme = step.contains("prepend_scheme") && step["prepend_scheme"].is_string()
                                 ? step["prepend_scheme"].get<std::string>()
                                 : (flag(step, "add_prefix_space", true) ? "always" : "never");
  if (scheme == "always") {
    spec.metaspace.prepend = Spec::Metaspace::always;
  } else if (scheme == "first") {
    spec.metaspace.prepend = Spec::Metaspace::first;
  } else if (scheme == "never") {
    spec.metaspace.prepend = Spec::Metaspace::never;
  } else {
    KILN_FAIL(invalid_model, "tokenizer.json Metaspace prepend_scheme '{}' is not always/first/never", scheme);
  }
}

void read_pre_tokenizer(const json& pre, Spec& spec) {
  const std::string type = type_of(pre);
  // SentencePiece-style: no pre-tokenizer (the normalizer spells the spaces) or Metaspace.
  if (pre.is_null()) {
    spec.byte_level = false;
    return;
  }
  if (type == "Metaspace") {
    read_metaspace(pre, spec);
    return;
  }
  bool byte_level_last = false;
  if (type == "Sequence") {
    const json& steps = pre.at("pretokenizers");
    KILN_CHECK(steps.is_array(), invalid_model, "tokenizer.json pre_tokenizer Sequence has no pretokenizers array");
    if (steps.size() == 1 && type_of(steps[0]) == "Metaspace") {
      read_metaspace(steps[0], spec);
      return;
    }
    for (size_t i = 0; i < steps.size(); ++i) {
      const bool is_byte_level = read_pre_step(steps[i], spec);
      KILN_CHECK(!is_byte_level || i + 1 == steps.size(), unsupported,
                 "tokenizer.json pre_tokenizer Sequence with ByteLevel before other steps is not supported");
      byte_level_last = is_byte_level;
    }
  } else {
    byte_level_last = read_pre_step(pre, spec);
  }
  KILN_CHECK(byte_level_last, unsupported,
             "tokenizer.json pre_tokenizer '{}' does not end in ByteLevel (byte-level BPE) and is not Metaspace "
             "(SentencePiece-style BPE); kiln reads those two forms",
             type);
}

void read_normalizer(const json& normalizer, Spec& spec) {
  if (normalizer.is_null()) return;
  const std::string type = type_of(normalizer);
  if (type == "Sequence") {
    const json& steps = member(normalizer, "normalizers");
    KILN_CHECK(steps.is_array(), invalid_model, "tokenizer.json normalizer Sequence has no normalizers array");
    for (const json& step : steps) read_normalizer(step, spec);
  } else if (type == "NFC") {
    spec.normalizer.add({Normalizer::Step::nfc, "", ""});
  } else if (type == "Prepend") {
    const json prepend = member(normalizer, "prepend");
    KILN_CHECK(prepend.is_string(), invalid_model, "tokenizer.json Prepend normalizer has no prepend string");
    spec.normalizer.add({Normalizer::Step::prepend, "", prepend.get<std::string>()});
  } else if (type == "Replace") {
    const json pattern = member(normalizer, "pattern");
    const json content = member(normalizer, "content");
    KILN_CHECK(pattern.is_object() && pattern.contains("String") && pattern["String"].is_string(), unsupported,
               "tokenizer.json Replace normalizer pattern {} is not supported (only {{\"String\": ...}})",
               pattern.dump());
    KILN_CHECK(content.is_string(), invalid_model, "tokenizer.json Replace normalizer has no content string");
    spec.normalizer.add({Normalizer::Step::replace, pattern["String"].get<std::string>(), content.get<std::string>()});
  } else {
    KILN_FAIL(unsupported, "tokenizer.json normalizer '{}' is not supported (kiln reads NFC, Prepend, Replace)", type);
  }
}

// One decoder step of the SentencePiece-style form.
void read_sentencepiece_decoder(const json& step, Spec& spec) {
  const std::string type = type_of(step);
  if (type == "Replace") {
    const json pattern = member(step, "pattern");
    KILN_CHECK(pattern.is_object() && pattern.contains("String") && pattern["String"].is_string() &&
                   member(step, "content") == json(" "),
               unsupported, "tokenizer.json decoder Replace {} is not supported (only a String -> \" \")", step.dump());
    spec.decode_space_mark = pattern["String"].get<std::string>();
  } else if (type == "ByteFallback") {
    spec.decode_byte_fallback = true;
  } else if (type == "Fuse") {
    // Joining the pieces is what decode does anyway.
  } else if (type == "Strip") {
    const json start = member(step, "start"), stop = member(step, "stop");
    KILN_CHECK(member(step, "content") == json(" ") && start.is_number_integer() && start.get<int64_t>() <= 1 &&
                   stop == json(0),
               unsupported, "tokenizer.json decoder Strip {} is not supported (only one leading space)", step.dump());
    spec.decode_strip_leading_space = start.get<int64_t>() == 1;
  } else if (type == "Metaspace") {
    spec.decode_space_mark = step.value("replacement", std::string("\xE2\x96\x81"));
    const std::string scheme = step.contains("prepend_scheme") && step["prepend_scheme"].is_string()
                                   ? step["prepend_scheme"].get<std::string>()
                                   : (flag(step, "add_prefix_space", true) ? "always" : "never");
    spec.decode_strip_leading_space = scheme != "never";
  } else {
    KILN_FAIL(unsupported,
              "tokenizer.json decoder '{}' is not supported for SentencePiece-style BPE (kiln reads Replace, "
              "ByteFallback, Fuse, Strip, Metaspace)",
              type);
  }
}

void read_decoder(const json& decoder, Spec& spec) {
  if (decoder.is_null()) return;
  const std::string type = type_of(decoder);
  if (spec.byte_level) {
    KILN_CHECK(type == "ByteLevel", unsupported, "tokenizer.json decoder '{}' is not supported (only ByteLevel)", type);
    return;
  }
  if (type == "Sequence") {
    const json& steps = member(decoder, "decoders");
    KILN_CHECK(steps.is_array(), invalid_model, "tokenizer.json decoder Sequence has no decoders array");
    for (const json& step : steps) read_sentencepiece_decoder(step, spec);
  } else {
    read_sentencepiece_decoder(decoder, spec);
  }
}

void read_added_tokens(const json& added, Spec& spec) {
  if (added.is_null()) return;
  KILN_CHECK(added.is_array(), invalid_model, "tokenizer.json added_tokens is not an array");
  for (const json& t : added) {
    KILN_CHECK(t.is_object() && t.contains("id") && t["id"].is_number_integer() && t.contains("content") &&
                   t["content"].is_string(),
               invalid_model, "tokenizer.json added token {} lacks an integer id or a string content", t.dump());
    const int64_t id = t["id"].get<int64_t>();
    const std::string content = t["content"].get<std::string>();
    KILN_CHECK(id >= 0 && id < int64_t(spec.vocab.size()) + int64_t(added.size()) + 1024, invalid_model,
               "tokenizer.json added token '{}' has id {} (out of range)", content, id);
    KILN_CHECK(!flag(t, "single_word"), unsupported,
               "tokenizer.json added token '{}' with single_word true is not supported", content);
    spec.added.push_back({content, int32_t(id), flag(t, "special"), flag(t, "lstrip"), flag(t, "rstrip")});
  }
}

// bos_token / eos_token: a string, {"content": ...}, or null.
std::optional<std::string> token_text(const json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  KILN_FAIL(invalid_model, "tokenizer_config.json {} is {}, not a string or {{\"content\": ...}}", key, it->dump());
}

// Whether the post-processor prepends BOS: a TemplateProcessing whose single template starts with it.
bool post_processor_adds(const json& post, const std::string& bos) {
  if (!post.is_object()) return false;
  const std::string type = type_of(post);
  if (type == "Sequence" && post.contains("processors") && post["processors"].is_array()) {
    for (const json& p : post["processors"]) {
      if (post_processor_adds(p, bos)) return true;
    }
    return false;
  }
  if (type != "TemplateProcessing" || !post.contains("single") || !post["single"].is_array() || post["single"].empty())
    return false;
  const json& first = post["single"][0];
  return first.is_object() && first.contains("SpecialToken") && first["SpecialToken"].is_object() &&
         first["SpecialToken"].value("id", std::string()) == bos;
}

}  // namespace

std::unique_ptr<Tokenizer> tokenizer_from_json_text(std::string_view tokenizer_json,
                                                    std::string_view tokenizer_config_json,
                                                    const std::vector<int32_t>& extra_end_ids) {
  const json doc = parse_strict_json(tokenizer_json, "tokenizer.json");
  const json config = tokenizer_config_json.empty() ? json::object()
                                                     : parse_strict_json(tokenizer_config_json, "tokenizer_config.json");
  try {
    KILN_CHECK(doc.is_object(), invalid_model, "tokenizer.json is not a JSON object");
    KILN_CHECK(config.is_object(), invalid_model, "tokenizer_config.json is not a JSON object");
    Spec spec;
    read_model(member(doc, "model"), spec);
    read_normalizer(member(doc, "normalizer"), spec);
    read_pre_tokenizer(member(doc, "pre_tokenizer"), spec);
    read_decoder(member(doc, "decoder"), spec);
    read_added_tokens(member(doc, "added_tokens"), spec);
    spec.end_ids = extra_end_ids;

    auto id_of = [&](const std::string& text, const char* key) -> int32_t {
      for (const Spec::AddedToken& t : spec.added) {
        if (t.content == text) return t.id;
      }
      for (size_t id = 0; id < spec.vocab.size(); ++id) {
        if (spec.vocab[id] == text) return int32_t(id);
      }
      KILN_FAIL(invalid_model, "tokenizer_config.json {} '{}' is not in the vocabulary", key, text);
    };
    const std::optional<std::string> bos = token_text(config, "bos_token");
    const std::optional<std::string> eos = token_text(config, "eos_token");
    if (bos) spec.bos_id = id_of(*bos, "bos_token");
    if (eos) spec.eos_id = id_of(*eos, "eos_token");
    if (auto it = config.find("add_bos_token"); it != config.end() && it->is_boolean()) {
      spec.add_bos = it->get<bool>();
    } else if (bos) {
      spec.add_bos = post_processor_adds(member(doc, "post_processor"), *bos);
    }
    return make_json_bpe_tokenizer(std::move(spec));
  } catch (const nlohmann::json::exception& e) {
    KILN_FAIL(invalid_model, "tokenizer.json is malformed: {}", e.what());
  }
}

std::unique_ptr<Tokenizer> load_tokenizer_json(const std::string& path, const std::vector<int32_t>& extra_end_ids) {
  namespace fs = std::filesystem;
  const std::string text = read_text_file(path, "tokenizer.json");
  const fs::path config_path = fs::path(path).parent_path() / "tokenizer_config.json";
  const std::string config =
      fs::exists(config_path) ? read_text_file(config_path.string(), "tokenizer_config.json") : std::string();
  return tokenizer_from_json_text(text, config, extra_end_ids);
}

}  // namespace kiln
