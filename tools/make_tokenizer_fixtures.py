#!/usr/bin/env python3
"""Writes the reference fixtures that runtime/src/text is tested against.

Run with the oracle environment (gguf, tokenizers, transformers, jinja2):

    ~/.venvs/oracle/bin/python tools/make_tokenizer_fixtures.py [smollm2] [pymoe] [templates]

and, for the SentencePiece fixture, with any Python that has `sentencepiece`:

    python -m venv /tmp/sp && /tmp/sp/bin/pip install sentencepiece
    /tmp/sp/bin/python tools/make_tokenizer_fixtures.py spm

Outputs (committed):
  runtime/tests/data/smollm2_tokenizer.json  - token ids for tricky strings, from the
      SmolLM2-135M-Instruct GGUF's own vocabulary; chat-template renderings.
  runtime/tests/data/pymoe22m_tokenizer.json - token ids from pymoe-22m's tokenizer.json.
  runtime/tests/data/chat_templates.json     - Jinja templates rendered the way transformers
      renders them (its sandboxed environment, trim_blocks, lstrip_blocks, its tojson).
  runtime/tests/data/spm_tokenizer.json      - a small SentencePiece BPE model trained here
      (Llama's settings: byte fallback, dummy prefix, identity normalization) written out as
      GGUF "llama" vocabulary fields, with sentencepiece's own ids for the test strings.

Reference ids for SmolLM2 ("ids") come from a `tokenizers` tokenizer assembled from the GGUF
vocab and merges with the pre-tokenizer of SmolLM2's published tokenizer.json: split every
numeric character on its own, then the GPT-2 byte-level regex (this is also what llama.cpp
does for pre = "smollm"). transformers' own GGUF loader leaves the digit split out; its ids
are recorded too ("ids_transformers_gguf") wherever they differ, as a cross-check.
"""
import json
import os
import sys

import io

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "runtime", "tests", "data")
CACHE = os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache"))
GGUF_DIR = os.path.join(CACHE, "coli", "models", "smollm2-135m-instruct")
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PYMOE = "/work/shared/models/pymoe-22m"

TEXTS = [
    "",
    "a",
    " ",
    "\n",
    "Hello, world!",
    "Hello world",
    " Hello",
    "  leading spaces",
    "trailing spaces   ",
    "multiple   internal    spaces",
    "line1\nline2\n\n\nline3\n",
    "\t tabs\tand\r\nCRLF\r\n",
    "12345 67890 3.14159 1,000,000 2024-01-15",
    "x2 + y3 = 42; 007",
    "numbers: ½ ² ³ ① ٣ 四 Ⅻ",
    "a ½ b ² c",
    "def f(x):\n    return x**2 + 1  # comment\n",
    'fn main() { println!("{}", 42); }',
    "if (a && b || !c) {\n\treturn;\n}\n",
    "    indented\n        more\n",
    "I'm don't you'll they've we'd it's She'S HE'LL",
    "Café naïve résumé façade",
    "Привет, мир!",
    "日本語のテキストです。",
    "مرحبا بالعالم",
    "한국어 텍스트",
    "😀 👍🏽 👨‍👩‍👧‍👦 🇫🇷",
    "e\u0301 a\u200bb ＦＵＬＬ",
    "https://example.com/path?q=1&r=2#frag",
    "<|im_start|>user\nHi there<|im_end|>\n",
    "text<|endoftext|>more",
    "<|im_start|><|im_end|>",
    "almost <|im_start and < |im_end| > and <|im_end",
    "<repo_name>coli<file_sep>src/main.rs",
    "The quick brown fox jumps over the lazy dog. " * 3,
]


def random_texts(n, seed=1234):
    """Deterministic jumbles of the pieces pre-tokenizers disagree about."""
    import random

    rng = random.Random(seed)
    alphabet = [
        "a", "b", "Z", "hello", " world", " ", "  ", "   ", "\n", "\n\n", "\t", "\r\n", " \n", "0", "7", "42",
        "2024", ".", ",", "!", "?", "'s", "'S", "'ll", "'", '"', "(", ")", "{", "}", "_", "-", "#", "é", "ß", "Ω",
        "語", "😀", "👍🏽", "\u200b", "\u0301", "½", "²", "٣", "\u00a0", "\u3000",
    ]
    return ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 16))) for _ in range(n)]


TEXTS = TEXTS + random_texts(120)

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another one, with ünïcode 🎨?"},
    ],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
    ],
]

