#!/usr/bin/env python3
"""The CLI the docs describe against the CLI refit has (its CLI11 --help output).

  python3 tests/docs/check_cli_docs.py REFIT SOURCE_DIR

1. README.md's "The CLI" block is the reference: its lines that start with `refit ` name every
   verb once with all of its flags. The verbs must be exactly the subcommands of `refit --help`,
   the flags of each exactly the options of `refit <verb> --help` (without --help), and
   `refit --version` the top-level options.
2. Every command written in code anywhere in README.md and docs/*.md (fenced blocks and inline
   code: `refit train --resume`, `scripts/refit train ...`, `build/refit export ...`) names a
   verb refit has, with flags that verb has.
Exit 0 when they agree, else 1 with every difference.
"""
import pathlib
import re
import subprocess
import sys

FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
# `refit` as a command word (not refit_core, refit/plugin.h, a version line "refit 0.4.0").
COMMAND = re.compile(r"(?<![\w.-])refit\"?[ \t]+(--[a-z][a-z0-9-]*|[a-z][a-z0-9-]*)(.*)")


def help_text(refit, *args):
    r = subprocess.run([refit, *args, "--help"], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise SystemExit(f"{refit} {' '.join(args)} --help failed ({r.returncode}): {r.stderr}")
    return r.stdout


def sections(text):
    """CLI11's help: {"Options": [lines], "Subcommands": [lines], ...}."""
    out, current = {}, None
    for line in text.splitlines():
        m = re.fullmatch(r"([A-Z][A-Za-z ]*):", line.strip())
        if m and not line.startswith(" "):
            current = m.group(1)
            out[current] = []
        elif current and line.strip():
            out[current].append(line)
    return out


def help_flags(text):
    flags = set()
    for line in sections(text).get("Options", []):
        m = re.match(r"^  (-\S+)", line)  # an option's own line (descriptions are indented further)
        if m:
            flags.update(f for f in m.group(1).split(",") if f.startswith("--"))
    return flags - {"--help"}


def cli(refit):
    top = help_text(refit)
    verbs = {}
    for line in sections(top).get("Subcommands", []):
        m = re.match(r"^  ([a-z][\w-]*)\s", line + " ")
        if m:
            verbs[m.group(1)] = help_flags(help_text(refit, m.group(1)))
    return help_flags(top), verbs


def fenced_blocks(text):
    """(first line number, lines) of every fenced code block."""
    blocks, inside, start, body = [], False, 0, []
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            if inside:
                blocks.append((start, body))
            inside, start, body = not inside, n + 1, []
        elif inside:
            body.append(line)
    return blocks


def commands_in(text):
    """(line number, verb or top-level flag, flags, in command position) of every `refit WORD` in code."""
    found = []
    in_fence = False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            continue
        if in_fence:
            pieces = [re.split(r" #|;|&&| \| ", line)[0]]
        else:
            pieces = re.findall(r"`([^`]+)`", line)
        for piece in pieces:
            for m in COMMAND.finditer(piece):
                # In command position: first in the code (after `$ `, VAR=value assignments), or
                # run by path (scripts/refit, build/refit, "$P/bin/refit"); else prose in code
                # ("the smallest complete refit run"), checked only when it names a verb.
                prefix = piece[:m.start()]
                command = bool(re.fullmatch(r"\s*(\$\s+)?([A-Z_]+=\S*\s+)*\"?", prefix)) or prefix.endswith("/")
                found.append((n, m.group(1), set(FLAG.findall(m.group(2))), command))
    return found


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    refit, source = sys.argv[1], pathlib.Path(sys.argv[2])
    top_flags, verbs = cli(refit)
    problems = []

    # 1. README's CLI block: every verb, every flag, nothing else.
    readme = (source / "README.md").read_text()
    part = readme.split("\n## The CLI", 1)
    blocks = fenced_blocks(part[1]) if len(part) == 2 else []
    if not blocks:
        problems.append("README.md: no code block under \"## The CLI\"")
    documented, top_documented = {}, set()
    offset = part[0].count("\n") + 1
    for start, body in blocks[:1]:
        for k, line in enumerate(body):
            if not line.startswith("refit "):
                continue
            synopsis = re.split(r"\s{2,}", line.strip())[0]
            words = synopsis.split()
            where = f"README.md:{offset + start + k}"
            if words[1].startswith("--"):
                top_documented |= set(FLAG.findall(synopsis))
            elif words[1] in documented:
                problems.append(f"{where}: `refit {words[1]}` documented twice in the CLI block")
            else:
                documented[words[1]] = (where, set(FLAG.findall(synopsis)))
    for verb in sorted(set(verbs) - set(documented)):
        problems.append(f"README.md, The CLI: `refit {verb}` exists (refit --help) but is not documented")
    for verb in sorted(set(documented) - set(verbs)):
        problems.append(f"{documented[verb][0]}: `refit {verb}` is documented, but refit has no such verb")
    for verb in sorted(set(documented) & set(verbs)):
        where, flags = documented[verb]
        for f in sorted(verbs[verb] - flags):
            problems.append(f"{where}: `refit {verb} {f}` exists (refit {verb} --help) but is not documented")
        for f in sorted(flags - verbs[verb]):
            problems.append(f"{where}: `refit {verb} {f}` is documented, but refit {verb} has no such option")
    for f in sorted(top_flags - top_documented):
        problems.append(f"README.md, The CLI: `refit {f}` exists (refit --help) but is not documented")
    for f in sorted(top_documented - top_flags):
        problems.append(f"README.md, The CLI: `refit {f}` is documented, but refit has no such option")

    # 2. Every command written in code in the docs.
    files = [source / "README.md"] + sorted((source / "docs").glob("*.md"))
    checked = 0
    for path in files:
        for n, word, flags, command in commands_in(path.read_text()):
            where = f"{path.relative_to(source)}:{n}"
            if not command and not word.startswith("--") and word not in verbs:
                continue
            checked += 1
            if word.startswith("--"):
                allowed = top_flags | {"--help"}
                flags = flags | {word}
            elif word in verbs:
                allowed = verbs[word] | {"--help"}
            else:
                problems.append(f"{where}: `refit {word}`: refit has no verb {word!r} (verbs: {', '.join(sorted(verbs))})")
                continue
            for f in sorted(flags - allowed):
                problems.append(f"{where}: `refit {word} {f}`: no such option" if not word.startswith("--")
                                else f"{where}: `refit {f}`: no such option")

    if problems:
        print(f"the docs and refit's CLI disagree ({len(problems)}):")
        for p in problems:
            print("  " + p)
        return 1
    print(f"README.md documents refit's {len(verbs)} verbs and their flags as refit --help does; "
          f"{checked} commands in README.md and docs/*.md use real verbs and flags")
    return 0


if __name__ == "__main__":
    sys.exit(main())
