# Generates tests/unit/chat/jinja_cases.jsonl: small templates rendered by Python Jinja2 the way
# Hugging Face transformers renders chat templates. Run by hand: python3 gen_jinja_cases.py OUT
import json, jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.ext import loopcontrols
def raise_exception(m): raise jinja2.exceptions.TemplateError(m)
def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters['tojson'] = tojson
env.globals['raise_exception'] = raise_exception
cases = [
 # whitespace control
 ("ws_dash", "a  {{- 'b' -}}  c", {}),
 ("ws_block_dash", "x\n  {%- if true -%}\n  y\n  {%- endif -%}\n  z", {}),
 ("trim_blocks", "{% if true %}\nyes\n{% endif %}\nafter", {}),
 ("lstrip_blocks", "line\n    {% if true %}\n    in\n    {% endif %}\nend", {}),
 ("lstrip_not_line_start", "a {% if true %}b{% endif %} c", {}),
 ("plus_disables_lstrip", "x\n    {%+ if true %}y{% endif %}", {}),
 ("comment", "a\n  {# note #}\nb{#- x -#}  c", {}),
 ("trailing_newline", "hello\n", {}),
 ("var_no_trim", "{{ 'a' }}\nb", {}),
 # expressions
 ("arith", "{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 7 / 2 }} {{ 6 / 3 }} {{ 1.5 + 1 }}", {}),
 ("concat", "{{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' + 'cd' }} {{ [1] + [2, 3] }} {{ 'ab' * 3 }}", {}),
 ("compare", "{{ 1 < 2 }} {{ 1 == 1.0 }} {{ 'a' != 'b' }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ [1,2] == [1,2] }}", {}),
 ("logic", "{{ true and 'x' }} {{ false or 'y' }} {{ not none }} {{ none or 0 or '' or 'z' }} {{ 0 and 1 }}", {}),
 ("in_ops", "{{ 'b' in 'abc' }} {{ 2 in [1,2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }} {{ 'x' not in 'xyz' }}", {}),
 ("ternary", "{{ 'y' if x else 'n' }} {{ 'y' if not x else 'n' }}[{{ 'only' if false }}]", {"x": 1}),
 ("literals", "{{ [1, 'two', 3.5, none, true] }} {{ {'a': 1, 'b': [2]} }} {{ (1, 2) | join('-') }} {{ 'it\\'s' }} {{ \"q\\\"\" }} {{ 'tab\\tnl\\n' | tojson }}", {}),
 ("floats", "{{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 2.5e-5 }} {{ 100.0 / 3 }} {{ 3.0 * 2 }}", {}),
 ("slicing", "{{ 'hello'[1:3] }} {{ 'hello'[::-1] }} {{ [1,2,3,4][::2] }} {{ [1,2,3][-1] }} {{ 'héllo'[1] }} {{ [1,2,3][1:] }} {{ 'abc'[-2:] }} {{ [1,2,3,4,5][4:1:-2] }}", {}),
 ("attr_item", "{{ m.role }} {{ m['content'] }} {{ m.missing }}|{{ m.missing is defined }} {{ l[0].x }} {{ l.0.x }}", {"m": {"role": "user", "content": "hi"}, "l": [{"x": 5}]}),
 # statements
 ("if_elif", "{% for i in [1,2,3] %}{% if i == 1 %}one{% elif i == 2 %}two{% else %}many{% endif %},{% endfor %}", {}),
 ("for_loop_vars", "{% for x in ['a','b','c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}", {}),
 ("for_else", "{% for x in [] %}x{% else %}empty{% endfor %}", {}),
 ("for_filter", "{% for x in range(10) if x is odd %}{{ x }}:{{ loop.index }}/{{ loop.length }} {% endfor %}", {}),
 ("for_items", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}", {"d": {"z": 1, "a": 2}}),
 ("for_string", "{% for c in 'héy' %}[{{ c }}]{% endfor %}", {}),
 ("loop_prev_next_cycle", "{% for x in [1,2,3] %}{{ loop.previtem }}-{{ loop.nextitem }}-{{ loop.cycle('a','b') }} {% endfor %}", {}),
 ("break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
 ("scoping", "{% set x = 1 %}{% for i in range(3) %}{{ x }}{% set x = x + 10 %}{{ x }},{% endfor %}{{ x }}", {}),
 ("namespace", "{% set ns = namespace(total=0, names='') %}{% for i in range(4) %}{% set ns.total = ns.total + i %}{% set ns.names = ns.names ~ i %}{% endfor %}{{ ns.total }} {{ ns.names }}", {}),
 ("set_tuple", "{% set a, b = 1, 2 %}{{ a }}{{ b }}", {}),
 ("set_block", "{% set body %}Hello {{ name }}!{% endset %}[{{ body }}]{% set up | upper %}x{% endset %}{{ up }}", {"name": "Bob"}),
 ("macro", "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }} {{ greet(name='C', punct='.') }}", {}),
 ("call_block", "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold{% endcall %}", {}),
 ("call_block_args", "{% macro each(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}{% call(x) each([1,2]) %}<{{ x }}>{% endcall %}", {}),
 ("filter_block", "{% filter upper %}shout {{ 'it' }}{% endfilter %}", {}),
 # filters
 ("f_length", "{{ 'héllo' | length }} {{ [1,2] | length }} {{ {'a':1} | count }} {{ undefined_var | length }}", {}),
 ("f_tojson", "{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ 'é\"\\\\' | tojson }}|{{ [] | tojson }}|{{ {} | tojson(indent=2) }}|{{ d | tojson(sort_keys=true) }}|{{ 1.0 | tojson }}|{{ none | tojson }}", {"d": {"b": [1, 2.5, None, True], "a": {"x": "y"}}}),
 ("f_tojson_ascii", "{{ 'é😀' | tojson(ensure_ascii=true) }}", {}),
 ("f_string", "{{ '  pad  ' | trim }}|{{ 'xxhixx' | trim('x') }}|{{ 'Ab' | upper }}{{ 'Ab' | lower }}|{{ 'hello wORLD-foo' | title }}|{{ 'hELLO' | capitalize }}", {}),
 ("f_default", "{{ missing | default('dflt') }} {{ none | default('n') }} {{ '' | d('e', true) }} {{ 'v' | default('x') }}", {}),
 ("f_join", "{{ [1,2,3] | join(', ') }} {{ ['a','b'] | join }} {{ users | join(',', attribute='name') }}", {"users": [{"name": "x"}, {"name": "y"}]}),
 ("f_first_last_list", "{{ [1,2,3] | first }} {{ [1,2,3] | last }} {{ 'abc' | first }} {{ 'ab' | list }} {{ {'k':1} | list }}", {}),
 ("f_items", "{% for k, v in {'a': 1, 'b': 2} | items %}{{ k }}{{ v }}{% endfor %}", {}),
 ("f_replace", "{{ 'aaa' | replace('a', 'b') }} {{ 'aaa' | replace('a', 'b', 2) }} {{ 'abc'.replace('b', '') }}", {}),
 ("f_int_float", "{{ '42' | int }} {{ '4.7' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ 3.9 | int }} {{ '2.5' | float }} {{ 3 | float }} {{ true | int }}", {}),
 ("f_selectattr", "{{ msgs | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(',') }} {{ msgs | rejectattr('role', 'eq', 'user') | list | length }} {{ msgs | selectattr('tool') | list | length }}", {"msgs": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "tool": 1}, {"role": "user", "content": "c"}]}),
 ("f_map_filter", "{{ ['a','b'] | map('upper') | join }} {{ [1, 2] | map('string') | list }}", {}),
 ("f_select", "{{ [1,2,3,4] | select('even') | list }} {{ [1,2,3,4] | reject('odd') | list }} {{ [0, 1, '', 'x'] | select | list }}", {}),
 ("f_sort_unique", "{{ [3,1,2] | sort }} {{ [3,1,2] | sort(reverse=true) }} {{ ['b','A','a'] | sort }} {{ [1,2,1,3,2] | unique | list }} {{ users | sort(attribute='age') | map(attribute='n') | join }}", {"users": [{"n": "x", "age": 30}, {"n": "y", "age": 20}]}),
 ("f_reverse", "{{ [1,2,3] | reverse | list }} {{ 'abc' | reverse }}", {}),
 ("f_math", "{{ -5 | abs }} {{ 2.567 | round(2) }} {{ 2.5 | round }} {{ 2.1 | round(0, 'ceil') }} {{ [1,2,3] | sum }} {{ [3,1,2] | min }} {{ [3,1,2] | max }}", {}),
 ("f_misc", "{{ '<a>' | e }} {{ 'x' | safe }} {{ 'a\\nb' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }} {{ {'b':1,'a':2} | dictsort | map('first') | join }}", {}),
 # tests
 ("tests", "{{ x is defined }} {{ y is undefined }} {{ none is none }} {{ 's' is string }} {{ 1 is number }} {{ 1.5 is integer }} {{ 1 is integer }} {{ {} is mapping }} {{ [] is iterable }} {{ 's' is sequence }} {{ true is boolean }} {{ true is true }} {{ false is false }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 1 is equalto 1 }} {{ 2 is in [1,2] }} {{ x is not none }}", {"x": 1}),
 # string methods
 ("str_methods", "{{ 'hello'.startswith('he') }} {{ 'hello'.endswith('lo') }} {{ '  x  '.strip() }}|{{ '  x  '.lstrip() }}|{{ '  x  '.rstrip() }}|{{ 'xxaxx'.strip('x') }} {{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'ab'.upper() }} {{ 'AB'.lower() }} {{ 'hello world'.title() }} {{ 'abcabc'.find('c') }} {{ 'abcabc'.count('bc') }} {{ '-'.join(['a','b']) }} {{ 'hello'.startswith(('x', 'h')) }}", {}),
 ("dict_methods", "{{ d.keys() | list }} {{ d.values() | list }} {{ d.get('a') }} {{ d.get('zz') }} {{ d.get('zz', 5) }} {{ d.items() | map('last') | join }}", {"d": {"a": 1, "b": 2}}),
 ("render_values", "{{ none }} {{ true }} {{ [none, 'x', 1.0] }} {{ {'k': 'v'} }} {{ ns_obj }}", {}),
 ("qwen_style", "{%- for message in messages[::-1] %}{%- set index = (messages|length - 1) - loop.index0 %}{{ index }}{{ message.role }}{%- endfor %}", {"messages": [{"role": "a"}, {"role": "b"}]}),
 ("think_split", "{{ c.split('</think>')[-1].lstrip('\\n') }}|{{ c.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}", {"c": "<think>\nreason\n</think>\n\nanswer"}),
 ("newline_in_string", "{{ 'a\nb' }}", {}),
 ("raise", "{{ raise_exception('bad role') }}", {}),
 ("is_test_arg_no_paren", "{{ 1 is sameas 1 }} {{ x is equalto 'y' }}", {"x": "y"}),
]
out = []
for name, t, ctx in cases:
    try:
        r = env.from_string(t).render(**ctx)
        out.append({"name": name, "template": t, "context": ctx, "rendered": r, "error": None})
    except Exception as e:
        out.append({"name": name, "template": t, "context": ctx, "rendered": None, "error": type(e).__name__ + ": " + str(e)})
import sys
with open(sys.argv[1], "w") as f:
    for o in out:
        f.write(json.dumps(o, ensure_ascii=False) + "\n")