# Templates that exercise what HF chat templates commonly use.
SYNTH_TEMPLATES = {
    "strip_namespace": (
        "{{ bos_token }}{% set ns = namespace(sys='') %}"
        "{% for m in messages %}{% if m['role'] == 'system' %}{% set ns.sys = m['content'].strip() %}{% endif %}{% endfor %}"
        "{% if ns.sys %}[SYS]{{ ns.sys }}[/SYS]\n{% endif %}"
        "{% for m in messages %}\n"
        "  {% if m['role'] == 'system' %}{% continue %}{% endif %}\n"
        "  {% if m['role'] not in ['user', 'assistant'] %}{{ raise_exception('bad role') }}{% endif %}\n"
        "  {{ m['role'] | upper }}: {{ m['content'] | trim }}{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}\n"
        "{% endfor %}\n"
        "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
    ),
    "string_methods": (
        "{% for m in messages %}"
        "{{ m.role.upper() }}|{{ m.content.lower() }}|{{ m.content.startswith('Hi') }}|"
        "{{ m.content.split(' ') | length }}|{{ m.content.replace('o', '0') }}|{{ m.content | length }}\n"
        "{% endfor %}"
    ),
    "tojson": (
        "{% for m in messages %}{{ m | tojson }}\n{{ m | tojson(indent=2) }}\n{% endfor %}"
        "{{ {'k': [1, 2.5, true, none, '<a&b>']} | tojson }}"
    ),
    "loop_vars": (
        "{% for m in messages %}{{ loop.index0 }}/{{ loop.length }}"
        "{% if loop.first %} first{% endif %}{% if loop.last %} last{% endif %}"
        "{% if not loop.last %}, {% endif %}{% endfor %}\n"
        "{%- if add_generation_prompt %}\n<gen>{%- endif %}\n"
    ),
    "inst_whitespace_control": (
        "{%- if messages[0]['role'] == 'system' -%}\n"
        "    {%- set system = messages[0]['content'] -%}\n"
        "    {%- set rest = messages[1:] -%}\n"
        "{%- else -%}\n"
        "    {%- set system = 'Default system.' -%}\n"
        "    {%- set rest = messages -%}\n"
        "{%- endif -%}\n"
        "<<SYS>>{{ system }}<</SYS>>\n"
        "{% for m in rest %}\n"
        "{%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
        "{{- raise_exception('roles must alternate') -}}\n"
        "{%- endif -%}\n"
        "{%- if m['role'] == 'user' %}\n"
        "[INST] {{ m['content'] | trim }} [/INST]\n"
        "{%- else %} {{ m['content'] | trim }}{{ eos_token }}\n"
        "{%- endif %}\n"
        "{% endfor %}\n"
    ),
    "filters_and_dicts": (
        "{% set roles = messages | map(attribute='role') | list %}roles={{ roles | join(',') }} "
        "users={{ messages | selectattr('role', 'equalto', 'user') | list | length }}\n"
        "{% for k, v in messages[0].items() %}{{ k }}={{ v }};{% endfor %}\n"
        "{{ messages[-1]['content'][:5] }}|{{ messages[0].get('name', 'anon') }}|{{ tools is defined }}"
        "|{{ messages[0].content is string }}|{{ (messages | length) is even }}|{{ 'Hi' in messages[0].content }}\n"
        "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{{ m.role ~ '#' ~ loop.index }} {% endfor %}\n"
        "{{ messages[0].content.split()[1:] | join('_') }}|{{ '  x y '.strip() }}|{{ 'a-b-c'.rsplit('-', 1) if false else 'a-b-c'.split('-') }}\n"
        "{{ none }}|{{ 1.0 }}|{{ 2.50 }}|{{ {'a': [1, \"it's\", none, true]} }}|{{ messages[0] }}|{{ undefined_name }}|{{ [] }}"
    ),
}


def smollm2():
    import gguf
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    path = os.path.join(GGUF_DIR, GGUF_NAME)
    r = gguf.GGUFReader(path)
    f = r.fields
    tokens = f["tokenizer.ggml.tokens"].contents()
    merges = f["tokenizer.ggml.merges"].contents()
    types = f["tokenizer.ggml.token_type"].contents()
    template = f["tokenizer.chat_template"].contents()
    assert f["tokenizer.ggml.pre"].contents() == "smollm"

    vocab = {t: i for i, t in enumerate(tokens)}
    bpe = models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges])
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    specials = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3]
    tok.add_special_tokens(specials)

    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(GGUF_DIR, gguf_file=GGUF_NAME)

    cases = []
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False).ids
        case = {"text": text, "ids": ids}
        hf_ids = hf.encode(text, add_special_tokens=False)
        if hf_ids != ids:
            case["ids_transformers_gguf"] = hf_ids
        case["decoded"] = hf.decode(ids, skip_special_tokens=False)
        cases.append(case)

    chats = []
    for conv in CONVERSATIONS:
        for gen in (False, True):
            rendered = hf.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen)
            chats.append(
                {
                    "messages": conv,
                    "add_generation_prompt": gen,
                    "rendered": rendered,
                    "ids": tok.encode(rendered, add_special_tokens=False).ids,
                }
            )

    return {
        "generator": "tools/make_tokenizer_fixtures.py",
        "gguf": GGUF_NAME,
        "vocab_size": len(tokens),
        "bos": int(f["tokenizer.ggml.bos_token_id"].contents()),
        "eos": int(f["tokenizer.ggml.eos_token_id"].contents()),
        "chat_template": template,
        "cases": cases,
        "chats": chats,
    }


