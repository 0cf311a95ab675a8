#!/usr/bin/env python3
"""Prints the size of the code as Markdown tables, for a note or a review: the largest files, the
longest functions, the SDK's size and framework/'s folder include edges.

  python3 scripts/code_size.py [--rev REV] [--compare REV] [--repo DIR]

  --rev REV      measure the files of commit REV (git ls-tree / git show); default: the working
                 tree (tracked files and untracked ones git does not ignore)
  --compare REV  print REV ("before") beside --rev or the working tree ("after")

What is counted:
  files      the 15 largest .h/.cpp files under framework/, include/ and plugins/, in lines
  functions  the 10 longest function bodies in framework/ and plugins/ (.h/.cpp), in lines from
             the line of the opening brace to the line of the closing one (file:line names the
             signature's first line). A heuristic, not a
             parser: comments, strings and preprocessor lines are blanked first; a `{` at
             namespace or class scope opens a function when the text before it is a signature
             (a `)` followed by nothing but qualifiers, a trailing return type or a constructor's
             initializers); lambdas and local classes count toward their function; initializers
             at namespace scope (`= {...}`) are not functions.
  SDK        the lines of every file under include/refit/
  includes   distinct framework folder -> folder include edges (scripts/check_layers.py's
             pattern), whether they form a cycle, and how many go against check_layers.py's layers
"""
import argparse
import importlib.util
import pathlib
import re
import subprocess
import sys

SOURCE_DIRS = ("framework", "include", "plugins")
FUNCTION_DIRS = ("framework", "plugins")
TOP_FILES = 15
TOP_FUNCTIONS = 10


def load_check_layers():
    """scripts/check_layers.py as a module: its include pattern and layers are the ones used here."""
    path = pathlib.Path(__file__).resolve().parent / "check_layers.py"
    spec = importlib.util.spec_from_file_location("check_layers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- reading a tree --------------------------------------------------------------------------


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True).stdout


def is_source(path):
    return path.endswith((".h", ".cpp"))


def read_tree(repo, rev):
    """{path: text} of every file under SOURCE_DIRS, at `rev` or (None) in the working tree."""
    if rev is None:
        listed = git(repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *SOURCE_DIRS)
        paths = [p for p in listed.decode().split("\0") if p and (repo / p).is_file()]
        return {p: (repo / p).read_text(errors="replace") for p in sorted(set(paths))}
    listed = git(repo, "ls-tree", "-r", "-z", "--name-only", rev, "--", *SOURCE_DIRS)
    paths = [p for p in listed.decode().split("\0") if p]
    return {p: git(repo, "show", f"{rev}:{p}").decode(errors="replace") for p in paths}


def line_count(text):
    return text.count("\n") + (0 if text.endswith("\n") or not text else 1)


# ---- functions -------------------------------------------------------------------------------


