// render_chat against Hugging Face transformers: real chat templates (Llama 2 and 3, Mistral,
// Mixtral, Qwen2.5, SmolLM2, Gemma, Phi-3, DeepSeek-R1-Distill; tests/data/chat_templates/) over
// conversations chosen to reach their edges, each expected byte for byte as
// apply_chat_template(tokenize=False) renders it, or expected to raise where the template calls
// raise_exception. Fixture made by python/make_chat_template_fixture.py.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/text_file.h"
#include "expect_error.h"
#include "kiln/error.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/jinja/template.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

fs::path data_dir() { return fs::path(KILN_TEST_DATA) / "chat_templates"; }

std::string read_text(const fs::path& p) { return read_text_file(p.string(), "test data"); }

// Parsed keeping key order: tojson prints dicts in insertion order, as Python does.
const nlohmann::ordered_json& fixture() {
  static const nlohmann::ordered_json j = nlohmann::ordered_json::parse(read_text(data_dir() / "fixture.json"));
  return j;
}

const std::string& template_source(const std::string& name) {
  static std::map<std::string, std::string> cache;
  auto it = cache.find(name);
  if (it == cache.end()) it = cache.emplace(name, read_text(data_dir() / (name + ".jinja"))).first;
  return it->second;
}

std::vector<ChatMessage> messages_of(const nlohmann::ordered_json& c) {
  std::vector<ChatMessage> messages;
  for (const auto& m : c["messages"]) messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  return messages;
}

std::string render_case(const nlohmann::ordered_json& c) {
  return render_chat(template_source(c["template"].get<std::string>()), messages_of(c),
                     c["add_generation_prompt"].get<bool>(),
                     ChatSpecialTokens{c["bos_token"].get<std::string>(), c["eos_token"].get<std::string>()});
}

TEST(ChatTemplateParity, EveryCaseMatchesTransformers) {
  const auto& cases = fixture()["cases"];
  ASSERT_GE(cases.size(), 200u);
  std::set<std::string> templates;
  size_t rendered = 0, refused = 0;
  for (const auto& c : cases) {
    const std::string label = c["template"].get<std::string>() + " / " + c["conversation"].get<std::string>() +
                              (c["add_generation_prompt"].get<bool>() ? " / add_generation_prompt" : "");
    SCOPED_TRACE(label);
    templates.insert(c["template"].get<std::string>());
    if (c.contains("error")) {
      // The template's own raise_exception message travels in the error.
      test::expect_error([&] { render_case(c); }, c["error"].get<std::string>(), Errc::invalid_argument);
      ++refused;
      continue;
    }
    try {
      EXPECT_EQ(render_case(c), c["expected"].get<std::string>());
      ++rendered;
    } catch (const Error& e) {
      ADD_FAILURE() << "threw: " << e.what();
    }
  }
  EXPECT_GE(templates.size(), 9u);
  EXPECT_GT(refused, 0u);
  std::cout << "[ parity   ] " << rendered << " renders and " << refused << " refusals over " << templates.size()
            << " templates match transformers\n";
}

// The interpreter with everything transformers passes a template, tool definitions and tool calls
// included (render_chat passes only role and content today; the server will pass more).
TEST(ChatTemplateParity, ToolCallingCasesMatchTransformers) {
  const auto& cases = fixture()["variable_cases"];
  ASSERT_GE(cases.size(), 20u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c["template"].get<std::string>() + ": " + c["variables"].dump().substr(0, 300));
    std::map<std::string, jinja::Value> variables;
    for (const auto& [k, v] : c["variables"].items()) variables[k] = jinja::from_json(v);
    const jinja::Template t(template_source(c["template"].get<std::string>()));
    if (c.contains("error")) {
      test::expect_error([&] { t.render(variables); }, c["error"].get<std::string>(), Errc::invalid_argument);
      continue;
    }
    try {
      EXPECT_EQ(t.render(variables), c["expected"].get<std::string>());
    } catch (const Error& e) {
      ADD_FAILURE() << "threw: " << e.what();
    }
  }
}

TEST(ChatTemplateParity, TheOldThreeArgumentCallRendersWithoutSpecialTokens) {
  // SmolLM2 (the default model) never splices bos_token, so the short form renders it fully.
  const std::string out = render_chat(template_source("smollm2-135m-instruct"), {{"user", "Hi"}}, true);
  EXPECT_EQ(out,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplateParity, AModelWithoutATemplateIsRefused) {
  test::expect_error([] { render_chat("", {{"user", "Hi"}}, true); }, "has no chat template", Errc::unsupported);
}

}  // namespace
}  // namespace kiln