def pymoe():
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(PYMOE, "tokenizer.json"))
    cases = []
    for text in TEXTS:
        enc = tok.encode(text, add_special_tokens=True)
        cases.append({"text": text, "ids": enc.ids, "decoded": tok.decode(enc.ids, skip_special_tokens=False)})
    return {"generator": "tools/make_tokenizer_fixtures.py", "vocab_size": tok.get_vocab_size(), "cases": cases}


def templates():
    from transformers.utils.chat_template_utils import _compile_jinja_template

    out = []
    for name, src in SYNTH_TEMPLATES.items():
        compiled = _compile_jinja_template(src)
        for conv in CONVERSATIONS:
            for gen in (False, True):
                rendered = compiled.render(
                    messages=conv, add_generation_prompt=gen, bos_token="<s>", eos_token="</s>"
                )
                out.append(
                    {"name": name, "template": src, "messages": conv, "add_generation_prompt": gen, "rendered": rendered}
                )
    return {"generator": "tools/make_tokenizer_fixtures.py", "renderings": out}


SPM_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world! Hello there, hello again; the world says hello.",
    "Tokenizers split text into pieces: words, sub-words and single characters.",
    "def main():\n    print('hello, world')\n    return 0\n",
    "Numbers like 1234 and 3.14159 are split into digits.",
    "Café, naïve, résumé: accented letters appear now and then.",
    "She said: don't stop, we'll keep going until it's done.",
    "  Leading spaces and    runs of spaces are kept as they are.",
]


def spm():
    import sentencepiece as sp

    corpus = [line for _ in range(30) for line in SPM_CORPUS]
    model = io.BytesIO()
    sp.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus),
        model_writer=model,
        model_type="bpe",
        vocab_size=420,
        byte_fallback=True,
        character_coverage=0.99,
        normalization_rule_name="identity",
        add_dummy_prefix=True,
        remove_extra_whitespaces=False,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        num_threads=1,
        minloglevel=2,
    )
    proc = sp.SentencePieceProcessor(model_proto=model.getvalue())
    tokens, scores, types = [], [], []
    for i in range(proc.get_piece_size()):
        tokens.append(proc.id_to_piece(i))
        scores.append(proc.get_score(i))
        if proc.is_unknown(i):
            types.append(2)
        elif proc.is_control(i):
            types.append(3)
        elif proc.is_byte(i):
            types.append(6)
        elif proc.is_unused(i):
            types.append(5)
        else:
            types.append(1)
    cases = []
    for text in TEXTS:
        if "<" in text:
            continue  # sentencepiece itself does not match special tokens in text
        ids = proc.encode(text)
        cases.append({"text": text, "ids": ids, "decoded": proc.decode(ids)})
    return {
        "generator": "tools/make_tokenizer_fixtures.py",
        "sentencepiece": sp.__version__,
        "tokens": tokens,
        "scores": scores,
        "token_types": types,
        "bos": proc.bos_id(),
        "eos": proc.eos_id(),
        "unk": proc.unk_id(),
        "cases": cases,
    }


def write(name, obj):
    os.makedirs(DATA, exist_ok=True)
    with open(os.path.join(DATA, name), "w", encoding="utf-8") as fh:
        json.dump(obj, fh, ensure_ascii=False, indent=1)
        fh.write("\n")
    print("wrote", name, file=sys.stderr)


if __name__ == "__main__":
    jobs = {
        "smollm2": ("smollm2_tokenizer.json", smollm2),
        "pymoe": ("pymoe22m_tokenizer.json", pymoe),
        "templates": ("chat_templates.json", templates),
        "spm": ("spm_tokenizer.json", spm),
    }
    for job in sys.argv[1:] or ["smollm2", "pymoe", "templates"]:
        name, make = jobs[job]
        write(name, make())