def blank_non_code(text):
    """`text` with comments, string and character literals and preprocessor lines replaced by
    spaces, newlines kept (line numbers stay right and no brace inside them counts)."""
    out = []
    i, n = 0, len(text)
    at_line_start = True  # only whitespace since the last newline
    while i < n:
        c = text[i]
        if c == "\n":
            out.append(c)
            at_line_start = True
            i += 1
            continue
        if at_line_start and c == "#":  # a preprocessor line, with its continuations
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append(" \n")
                    i += 2
                    continue
                out.append(" ")
                i += 1
            continue
        if not c.isspace():
            at_line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"' and i > 0 and text[i - 1] == "R" and (i < 2 or not (text[i - 2].isalnum() or text[i - 2] == "_")
                                                          or text[i - 3:i - 1] == "u8" or text[i - 2] in "LuU"):
            m = re.match(r'"([^()\\\s]{0,16})\(', text[i:])
            end = text.find(")" + (m.group(1) if m else "") + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"' or (c == "'" and not is_digit_separator(text, i)):
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(" " * (j - i))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def is_digit_separator(text, i):
    """Whether the ' at i separates digits (1'000) rather than opening a character literal."""
    prev = text[i - 1] if i > 0 else " "
    if not (prev.isalnum() or prev == "_"):
        return False
    # L'x', u'x', U'x', u8'x': a prefix, not a number
    word = re.search(r"[A-Za-z0-9_]+$", text[max(0, i - 32):i]).group(0)
    return word not in ("L", "u", "U", "u8")


TEMPLATE_PREFIX = re.compile(r"^\s*template\s*<")
ACCESS = re.compile(r"\b(public|private|protected)\s*:(?!:)")
QUALIFIERS_TAIL = re.compile(r"^(\s|\bconst\b|\bnoexcept\b|\boverride\b|\bfinal\b|\bmutable\b|\bvolatile\b|&|->[\w\s:<>,*&]*"
                             r"|\btry\b)*$")


def strip_template_prefix(s):
    """`s` without leading `template <...>` clauses."""
    while TEMPLATE_PREFIX.match(s):
        i, depth = s.index("<"), 0
        for j in range(i, len(s)):
            depth += {"<": 1, ">": -1}.get(s[j], 0)
            if depth == 0:
                s = s[j + 1:]
                break
        else:
            return s
    return s


def depth_zero(s, ch):
    """Whether `ch` occurs in `s` outside parentheses, brackets and angle brackets."""
    depth = 0
    for k, c in enumerate(s):
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif c == ch and depth == 0:
            if ch == "=" and (s[k + 1:k + 2] == "=" or s[k - 1:k] in "=!<>" or s[max(0, k - 8):k].rstrip().endswith("operator")):
                continue
            return True
    return False


def classify(pending):
    """What a `{` at namespace or class scope opens, from the text before it since the last
    declaration ended: 'scope' (namespace, class, extern "C"), 'init' (a member's braced
    initializer inside a constructor's initializer list), 'function' or 'other'."""
    s = strip_template_prefix(ACCESS.sub(" ", pending)).strip()
    if re.search(r"\bnamespace\b", s) or re.match(r'^extern\s+"?\s*"?$', s) or s == "extern":
        return "scope"
    if re.match(r"^(typedef\s+)?(class|struct|union|enum)\b", s) and "(" not in s:
        return "scope"
    if ")" not in s or depth_zero(s, "="):
        return "other"
    close = s.rfind(")")
    tail = s[close + 1:]
    if QUALIFIERS_TAIL.match(tail):
        return "function"
    # Foo(int a) : x_(a), y_{ ... }: the brace of a member initializer
    if re.search(r"\)\s*(const\s*|noexcept\s*)*:\s*[^;]*[\w>]\s*$", s):
        return "init"
    return "other"


def function_name(pending):
    s = strip_template_prefix(ACCESS.sub(" ", pending)).strip()
    s = re.sub(r"\s+", " ", s)
    m = re.search(r"((?:[~\w:]*::)?operator\s*(?:\(\s*\)|[^\s(]+)|[~\w:]+(?:<[^()]*>)?)\s*\(", s)
    return m.group(1).replace(" ", "") if m else s[:40]


def functions(text):
    """[(name, signature's first line, opening brace's line, closing brace's line)] of the
    functions defined in `text`."""
    code = blank_non_code(text)
    found = []
    stack = []  # one entry per open brace: (kind, signature's first line, brace's line, name)
    pending, line, pending_line = "", 1, 1  # the text since the last declaration, where it starts
    for c in code:
        if c == "\n":
            line += 1
        at_scope = all(entry[0] == "scope" for entry in stack)
        if at_scope and not pending.strip():
            pending_line = line
        if c == "{":
            if at_scope:
                kind = classify(pending)
                stack.append((kind, pending_line, line, function_name(pending) if kind == "function" else ""))
                if kind != "init":
                    pending = ""
            else:
                stack.append(("block", line, line, ""))
        elif c == "}":
            if not stack:
                continue
            kind, start, brace, name = stack.pop()
            if kind == "function":
                found.append((name, start, brace, line))
            if all(entry[0] == "scope" for entry in stack):
                pending = pending + "()" if kind == "init" else ""  # an initializer reads as `y_()`
        elif c == ";" and at_scope:
            pending = ""
        elif at_scope:
            pending += c
    return found


# ---- includes --------------------------------------------------------------------------------


def folder_edges(tree, include_pattern):
    folders = {p.split("/")[1] for p in tree if p.startswith("framework/") and p.count("/") >= 2}
    edges = set()
    for path, text in tree.items():
        parts = path.split("/")
        if parts[0] != "framework" or len(parts) < 3 or not is_source(path):
            continue
        for l in text.splitlines():
            m = include_pattern.match(l)
            if m and m.group(1) in folders and m.group(1) != parts[1]:
                edges.add((parts[1], m.group(1)))
    return edges


def has_cycle(edges):
    graph = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    state = {}  # 1: on the path, 2: done

    def visit(node):
        state[node] = 1
        for nxt in graph.get(node, ()):
            if state.get(nxt) == 1 or (nxt not in state and visit(nxt)):
                return True
        state[node] = 2
        return False

    return any(node not in state and visit(node) for node in list(graph))


# ---- measuring -------------------------------------------------------------------------------


def measure(repo, rev, layers):
    tree = read_tree(repo, rev)
    sources = {p: t for p, t in tree.items() if is_source(p)}
    files = sorted(((line_count(t), p) for p, t in sources.items()), key=lambda x: (-x[0], x[1]))
    funcs = []
    for p, t in sources.items():
        if p.split("/")[0] in FUNCTION_DIRS:
            funcs += [(end - brace + 1, p, name, start) for name, start, brace, end in functions(t)]
    funcs.sort(key=lambda x: (-x[0], x[1], x[3]))
    sdk = [p for p in tree if p.startswith("include/refit/")]
    edges = folder_edges(tree, layers.INCLUDE)
    against = [(a, b) for a, b in edges if a in layers.RANK and b in layers.RANK and layers.RANK[b] >= layers.RANK[a]]
    return {
        "files": files,
        "functions": funcs,
        "source_lines": sum(n for n, _ in files),
        "sdk_lines": sum(line_count(tree[p]) for p in sdk),
        "sdk_files": len(sdk),
        "edges": edges,
        "cycle": has_cycle(edges),
        "against_layers": sorted(against),
    }


def delta(before, after):
    if before is None or after is None:
        return ""
    d = after - before
    return f"{d:+d}" if d else "0"


def print_single(m, label):
    print(f"## Code size: {label}\n")
    print(f"### The {TOP_FILES} largest files (.h/.cpp under {', '.join(d + '/' for d in SOURCE_DIRS)})\n")
    print("| file | lines |\n|---|---:|")
    for n, p in m["files"][:TOP_FILES]:
        print(f"| {p} | {n} |")
    print(f"| all {len(m['files'])} files | {m['source_lines']} |\n")
    print(f"### The {TOP_FUNCTIONS} longest functions ({', '.join(d + '/' for d in FUNCTION_DIRS)})\n")
    print("| function | file:line | lines |\n|---|---|---:|")
    for n, p, name, start in m["functions"][:TOP_FUNCTIONS]:
        print(f"| `{name}` | {p}:{start} | {n} |")
    print()
    print("### SDK and includes\n")
    print("| measure | value |\n|---|---:|")
    print(f"| SDK (include/refit/) lines | {m['sdk_lines']} |")
    print(f"| SDK files | {m['sdk_files']} |")
    print(f"| framework folder include edges | {len(m['edges'])} |")
    print(f"| include cycle between folders | {'yes' if m['cycle'] else 'no'} |")
    print(f"| edges against the layers (check_layers.py) | {len(m['against_layers'])} |")
    if m["against_layers"]:
        print("\nAgainst the layers: " + ", ".join(f"{a}->{b}" for a, b in m["against_layers"]))


def print_compare(before, after, before_label, after_label):
    print(f"## Code size: {before_label} (before) and {after_label} (after)\n")
    print(f"### The {TOP_FILES} largest files after (.h/.cpp under {', '.join(d + '/' for d in SOURCE_DIRS)})\n")
    old = {p: n for n, p in before["files"]}
    print("| file | before | after | change |\n|---|---:|---:|---:|")
    for n, p in after["files"][:TOP_FILES]:
        print(f"| {p} | {old.get(p, '—')} | {n} | {delta(old.get(p), n)} |")
    print(f"| all files ({len(before['files'])} before, {len(after['files'])} after) | {before['source_lines']} | "
          f"{after['source_lines']} | {delta(before['source_lines'], after['source_lines'])} |")
    top_after = {p for _, p in after["files"][:TOP_FILES]}
    new = {p: n for n, p in after["files"]}
    left = [(n, p) for n, p in before["files"][:TOP_FILES] if p not in top_after]
    if left:
        print("\nLeft the top " + str(TOP_FILES) + ": " +
              ", ".join(f"{p} ({n} → {new.get(p, 'gone')})" for n, p in left))
    print()
    print(f"### The {TOP_FUNCTIONS} longest functions ({', '.join(d + '/' for d in FUNCTION_DIRS)})\n")
    print("| # | before | lines | after | lines |\n|---:|---|---:|---|---:|")
    for i in range(TOP_FUNCTIONS):
        cells = []
        for m in (before, after):
            if i < len(m["functions"]):
                n, p, name, start = m["functions"][i]
                cells += [f"`{name}` ({p}:{start})", str(n)]
            else:
                cells += ["", ""]
        print(f"| {i + 1} | " + " | ".join(cells) + " |")
    print()
    print("### SDK and includes\n")
    print("| measure | before | after | change |\n|---|---:|---:|---:|")
    for label, key in (("SDK (include/refit/) lines", "sdk_lines"), ("SDK files", "sdk_files")):
        print(f"| {label} | {before[key]} | {after[key]} | {delta(before[key], after[key])} |")
    eb, ea = len(before["edges"]), len(after["edges"])
    print(f"| framework folder include edges | {eb} | {ea} | {delta(eb, ea)} |")
    yn = lambda m: "yes" if m["cycle"] else "no"
    print(f"| include cycle between folders | {yn(before)} | {yn(after)} | |")
    lb, la = len(before["against_layers"]), len(after["against_layers"])
    print(f"| edges against the layers (check_layers.py) | {lb} | {la} | {delta(lb, la)} |")
    for label, m in (("before", before), ("after", after)):
        if m["against_layers"]:
            print(f"\nAgainst the layers {label}: " + ", ".join(f"{a}->{b}" for a, b in m["against_layers"]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rev", help="a git revision (default: the working tree)")
    parser.add_argument("--compare", metavar="REV", help="print REV's figures beside --rev's or the working tree's")
    parser.add_argument("--repo", default=str(pathlib.Path(__file__).resolve().parent.parent), help="the repository")
    args = parser.parse_args()
    repo = pathlib.Path(args.repo)
    layers = load_check_layers()

    def label(rev):
        if rev is None:
            return "working tree"
        short = git(repo, "rev-parse", "--short", rev).decode().strip()
        return rev if short.startswith(rev) or rev.startswith(short) else f"{rev} ({short})"

    try:
        after = measure(repo, args.rev, layers)
        if args.compare:
            print_compare(measure(repo, args.compare, layers), after, label(args.compare), label(args.rev))
        else:
            print_single(after, label(args.rev))
    except subprocess.CalledProcessError as e:
        sys.exit(f"code_size.py: {' '.join(e.cmd)}: {e.stderr.decode().strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
