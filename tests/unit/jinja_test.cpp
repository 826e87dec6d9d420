// The Jinja interpreter against Jinja2 itself: each case's expected text is what transformers'
// compiled environment (trim_blocks, lstrip_blocks, its tojson) renders for the same template and
// variables (recorded with jinja2 3.1.6 / transformers 5.x), then the errors kiln must raise.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <string>

#include "expect_error.h"
#include "kiln/error.h"
#include "tokenizer/jinja/template.h"

namespace kiln::jinja {
namespace {

using test::expect_error;

struct RenderCase {
  const char* source;
  const char* variables_json;
  const char* expected;
};

std::string render(const std::string& source, const std::string& variables_json = "{}") {
  std::map<std::string, Value> variables;
  const auto parsed = nlohmann::ordered_json::parse(variables_json);
  for (const auto& [k, v] : parsed.items()) variables[k] = from_json(v);
  return Template(source).render(variables);
}

void check_cases(const RenderCase* begin, const RenderCase* end) {
  for (const RenderCase* c = begin; c != end; ++c) {
    SCOPED_TRACE(c->source);
    try {
      EXPECT_EQ(render(c->source, c->variables_json), c->expected);
    } catch (const Error& e) {
      ADD_FAILURE() << "threw: " << e.what();
    }
  }
}

// clang-format off
const RenderCase kExpressionsCases[] = {
    {"{{ 1 + 2 * 3 }}|{{ (1 + 2) * 3 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ -7 % 3 }}|{{ 7 / 2 }}|{{ 4 / 2 }}|{{ 2 ** 10 }}",
     "{}",
     "7|9|3|-4|2|3.5|2.0|1024"},
    {"{{ 'a' ~ 1 ~ none ~ true }}|{{ 'ab' * 3 }}|{{ [1] + [2, 3] }}|{{ 1.5 + 1 }}|{{ 0.1 + 0.2 }}|{{ 1e20 }}|{{ 1e-5 }}|{{ 3.0 }}",
     "{}",
     "a1NoneTrue|ababab|[1, 2, 3]|2.5|0.30000000000000004|1e+20|1e-05|3.0"},
    {"{{ 1 == 1.0 }}{{ true == 1 }}{{ 'a' < 'b' }}{{ [1, 2] == [1, 2] }}{{ 1 < 2 < 3 }}{{ 3 > 2 > 5 }}{{ 'a' != 'b' }}",
     "{}",
     "TrueTrueTrueTrueTrueFalseTrue"},
    {"{{ 'b' in 'abc' }}{{ 2 in [1, 2] }}{{ 'k' in {'k': 1} }}{{ 'z' not in 'abc' }}{{ not true }}{{ not 0 and 1 }}",
     "{}",
     "TrueTrueTrueTrueFalse1"},
    {"{{ 0 or 'x' }}|{{ 'y' and 'z' }}|{{ none or [] }}|{{ 'a' if x else 'b' }}|{{ 'a' if not x }}|",
     "{\"x\": 0}",
     "x|z|[]|b|a|"},
    {"{{ xs[0] }}{{ xs[-1] }}{{ xs[1:] }}{{ xs[:-1] }}{{ xs[::-1] }}{{ xs[::2] }}{{ s[1:3] }}{{ s[-1] }}{{ s|length }}",
     "{\"xs\": [1, 2, 3], \"s\": \"héllo\"}",
     "13[2, 3][1, 2][3, 2, 1][1, 3]élo5"},
    {"{{ d.a }}|{{ d['b'] }}|{{ d.missing }}|{{ d['missing'] }}|{{ xs[10] }}|{{ d.a.b }}",
     "{\"d\": {\"a\": 1, \"b\": [2]}, \"xs\": [1]}",
     "1|[2]||||"},
    {"{{ [1, 'a', none, true, 1.5, {'k': \"it's\"}] }}|{{ (1,) }}|{{ (1, 'b') }}|{{ {'a': [1, {'b': none}]} }}",
     "{}",
     "[1, 'a', None, True, 1.5, {'k': \"it's\"}]|(1,)|(1, 'b')|{'a': [1, {'b': None}]}"},
    {"{{ 'x\\ny\\t\\'q\\\"' }}|{{ \"\\u00e9\\x41\" }}|{{ 'a' 'b' }}",
     "{}",
     "x\ny\t'q\"|éA|ab"},
    {"{{ -x }}|{{ +x }}|{{ -1.5 }}|{{ 1_000 }}|{{ 0x1f }}",
     "{\"x\": 3}",
     "-3|3|-1.5|1000|31"},
};

const RenderCase kMethodsCases[] = {
    {"{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  a '.lstrip() }}|{{ ' a  '.rstrip() }}|{{ s.strip() }}",
     "{\"s\": \"　 hi \\n\"}",
     "a b|a|a | a|hi"},
    {"{{ 'a b  c'.split() }}{{ 'a,b,,c'.split(',') }}{{ 'a,b,c'.split(',', 1) }}{{ 'a,b,c'.rsplit(',', 1) }}{{ ' x y '.split(' ') }}",
     "{}",
     "['a', 'b', 'c']['a', 'b', '', 'c']['a', 'b,c']['a,b', 'c']['', 'x', 'y', '']"},
    {"{{ 'Hello'.startswith('He') }}{{ 'Hello'.endswith(('x', 'lo')) }}{{ 'abc'.upper() }}{{ 'ABC'.lower() }}{{ 'hello world'.title() }}{{ 'they\\'re'.title() }}",
     "{}",
     "TrueTrueABCabcHello WorldThey'Re"},
    {"{{ 'aXbX'.replace('X', '-') }}|{{ 'aXbX'.replace('X', '-', 1) }}|{{ 'abcabc'.find('c') }}|{{ 'abc'.capitalize() }}|{{ '-'.join(['a', 'b']) }}",
     "{}",
     "a-b-|a-bX|2|Abc|a-b"},
    {"{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{{ d.keys()|list }}{{ d.values()|list }}{{ d.get('a') }}{{ d.get('z') }}{{ d.get('z', 9) }}",
     "{\"d\": {\"b\": 1, \"a\": 2}}",
     "b=1;a=2;['b', 'a'][1, 2]2None9"},
    {"{{ 'a\\nb\\r\\nc'.splitlines() }}|{{ 'x'.isdigit() }}{{ '12'.isdigit() }}",
     "{}",
     "['a', 'b', 'c']|FalseTrue"},
};

const RenderCase kFiltersCases[] = {
    {"{{ '  x  '|trim }}|{{ 'abc'|upper }}|{{ 'ABC'|lower }}|{{ 'ab cd'|title }}|{{ 'ab cd'|capitalize }}|{{ [1, 2]|length }}|{{ 'héllo'|length }}|{{ {'a': 1}|length }}",
     "{}",
     "x|ABC|abc|Ab Cd|Ab cd|2|5|1"},
    {"{{ [3, 1, 2]|first }}{{ [3, 1, 2]|last }}{{ 'abc'|first }}{{ [1, 2]|join(', ') }}{{ ['a', 'b']|join }}{{ [{'n': 'x'}, {'n': 'y'}]|join('/', attribute='n') }}",
     "{}",
     "32a1, 2abx/y"},
    {"{{ x|default('d') }}|{{ ''|default('d') }}|{{ ''|default('d', true) }}|{{ none|default('d') }}|{{ 0|d('z', boolean=true) }}",
     "{}",
     "d||d|None|z"},
    {"{{ 'aXa'|replace('a', 'b') }}|{{ 3.7|int }}|{{ '42'|int }}|{{ 'x'|int }}|{{ '4.5'|float }}|{{ 42|string ~ '!' }}|{{ 'ab'|list }}|{{ d|items|list }}",
     "{\"d\": {\"k\": \"v\"}}",
     "bXb|3|42|0|4.5|42!|['a', 'b']|[('k', 'v')]"},
    {"{{ xs|selectattr('role', 'equalto', 'user')|map(attribute='content')|join(',') }}|{{ xs|rejectattr('role', 'equalto', 'user')|list|length }}|{{ xs|map(attribute='role')|unique|list }}",
     "{\"xs\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\"}, {\"role\": \"user\", \"content\": \"c\"}]}",
     "a,c|1|['user', 'assistant']"},
    {"{{ [' a ', 'b ']|map('trim')|list }}|{{ [1, 2, 3, 4]|select('odd')|list }}|{{ [1, 2, 3]|reject('equalto', 2)|list }}|{{ ['b', 'A', 'c']|sort }}|{{ [3, 1, 2]|sort(reverse=true) }}|{{ [1, 2]|reverse|list }}|{{ [1, 2, 3]|sum }}",
     "{}",
     "['a', 'b']|[1, 3]|[1, 3]|['A', 'b', 'c']|[3, 2, 1]|[2, 1]|6"},
    {"{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}|{{ '<&>'|e }}|{{ 2.567|round(2) }}|{{ -3|abs }}",
     "{}",
     "a\n  b\n\n  c|  a\n  b|&lt;&amp;&gt;|2.57|3"},
};

const RenderCase kToJsonCases[] = {
    {"{{ d|tojson }}",
     "{\"d\": {\"a\": [1, 2.0, \"é\\n\\\"\\\\\", null, true, false], \"b\": {}, \"c\": [], \"d\": \"😀\\u0001\177\"}}",
     "{\"a\": [1, 2.0, \"é\\n\\\"\\\\\", null, true, false], \"b\": {}, \"c\": [], \"d\": \"😀\\u0001\177\"}"},
    {"{{ d|tojson(indent=2) }}",
     "{\"d\": {\"a\": [1, {\"x\": null}], \"b\": {}, \"c\": []}}",
     "{\n  \"a\": [\n    1,\n    {\n      \"x\": null\n    }\n  ],\n  \"b\": {},\n  \"c\": []\n}"},
    {"{{ d|tojson(indent=4) }}|{{ 'é😀'|tojson(ensure_ascii=true) }}|{{ d|tojson(sort_keys=true) }}|{{ d|tojson(separators=(',', ':')) }}",
     "{\"d\": {\"z\": 1, \"a\": [1, 2]}}",
     "{\n    \"z\": 1,\n    \"a\": [\n        1,\n        2\n    ]\n}|\"\\u00e9\\ud83d\\ude00\"|{\"a\": [1, 2], \"z\": 1}|{\"z\":1,\"a\":[1,2]}"},
    {"{{ {'output': 'x'}|tojson }}|{{ 1.5|tojson }}|{{ none|tojson }}|{{ 'a\\tb'|tojson }}|{{ [1e20, 0.1]|tojson }}",
     "{}",
     "{\"output\": \"x\"}|1.5|null|\"a\\tb\"|[1e+20, 0.1]"},
};

const RenderCase kTestsCases[] = {
    {"{{ x is defined }}{{ y is defined }}{{ y is undefined }}{{ none is none }}{{ x is not none }}{{ 'a' is string }}{{ 1 is string }}",
     "{\"x\": 1}",
     "TrueFalseTrueTrueTrueTrueFalse"},
    {"{{ {} is mapping }}{{ [] is mapping }}{{ [] is iterable }}{{ 'a' is iterable }}{{ 1 is iterable }}{{ 1 is number }}{{ true is number }}{{ 1.5 is number }}{{ 'a' is sequence }}{{ [] is sequence }}",
     "{}",
     "TrueFalseTrueTrueFalseTrueTrueTrueTrueTrue"},
    {"{{ true is true }}{{ 1 is true }}{{ false is false }}{{ 1 is integer }}{{ true is integer }}{{ 1.0 is float }}{{ true is boolean }}{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(2) }}",
     "{}",
     "TrueFalseTrueTrueFalseTrueTrueTrueTrueTrueFalse"},
    {"{{ 2 is in [1, 2] }}{{ 'a' is eq 'a' }}{{ x is sameas none }}{{ 5 is gt 3 }}{{ 'AB' is upper }}{{ 'ab' is lower }}{{ range is callable }}",
     "{\"x\": null}",
     "TrueTrueTrueTrueTrueTrueTrue"},
};

const RenderCase kWhitespaceCases[] = {
    {"  {% if true %}\n  x\n  {% endif %}\n  {{ 'y' }}  \n{# c #}\nz\n",
     "{}",
     "  x\n  y  \nz"},
    {"a  {%- if true -%}  b  {%- endif -%}  c",
     "{}",
     "abc"},
    {"a\n{% for i in [1, 2] %}\n  {{ i }}\n{% endfor %}\nb",
     "{}",
     "a\n  1\n  2\nb"},
    {"a  {{- 'b' -}}  c\n{{ 'd' }}\n",
     "{}",
     "abc\nd"},
    {"x {% if true %}y{% endif %} z\n    {% if true %}\nw\n    {% endif %}\n    {%+ if true %}v{% endif %}\n",
     "{}",
     "x y z\nw\n    v"},
    {"{% if true +%}\nkeep{% endif %}\r\n{#- comment -#}\r\n  end\n\n",
     "{}",
     "\nkeepend\n"},
    {"{% raw %}{{ not evaluated }}{% endraw %}|{%- raw -%}  {% x %}  {%- endraw %}|",
     "{}",
     "{{ not evaluated }}|{% x %}|"},
    {"line1\n\t{% set x = 1 %}\nline2 {# inline #}\n{{ x }}",
     "{}",
     "line1\nline2 1"},
};

const RenderCase kStatementsCases[] = {
    {"{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}",
     "{\"xs\": [\"a\", \"b\"]}",
     "1021TrueFalse2|2110FalseTrue2|"},
    {"{% for x in xs if x != 'b' %}{{ x }}{{ loop.index }}{{ loop.last }}{% endfor %}|{% for x in [] %}a{% else %}empty{% endfor %}|{% for x in y %}{% else %}undef{% endfor %}",
     "{\"xs\": [\"a\", \"b\", \"c\"]}",
     "a1Falsec2True|empty|undef"},
    {"{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}",
     "{\"xs\": [1, 2, 3, 4, 5]}",
     "13"},
    {"{% for x in xs %}{{ loop.previtem }}-{{ x }}-{{ loop.nextitem }}/{{ loop.cycle('o', 'e') }};{% endfor %}",
     "{\"xs\": [1, 2, 3]}",
     "-1-2/o;1-2-3/e;2-3-/o;"},
    {"{% set x = 1 %}{% for i in [1, 2, 3] %}{{ x }}{% set x = x + i %}{% endfor %}|{{ x }}|{% if true %}{% set y = 5 %}{% endif %}{{ y }}",
     "{}",
     "111|1|5"},
    {"{% set ns = namespace(n=0, s='') %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }}|{{ ns.s }}",
     "{}",
     "6|0123"},
    {"{% if a %}A{% elif b %}B{% elif c %}C{% else %}D{% endif %}",
     "{\"b\": 0, \"c\": \"yes\"}",
     "C"},
    {"{% set a, b = 1, 2 %}{{ a }}{{ b }}|{% set t = (1, 2) %}{{ t }}|{% set block %}in {{ a }}{% endset %}{{ block }}|{{ range(2, 8, 3)|list }}",
     "{}",
     "12|(1, 2)|in 1|[2, 5]"},
    {"{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }} {{ greet('b', '?') }} {{ greet(name='c', punct='.') }}",
     "{}",
     "Hi a! Hi b? Hi c."},
    {"{% generation %}gen{% endgeneration %}|{{ messages[0].content }}|{% set messages = messages[1:] %}{{ messages|length }}",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"U\"}]}",
     "gen|S|1"},
    {"{{ dict(a=1, b='x') }}|{{ dict(a=1).a }}|{{ x }}|{{ x.y if x is defined else 'nope' }}",
     "{}",
     "{'a': 1, 'b': 'x'}|1||nope"},
};

// clang-format on

TEST(Jinja, Expressions) { check_cases(std::begin(kExpressionsCases), std::end(kExpressionsCases)); }
TEST(Jinja, Methods) { check_cases(std::begin(kMethodsCases), std::end(kMethodsCases)); }
TEST(Jinja, Filters) { check_cases(std::begin(kFiltersCases), std::end(kFiltersCases)); }
TEST(Jinja, ToJsonMatchesPythonJsonDumps) { check_cases(std::begin(kToJsonCases), std::end(kToJsonCases)); }
TEST(Jinja, Tests) { check_cases(std::begin(kTestsCases), std::end(kTestsCases)); }
TEST(Jinja, WhitespaceControlMatchesTransformersEnvironment) {
  check_cases(std::begin(kWhitespaceCases), std::end(kWhitespaceCases));
}
TEST(Jinja, Statements) { check_cases(std::begin(kStatementsCases), std::end(kStatementsCases)); }

TEST(Jinja, UndefinedPrintsEmptyButFailsWhenUsed) {
  EXPECT_EQ(render("[{{ nothing }}]{{ nothing|length }}{{ nothing ~ 'x' }}{% if not nothing %}falsy{% endif %}"),
            "[]0xfalsy");
  expect_error([] { render("{{ nothing.attr }}"); }, "line 1: 'nothing' is undefined", Errc::invalid_argument);
  expect_error([] { render("\n{{ nothing + 1 }}"); }, "line 2: 'nothing' is undefined", Errc::invalid_argument);
  expect_error([] { render("{{ d.missing.deeper }}", R"({"d": {}})"); }, "has no attribute 'missing'",
               Errc::invalid_argument);
  expect_error([] { render("{{ messages[0]['role'] }}", R"({"messages": []})"); }, "has no element 0",
               Errc::invalid_argument);
  expect_error([] { render("{{ nothing() }}"); }, "'nothing' is undefined", Errc::invalid_argument);
}

TEST(Jinja, RaiseExceptionCarriesTheTemplatesMessage) {
  expect_error([] { render("{{ raise_exception('Roles must alternate!') }}"); }, "Roles must alternate!",
               Errc::invalid_argument);
}

TEST(Jinja, StrftimeNowFormatsTheLocalTime) {
  char year[8];
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::strftime(year, sizeof year, "%Y", &local);
  EXPECT_EQ(render("{{ strftime_now('%Y') }}"), year);
}

TEST(Jinja, TypeErrorsNameTheLine) {
  expect_error([] { render("{{ 'a' ~ 1 + 2 }}"); }, "can only concatenate str (not \"int\") to str",
               Errc::invalid_argument);
  expect_error([] { render("{{ 1 / 0 }}"); }, "division by zero", Errc::invalid_argument);
  expect_error([] { render("{{ 'a' < 1 }}"); }, "'<' not supported between instances of 'str' and 'int'",
               Errc::invalid_argument);
  expect_error([] { render("{{ none|tojson }}{{ x|tojson }}"); }, "not JSON serializable", Errc::invalid_argument);
  expect_error([] { render("{% for a, b in [[1, 2, 3]] %}{% endfor %}"); }, "3 values to unpack into 2 names",
               Errc::invalid_argument);
  expect_error([] { render("{% set x = 1 %}{% set x.y = 2 %}"); }, "cannot assign attribute on non-namespace",
               Errc::invalid_argument);
  expect_error([] { render("{% set ns = namespace(_x=1) %}"); }, "underscore-prefixed", Errc::invalid_argument);
  expect_error([] { render("{{ 'a'|join(1, 2, 3) }}"); }, "filter 'join' takes at most 2 argument(s)",
               Errc::invalid_argument);
}

TEST(Jinja, SyntaxErrorsNameTheLine) {
  expect_error([] { render("{% if x %}never closed"); }, "line 1: unexpected end of template, expected 'elif'",
               Errc::invalid_argument);
  expect_error([] { render("a\n{{ 1 +  }}"); }, "line 2: expected an expression, got '}}'", Errc::invalid_argument);
  expect_error([] { render("{{ 'unterminated }}"); }, "unterminated string literal", Errc::invalid_argument);
  expect_error([] { render("{{ x"); }, "{{ is never closed", Errc::invalid_argument);
  expect_error([] { render("{# no end"); }, "missing end of comment tag", Errc::invalid_argument);
  expect_error([] { render("{{ (1, 2] }}"); }, "unexpected ']', expected ')'", Errc::invalid_argument);
  expect_error([] { render("{% break %}"); }, "outside a for loop", Errc::invalid_argument);
  expect_error([] { render("{{ x $ y }}"); }, "unexpected character '$'", Errc::invalid_argument);
  expect_error([] { render("{% for x in xs %}{% endif %}"); }, "expected 'endfor' or 'else'", Errc::invalid_argument);
}

TEST(Jinja, UnsupportedConstructsAreNamed) {
  expect_error([] { render("\n\n{% include 'other.jinja' %}"); }, "line 3: the {% include %} tag is not supported",
               Errc::unsupported);
  expect_error([] { render("{% extends 'base' %}"); }, "{% extends %} tag is not supported", Errc::unsupported);
  expect_error([] { render("{% call foo() %}{% endcall %}"); }, "{% call %} tag is not supported", Errc::unsupported);
  expect_error([] { render("{% frobnicate %}"); }, "unknown tag {% frobnicate %}", Errc::unsupported);
  // Unknown filters fail at parse time even in a branch that never runs, as in Jinja.
  expect_error([] { render("{% if false %}{{ x|wordwrap }}{% endif %}"); }, "the filter 'wordwrap' is not supported",
               Errc::unsupported);
  expect_error([] { render("{{ x is frozen }}"); }, "the test 'frozen' is not supported", Errc::unsupported);
  expect_error([] { render("{{ 'a'.format(1) }}"); }, "the string method str.format() is not supported",
               Errc::unsupported);
  expect_error([] { render("{{ '%s' % 1 }}"); }, "printf-style string formatting", Errc::unsupported);
  expect_error([] { render("{% for x in xs recursive %}{% endfor %}"); }, "recursive for loops", Errc::unsupported);
  expect_error([] { render("{{ f(*args) }}"); }, "*args and **kwargs", Errc::unsupported);
  expect_error([] { render("{{ [].append(1) }}"); }, "list method list.append() is not supported", Errc::unsupported);
}

TEST(Jinja, RunawayTemplatesFailInsteadOfCrashing) {
  expect_error([] { render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"); }, "macro calls nested",
               Errc::invalid_argument);
  expect_error([] { render("{{ range(1000000) }}"); }, "range() too big", Errc::invalid_argument);
  expect_error([] { render("{{ 'x' * 1000000000000 }}"); }, "grew past", Errc::invalid_argument);
  const std::string deep = std::string(1000, '(') + "1" + std::string(1000, ')');
  expect_error([&] { render("{{ " + deep + " }}"); }, "nested more than", Errc::unsupported);
  expect_error([] { render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"); },
               "steps", Errc::invalid_argument);
}

// Found by fuzz_chat_template (tests/fuzz) or written beside what it found: 64-bit integers at
// their edges, sizes that would wrap or were not counted, loops whose step passes 64 bits, and
// a namespace that holds itself. Each must fail (or answer) at once, with no undefined behaviour.
TEST(Jinja, IntegersAtTheir64BitEdges) {
  const std::string min = "(-9223372036854775807 - 1)";
  expect_error([] { render("{{ 9223372036854775807 + 1 }}"); }, "beyond 64 bits", Errc::unsupported);
  expect_error([] { render("{{ 3037000500 * 3037000500 }}"); }, "beyond 64 bits", Errc::unsupported);
  expect_error([] { render("{{ 10000000000 * 10000000000.5 // 1 * 1 }}x{{ 2 ** 63 }}"); }, "beyond 64 bits",
               Errc::unsupported);
  expect_error([&] { render("{{ " + min + " // -1 }}"); }, "beyond 64 bits", Errc::unsupported);
  expect_error([&] { render("{{ -" + min + " }}"); }, "beyond 64 bits", Errc::unsupported);
  expect_error([&] { render("{{ " + min + "|abs }}"); }, "beyond 64 bits", Errc::unsupported);
  expect_error([] { render("{{ 1e300|int }}"); }, "beyond 64 bits", Errc::unsupported);
  expect_error([] { render("{{ '-1e19'|int }}"); }, "beyond 64 bits", Errc::unsupported);
  EXPECT_EQ(render("{{ " + min + " % -1 }}|{{ " + min + " }}|{{ (-2) ** 63 }}|{{ 2 ** 62 }}|{{ 3 ** 39 }}"),
            "0|-9223372036854775808|-9223372036854775808|4611686018427387904|4052555153018976267");
  // Python takes no time over these; neither may kiln (the power is by squaring, not y products).
  EXPECT_EQ(render("{{ 1 ** 9223372036854775807 }}|{{ (-1) ** 9223372036854775807 }}|{{ 0 ** 9000000000000 }}"),
            "1|-1|0");
  EXPECT_EQ(render("{{ 3.99|int }}|{{ -3.99|int }}|{{ '7.5'|int }}"), "3|-3|7");
  EXPECT_EQ(render("{{ range(9223372036854775805, 9223372036854775807, 5)|list }}|"
                   "{{ range(-9223372036854775807, -9223372036854775807 - 1, -3)|list }}"),
            "[9223372036854775805]|[-9223372036854775807]");
  EXPECT_EQ(render("{{ 'abc'[1::9223372036854775807] }}|{{ 'abc'[::-9223372036854775807] }}|{{ [1, 2, 3][2:0:"
                   "-9223372036854775807] }}"),
            "b|c|[3]");
}

TEST(Jinja, ValuesThatWouldOutgrowMemoryFailFirst) {
  // 'abcdefgh' * 2**61 wrapped to a size of 0 (2**64 bytes) and passed the check; '' * n looped n times.
  expect_error([] { render("{{ 'ab' * 4611686018427387904 }}"); }, "grew past", Errc::invalid_argument);
  expect_error([] { render("{{ 'abcdefgh' * 2305843009213693952 }}"); }, "grew past", Errc::invalid_argument);
  EXPECT_EQ(render("{{ '' * 9223372036854775807 }}|{{ [] * 9223372036854775807 }}|{{ 'ab' * -3 }}"), "|[]|");
  // A list holds its strings by value: copying it copies their text.
  expect_error([] { render("{% set s = 'x' * 40000000 %}{{ ([s] * 2)|length }}"); }, "grew past",
               Errc::invalid_argument);
  expect_error([] { render("{% set s = 'x' * 40000000 %}{{ ([s] + [s])|length }}"); }, "grew past",
               Errc::invalid_argument);
  expect_error([] { render("{{ 'x'|indent(10000000000000) }}"); }, "grew past", Errc::invalid_argument);
  expect_error([] { render("{{ [1]|tojson(indent=10000000000000) }}"); }, "grew past", Errc::invalid_argument);
  expect_error([] { render("{% set s = 'a' * 1000000 %}{{ s|replace('a', 'b' * 100)|length }}"); }, "grew past",
               Errc::invalid_argument);
  expect_error([] { render("{% set s = 'a' * 1000000 %}{{ s.replace('a', 'b' * 100)|length }}"); }, "grew past",
               Errc::invalid_argument);
  expect_error([] { render("{% set s = 'x' * 1000000 %}{% set l = [s] * 40 %}{{ (l + l)|join|length }}"); },
               "grew past", Errc::invalid_argument);
  expect_error([] { render("{% set s = 'x' * 4000000 %}{% set l = [[s] * 10] * 10 %}{{ l|tojson|length }}"); },
               "grew past", Errc::invalid_argument);
  expect_error([] { render("{% set s = 'x' * 4000000 %}{% set l = [[s] * 10] * 10 %}{{ l|string|length }}"); },
               "grew past", Errc::invalid_argument);
}

TEST(Jinja, IndentTakesItsDefaultWidth) {
  // Jinja2's indent(width=4, first=False, blank=False); a bare |indent failed (the unset width was
  // read as an integer argument), found reading the width's size check.
  EXPECT_EQ(render("{{ 'a\nb'|indent }}|{{ 'a\nb'|indent(2, true) }}|{{ 'a\nb'|indent('--') }}"),
            "a\n    b|  a\n  b|a\n--b");
  expect_error([] { render("{{ 'a'|indent(none) }}"); }, "expects an integer or string width",
               Errc::invalid_argument);
}

TEST(Jinja, ANamespaceHoldingItselfFailsToPrint) {
  expect_error([] { render("{% set ns = namespace(a=1) %}{% set ns.me = ns %}{{ ns }}"); }, "nested too deeply",
               Errc::invalid_argument);
  expect_error([] { render("{% set ns = namespace(a=1) %}{% set ns.me = [ns] %}{{ ns|tojson }}"); },
               "not JSON serializable", Errc::invalid_argument);
  EXPECT_EQ(render("{% set ns = namespace(a=1) %}{% set ns.me = ns %}{{ ns.me.me.a }}|{{ ns == ns.me }}"),
            "1|True");
}

TEST(Jinja, TemplatesRenderRepeatedlyWithDifferentVariables) {
  const Template t("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}");
  EXPECT_EQ(t.render({{"messages", from_json(nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi"}])"))}}),
            "<user>hi");
  EXPECT_EQ(t.render({}), "");
}

}  // namespace
}  // namespace kiln::jinja
