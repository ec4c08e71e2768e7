// Jinja subset: features one by one, each rendered by Python Jinja2
// configured like HF transformers (sandboxed, trim_blocks, lstrip_blocks,
// loopcontrols, tojson = json.dumps(ensure_ascii=False)) -- expected strings
// below are its output.
#include <gtest/gtest.h>

#include "chat/jinja.h"
#include "common/error.h"

using namespace qinfer;
using namespace qinfer::chat;

namespace {
const char* kCases = R"GOLD({
"context": {
"messages": [
{
"role": "user",
"content": "Hi"
},
{
"role": "assistant",
"content": "<think>\nr\n</think>\n\nA"
},
{
"role": "tool",
"content": "t1"
},
{
"role": "tool",
"content": "t2"
}
],
"x": 7,
"f": 2.5,
"s": "  Héllo wörld  ",
"l": [
3,
"a",
null,
true,
1.5,
[
1,
2
],
{
"k": "v"
}
],
"d": {
"b": 1,
"a": [
1,
2
],
"c": {
"z": null
}
},
"flag": false,
"empty": [],
"name": "Qwen",
"add_generation_prompt": true,
"enable_thinking": false
},
"cases": [
{
"name": "text_ws",
"template": "a\n  {% if true %}\n    b\n  {% endif %}\nc\n{{ x }}  \n  {{- x }} {{ x -}}\n  d{# comment #}\n  {#- c2 -#}  e",
"expected": "a\n    b\nc\n77 7de",
"error": null
},
{
"name": "arith",
"template": "{{ x + 1 }} {{ x - 10 }} {{ x * 3 }} {{ x / 2 }} {{ x // 2 }} {{ -x // 2 }} {{ x % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ f * 2 }} {{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 10 / 4 }} {{ 1e3 }} {{ 0.1 + 0.2 }}",
"expected": "8 -3 21 3.5 3 -4 1 2 1024 5.0 7 9 2.5 1000.0 0.30000000000000004",
"error": null
},
{
"name": "str_ops",
"template": "{{ 'a' + 'b' }}|{{ 'x' ~ 1 ~ none ~ true ~ 2.0 }}|{{ s|trim }}|{{ s|length }}|{{ s.strip() }}|{{ s.lstrip() }}.|{{ s.rstrip() }}.|{{ 'abc'.upper() }}|{{ 'A-B-C'.split('-') }}|{{ ' a  b '.split() }}|{{ 'a,b,c'.split(',', 1) }}|{{ 'hello'[1:3] }}|{{ 'hello'[::-1] }}|{{ 'hello'[-1] }}|{{ 'ab' * 3 }}|{{ 'aXbXc'.replace('X', '-') }}|{{ 'hi there'.title() }}|{{ 'x' in 'xyz' }}|{{ 'q' not in 'xyz' }}",
"expected": "ab|x1NoneTrue2.0|Héllo wörld|15|Héllo wörld|Héllo wörld  .|  Héllo wörld.|ABC|['A', 'B', 'C']|['a', 'b']|['a', 'b,c']|el|olleh|o|ababab|a-b-c|Hi There|True|True",
"error": null
},
{
"name": "startswith",
"template": "{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith('bc') }} {{ 'abc'.startswith(('x', 'a')) }} {{ '\\n\\nab\\n'.strip('\\n') }}|{{ '<think>x</think>y'.split('</think>')[-1] }}|{{ '<think>x</think>y'.split('</think>')[0].split('<think>')[-1] }}",
"expected": "True True True ab|y|x",
"error": null
},
{
"name": "values",
"template": "{{ l }}|{{ d }}|{{ none }}|{{ true }}|{{ f }}|{{ 'it\\'s' }}|{{ [1, 'two', [3]] }}|{{ undefined_var }}|{{ d.c.z }}|{{ l[5][1] }}|{{ l[-1].k }}|{{ d['a'][0] }}",
"expected": "[3, 'a', None, True, 1.5, [1, 2], {'k': 'v'}]|{'b': 1, 'a': [1, 2], 'c': {'z': None}}|None|True|2.5|it's|[1, 'two', [3]]||None|2|v|1",
"error": null
},
{
"name": "tojson",
"template": "{{ l|tojson }}|{{ d|tojson }}|{{ 'é<>&\\'\"'|tojson }}|{{ {'a': 1, 'b': [true, none]}|tojson }}|{{ d|tojson(indent=2) }}|{{ [1,[2,{}],[]]|tojson(indent=4) }}",
"expected": "[3, \"a\", null, true, 1.5, [1, 2], {\"k\": \"v\"}]|{\"b\": 1, \"a\": [1, 2], \"c\": {\"z\": null}}|\"é<>&'\\\"\"|{\"a\": 1, \"b\": [true, null]}|{\n  \"b\": 1,\n  \"a\": [\n    1,\n    2\n  ],\n  \"c\": {\n    \"z\": null\n  }\n}|[\n    1,\n    [\n        2,\n        {}\n    ],\n    []\n]",
"error": null
},
{
"name": "filters",
"template": "{{ l|length }} {{ d|length }} {{ empty|length }} {{ l|first }} {{ l|last }} {{ [3,1,2]|list }} {{ 'ab'|list }} {{ d|list }} {{ [1,2,3]|join(', ') }} {{ d|items|list|length }} {{ (d|items|list)[1][0] }} {{ undefined_var|default('dflt') }} {{ ''|default('e', true) }} {{ 5|string }} {{ true|string }} {{ none|string }} {{ '42'|int + 1 }} {{ 3|float }} {{ -3|abs }} {{ [1,2,3]|reverse|list }} {{ 'ABC'|lower }} {{ 2.567|round(1) }}",
"expected": "7 3 0 3 {'k': 'v'} [3, 1, 2] ['a', 'b'] ['b', 'a', 'c'] 1, 2, 3 3 a dflt e 5 True None 43 3.0 3 [3, 2, 1] abc 2.6",
"error": null
},
{
"name": "map_select",
"template": "{{ messages|map(attribute='role')|join(',') }}|{{ messages|selectattr('role', 'equalto', 'tool')|list|length }}|{{ messages|rejectattr('role', 'equalto', 'tool')|map(attribute='content')|list }}|{{ [1,2,3,4]|select('even')|list }}|{{ [1,none,2]|reject('none')|list }}|{{ ['a','b']|map('upper')|list }}",
"expected": "user,assistant,tool,tool|2|['Hi', '<think>\\nr\\n</think>\\n\\nA']|[2, 4]|[1, 2]|['A', 'B']",
"error": null
},
{
"name": "tests",
"template": "{{ x is defined }} {{ nope is defined }} {{ nope is undefined }} {{ none is none }} {{ s is string }} {{ x is number }} {{ x is integer }} {{ f is float }} {{ d is mapping }} {{ l is iterable }} {{ s is sequence }} {{ l is not string }} {{ flag is false }} {{ true is true }} {{ x is odd }} {{ x is divisibleby 7 }} {{ x is divisibleby(2) }} {{ 'ab' is lower }} {{ x is eq 7 }} {{ x is not none and x > 3 }}",
"expected": "True False True True True True True True True True True True True True True True False True True True",
"error": null
},
{
"name": "logic",
"template": "{{ 1 and 2 }} {{ 0 and 2 }} {{ 0 or 'z' }} {{ not flag }} {{ not (x > 3 and flag) }} {{ 'a' if flag else 'b' }} {{ 'y' if x > 3 }}. {{ 1 < 2 < 3 }} {{ x == 7.0 }} {{ x != 7 }} {{ 'b' > 'a' }} {{ l[0] >= 3 }} {{ 'k' in d.c or 'z' in d.c }} {{ 3 in [1, 2, 3] }} {{ 'a' in d }}",
"expected": "2 0 z True True b y. True True False True True True True True",
"error": null
},
{
"name": "loops",
"template": "{% for m in messages %}{{ loop.index0 }}/{{ loop.index }}/{{ loop.revindex }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }}:{{ m.role }}<{{ loop.previtem.role if loop.previtem else '-' }},{{ loop.nextitem.role if loop.nextitem is defined else '-' }}>;{% endfor %}|{% for m in messages[::-1] %}{{ m.role[0] }}{% endfor %}|{% for k, v in d|items %}{{ k }}={{ v }};{% endfor %}|{% for k in d %}{{ k }}{% endfor %}|{% for i in range(3) %}{{ i }}{% else %}none{% endfor %}|{% for i in empty %}x{% else %}empty{% endfor %}|{% for i in range(10) if i is odd %}{{ i }}{% if i > 5 %}{% break %}{% endif %}{% endfor %}|{% for i in range(5) %}{% if i == 2 %}{% continue %}{% endif %}{{ i }}{% endfor %}|{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}|{% for c in 'hé' %}[{{ c }}]{% endfor %}",
"expected": "0/1/4/True/False/4:user<-,assistant>;1/2/3/False/False/4:assistant<user,tool>;2/3/2/False/False/4:tool<assistant,tool>;3/4/1/False/True/4:tool<tool,->;|ttau|b=1;a=[1, 2];c={'z': None};|bac|012|empty|1357|0134|37|[h][é]",
"error": null
},
{
"name": "scopes",
"template": "{% set a = 1 %}{% for i in range(3) %}{% set a = a + i %}{{ a }}{% endfor %}|{{ a }}|{% set ns = namespace(total=0, items=[]) %}{% for i in range(4) %}{% set ns.total = ns.total + i %}{% endfor %}{{ ns.total }}|{% if true %}{% set b = 5 %}{% endif %}{{ b }}|{% set c, e = [1, 2] %}{{ c }}{{ e }}|{% set blk %}inner {{ x }}{% endset %}[{{ blk }}]|{% set n2 = namespace(v=1) %}{% macro bump() %}{% set n2.v = n2.v + 1 %}{% endmacro %}{{ bump() }}{{ bump() }}{{ n2.v }}",
"expected": "123|1|6|5|12|[inner 7]|3",
"error": null
},
{
"name": "macros",
"template": "{% macro greet(who, punct='!', upper=false) %}{{ ('hello ' ~ who)|upper if upper else 'hello ' ~ who }}{{ punct }}{% endmacro %}{{ greet('bob') }}|{{ greet('amy', '?') }}|{{ greet('x', upper=true) }}|{{ greet(name)|length }}|{{ '  ' ~ greet('z') ~ '  '|trim }}|{{ (' ' ~ greet('z') ~ ' ')|trim }}",
"expected": "hello bob!|hello amy?|HELLO X!|11|  hello z!|hello z!",
"error": null
},
{
"name": "dict_methods",
"template": "{% for k, v in d.items() %}{{ k }}{% endfor %}|{{ d.keys()|list }}|{{ d.get('b') }}|{{ d.get('q', 'dq') }}|{{ d.get('q') }}|{{ {'x': 1}.x }}",
"expected": "bac|['b', 'a', 'c']|1|dq|None|1",
"error": null
},
{
"name": "strings_escapes",
"template": "{{ \"a\\\"b\" }}|{{ 'a\\tb' }}|{{ 'line1\\nline2' }}|{{ 'x' 'y' }}|{{ \"\\n</tools>\" }}",
"expected": "a\"b|a\tb|line1\nline2|xy|\n</tools>",
"error": null
},
{
"name": "raise",
"template": "{% if x > 5 %}{{ raise_exception('x too big: ' ~ x) }}{% endif %}",
"expected": null,
"error": "x too big: 7"
},
{
"name": "lstrip_blocks",
"template": "<ul>\n    {% for i in range(2) %}\n    <li>{{ i }}</li>\n    {% endfor %}\n</ul>\n  {%+ if true %}kept{% endif %}\n{% if true +%}\nnl kept{% endif %}",
"expected": "<ul>\n    <li>0</li>\n    <li>1</li>\n</ul>\n  kept\nnl kept",
"error": null
},
{
"name": "gen_prompt",
"template": "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n    {%- if enable_thinking is defined and enable_thinking is false %}\n        {{- '<think>\\n\\n</think>\\n\\n' }}\n    {%- endif %}\n{%- endif %}",
"expected": "<|im_start|>assistant\n<think>\n\n</think>\n\n",
"error": null
}
]
})GOLD";
}  // namespace

