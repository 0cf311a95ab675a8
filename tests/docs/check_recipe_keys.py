#!/usr/bin/env python3
"""docs/recipes.md's key tables against the keys refit's recipe parser accepts, object by object.

  python3 tests/docs/check_recipe_keys.py REFIT SOURCE_DIR TEST_PLUGIN_DIR WORK_DIR [RECIPES_MD]

The documented keys come from docs/recipes.md's tables (the convention is stated there, under
"Keys"): a table whose first column is headed `Pointer` names one key per row as a full JSON
pointer (`/training/batch_size`; `<i>`, `<j>`, `<name>` stand for array indices and free names),
and a row typed `component` (`array of components`) documents that object's (each element's)
`type` and `config`; a table headed `Key in `/a`, `/b`` names keys of the objects listed.
Tables headed otherwise (a factory's `Key in `config``, messages, units) are not recipe keys.

The accepted keys come from the parser itself. ConfigReader::finish() reports a key nobody asked
for as `unknown key (expected one of: <the keys that object asked for>)` when no known key is
close to it. tests/docs/maximal-recipe.json holds every documented key; the check
  1. that every documented object and key occurs in it (else the check below proves nothing),
  2. validates it: no problem at all, so every documented key is accepted;
  3. plants the key "zzzzzzzz" in every documented object of it at once and validates again:
     each planted key must be reported with the list of keys its object accepts, and per
     object pattern the union of those lists must equal the documented keys (an EMA entry of
     /models asks for fewer keys than a trained one; the union is over both).
Objects whose keys are free names (/data/sets, /models/<i>/inputs) and factory configs other
than the documented classification objective's are not planted. Exit 0 when docs and parser
agree, else 1 with every difference.
"""
import json
import os
import pathlib
import re
import struct
import subprocess
import sys

PLANT = "zzzzzzzz"
WILD = "*"


def segments(pointer):
    return [s for s in pointer.split("/")[1:]] if pointer else []


def normalise(pointer):
    """'/models/<i>/ema' -> ('models', '*', 'ema')."""
    return tuple(WILD if re.fullmatch(r"<[^>]+>", s) else s for s in segments(pointer))


def show(pattern):
    return "/" + "/".join("<*>" if s == WILD else s for s in pattern) if pattern else "/ (top level)"


def cells(line):
    line = line.strip()
    if not (line.startswith("|") and line.endswith("|")):
        return None
    # Split on | not escaped as \| (inside code spans in tables).
    parts = re.split(r"(?<!\\)\|", line[1:-1])
    return [p.strip() for p in parts]


def documented_keys(markdown):
    """{object pattern: set of keys} from the tables of docs/recipes.md."""
    doc = {}
    problems = []

    def add(pattern, key):
        doc.setdefault(pattern, set()).add(key)

    def add_pointer(pattern):
        for n in range(len(pattern)):
            add(pattern[:n], pattern[n])
        doc.setdefault(pattern, doc.get(pattern, set()))

    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        header = cells(lines[i])
        if header is None or i + 1 >= len(lines) or not re.fullmatch(r"\|[\s|:-]+\|", lines[i + 1].strip()):
            i += 1
            continue
        first = header[0]
        mode, objects = None, []
        if first == "Pointer":
            mode = "pointer"
        elif first.startswith("Key in"):
            objects = re.findall(r"`([^`]*)`", first)
            if objects and all(o.startswith("/") for o in objects):
                mode = "key"
        type_column = header.index("Type") if "Type" in header else None
        i += 2
        while i < len(lines) and cells(lines[i]) is not None:
            row = cells(lines[i])
            if mode:
                names = re.findall(r"^`([^`]+)`$", row[0])
                if not names:
                    problems.append(f"docs/recipes.md:{i + 1}: the first cell of a key table is not one backticked key: {row[0]!r}")
                elif mode == "pointer":
                    if not names[0].startswith("/"):
                        problems.append(f"docs/recipes.md:{i + 1}: a Pointer table row that is not a full JSON pointer: {names[0]!r}")
                    else:
                        pattern = normalise(names[0])
                        add_pointer(pattern)
                        kind = row[type_column] if type_column is not None and type_column < len(row) else ""
                        if "array of components" in kind:
                            add_pointer(pattern + (WILD,))
                            for k in ("type", "config"):
                                add(pattern + (WILD,), k)
                        elif re.fullmatch(r"components?", kind.strip()):
                            for k in ("type", "config"):
                                add(pattern, k)
                else:
                    for o in objects:
                        pattern = normalise(o)
                        add_pointer(pattern)
                        add(pattern, names[0])
            i += 1
    return doc, problems


def matches(pattern, concrete):
    return len(pattern) == len(concrete) and all(p == WILD or p == c for p, c in zip(pattern, concrete))


def pattern_of(doc, concrete):
    """The most specific documented object pattern that the concrete path matches."""
    best = None
    for p in doc:
        if matches(p, concrete) and (best is None or p.count(WILD) < best.count(WILD)):
            best = p
    return best