TEST(Jinja, MatchesPythonJinja2) {
    const ojson d = ojson::parse(kCases);
    const ojson& ctx = d["context"];
    ASSERT_GT(d["cases"].size(), 15u);
    for (const ojson& c : d["cases"]) {
        const std::string name = c["name"].get<std::string>();
        if (c["expected"].is_null()) {
            try {
                jinja::Template(c["template"].get<std::string>()).render(ctx);
                ADD_FAILURE() << name << ": expected an error";
            } catch (const Error& e) {
                EXPECT_NE(std::string(e.what()).find(c["error"].get<std::string>()), std::string::npos)
                    << name << ": " << e.what();
            }
            continue;
        }
        std::string got;
        try {
            got = jinja::Template(c["template"].get<std::string>()).render(ctx);
        } catch (const Error& e) {
            ADD_FAILURE() << name << ": " << e.what();
            continue;
        }
        EXPECT_EQ(got, c["expected"].get<std::string>()) << name;
    }
}

TEST(Jinja, SyntaxErrorsNameTheLine) {
    auto msg = [](const std::string& src) {
        try {
            jinja::Template t(src);
            t.render(ojson::object());
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    EXPECT_NE(msg("a\nb\n{% if x %}\nno end").find("missing 'endif'"), std::string::npos);
    EXPECT_NE(msg("line1\n{{ x + }}").find("line 2"), std::string::npos);
    EXPECT_NE(msg("{% frobnicate %}").find("unsupported statement 'frobnicate'"), std::string::npos);
    EXPECT_NE(msg("{{ 'abc }}").find("line 1"), std::string::npos);
    EXPECT_NE(msg("{{ x | nosuchfilter }}").find("unknown filter 'nosuchfilter'"), std::string::npos);
    EXPECT_NE(msg("{{ x }").find("unclosed"), std::string::npos);
    EXPECT_NE(msg("{% for x in y %}{% endif %}").find("line 1"), std::string::npos);
    EXPECT_NE(msg("{{ 'a' + 1 }}").find("cannot add"), std::string::npos);
    EXPECT_NE(msg("{{ foo() }}").find("'foo' is not callable"), std::string::npos);
    EXPECT_NE(msg("{% set x = 1 %}{% set x.y = 2 %}").find("not a namespace"), std::string::npos);
}

TEST(Jinja, UndefinedIsLenient) {
    // Attribute access on undefined stays undefined (the Qwen3.5 template reads
    // loop.previtem.role guarded by `loop.previtem and ...`).
    jinja::Template t("[{{ a.b.c }}][{{ a is defined }}][{{ (a.b|length) }}][{% for x in a %}x{% endfor %}]");
    EXPECT_EQ(t.render(ojson::object()), "[][False][0][]");
}