def objects_in(value, path=()):
    """Every JSON object in the document, with its path."""
    if isinstance(value, dict):
        yield path, value
        for k, v in value.items():
            yield from objects_in(v, path + (k,))
    elif isinstance(value, list):
        for n, v in enumerate(value):
            yield from objects_in(v, path + (str(n),))


def write_mlp_weights(path):
    """A safetensors file for the maximal recipe's mlp (16 -> 16 -> 4), float32 zeros."""
    tensors = [("layers.0.weight", [16, 16]), ("layers.0.bias", [16]), ("layers.1.weight", [4, 16]), ("layers.1.bias", [4])]
    header, offset = {}, 0
    for name, shape in tensors:
        n = 4
        for d in shape:
            n *= d
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes(offset))


def validate(refit, recipe, env):
    r = subprocess.run([refit, "validate", str(recipe)], capture_output=True, text=True, env=env, timeout=300)
    return r.returncode, r.stdout + r.stderr


def main():
    if len(sys.argv) not in (5, 6):
        print(__doc__)
        return 2
    refit = str(pathlib.Path(sys.argv[1]).resolve())
    source, plugin_dir, work = (pathlib.Path(a).resolve() for a in sys.argv[2:5])
    recipes_md = pathlib.Path(sys.argv[5]) if len(sys.argv) == 6 else source / "docs" / "recipes.md"
    work.mkdir(parents=True, exist_ok=True)
    write_mlp_weights(work / "mlp.safetensors")
    env = dict(os.environ, REFIT_SOURCE_DIR=str(source), REFIT_TEST_PLUGIN_DIR=str(plugin_dir), REFIT_DOCS_WORK_DIR=str(work))

    doc, problems = documented_keys(recipes_md.read_text())
    if not doc.get(()):
        problems.append(f"{recipes_md}: no key tables found")
    # Objects whose keys are free names: not planted, their keys not compared.
    open_objects = {p for p, keys in doc.items() if WILD in keys}
    compared = {p: keys for p, keys in doc.items() if keys and p not in open_objects}

    recipe = json.loads((source / "tests" / "docs" / "maximal-recipe.json").read_text())
    planted = []  # concrete paths
    present = {}  # pattern -> keys present in the recipe
    for path, obj in objects_in(recipe):
        p = pattern_of(compared, path)
        if p is None:
            continue
        planted.append(path)
        present.setdefault(p, set()).update(obj.keys())
    for p, keys in sorted(compared.items()):
        if p not in present:
            problems.append(f"{show(p)}: documented, but tests/docs/maximal-recipe.json has no such object (add one)")
            continue
        for k in sorted(keys - present[p] - {WILD}):
            problems.append(f"{show(p + (k,))}: documented, but not in tests/docs/maximal-recipe.json (add it)")

    # 2. The maximal recipe validates: every documented key is accepted.
    (work / "maximal.json").write_text(json.dumps(recipe, indent=1))
    rc, out = validate(refit, work / "maximal.json", env)
    if rc != 0 or ": OK (" not in out:
        problems.append("tests/docs/maximal-recipe.json (every documented key) does not validate:\n    " + out.strip().replace("\n", "\n    "))

    # 3. Plant an unknown key in every documented object: each is reported with what it accepts.
    for path, obj in objects_in(recipe):
        if path in planted:
            obj[PLANT] = 1
    (work / "planted.json").write_text(json.dumps(recipe, indent=1))
    rc, out = validate(refit, work / "planted.json", env)
    reported = {}
    line = re.compile(r"^\s*(\S*)/" + PLANT + r": unknown key(?: \(expected one of: (.*)\))?$")
    for text in out.splitlines():
        m = line.match(text)
        if m:
            reported[tuple(segments(m.group(1)))] = set(m.group(2).split(", ")) if m.group(2) else set()
    accepted = {}
    for path in planted:
        p = pattern_of(compared, path)
        if path not in reported:
            problems.append(f"{'/' + '/'.join(path + (PLANT,))}: planted, but refit validate did not report it as an unknown key")
            continue
        keys = reported[path]
        accepted.setdefault(p, set()).update(keys)
        for k in sorted(keys - compared[p]):
            problems.append(f"{'/' + '/'.join(path + (k,))}: the parser accepts it, docs/recipes.md does not document it")
    for p, keys in sorted(accepted.items()):
        for k in sorted(compared[p] - keys):
            problems.append(f"{show(p + (k,))}: documented in docs/recipes.md, but the parser does not accept it")
    others = [t for t in out.splitlines() if "unknown key" in t and PLANT not in t]
    problems += [f"unexpected: {t.strip()}" for t in others]

    if problems:
        print(f"docs/recipes.md and the recipe parser disagree ({len(problems)}):")
        for p in problems:
            print("  " + p)
        return 1
    print(f"docs/recipes.md documents the keys the parser accepts: {len(compared)} objects, "
          f"{sum(len(k) for k in compared.values())} keys; arrays and objects of free names (not planted): "
          + ", ".join(show(p) for p in sorted(open_objects)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
