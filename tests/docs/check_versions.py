#!/usr/bin/env python3
"""The version and plugin API number the docs state against the ones refit has.

  python3 tests/docs/check_versions.py SOURCE_DIR

include/refit/version.h holds refit's version (kVersion) and plugin API (kPluginApiVersion), and
nothing else may decide them. Every place in README.md, CONTRIBUTING.md and docs/*.md that shows
what *this* refit prints or provides must agree with them:

- a run header or `--version` line: `refit X.Y.Z | recipe ...`, `refit X.Y.Z (plugin API N)`;
- a plugin listing line: `name V  (API N, LibTorch ...)`;
- the host's side of the API-mismatch message: `this refit (X.Y.Z) provides API version N`;
- `version.h (..., plugin API N)` where the docs describe the header, and the constant's value
  where they name it: `kPluginApiVersion` in `version.h`, N / `kPluginApiVersion = N`;
- the newest CHANGELOG.md section: `## X.Y.Z (... plugin API N)`.
Migration notes ("Migrating from API 5", tables of API 5 -> API 6) name old numbers on purpose and
are not matched. Exit 0 when everything agrees, else 1 with every difference.
"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
header = (root / "include/refit/version.h").read_text()
version = re.search(r'kVersion\s*=\s*"([0-9.]+)"', header).group(1)
api = re.search(r"kPluginApiVersion\s*=\s*(\d+)", header).group(1)

CHECKS = [
    # (what, pattern with groups named version and/or api)
    ("run header", re.compile(r"^\s*refit (?P<version>\d+\.\d+\.\d+) \| recipe ")),
    ("--version line", re.compile(r"refit (?P<version>\d+\.\d+\.\d+) \(plugin API (?P<api>\d+)\)")),
    ("plugin listing", re.compile(r"^\s*\w+ \d+\.\d+\.\d+ +\(API (?P<api>\d+), LibTorch")),
    ("API mismatch message", re.compile(r"this refit \((?P<version>\d+\.\d+\.\d+)\) provides API version (?P<api>\d+)")),
    ("version.h description", re.compile(r"version\.h` \([^)]*plugin API (?P<api>\d+)\)")),
    ("kPluginApiVersion's value", re.compile(r"kPluginApiVersion`?(?: in `version\.h`)?(?:, | = |: )(?P<api>\d+)\b")),
]

problems = []
files = [root / "README.md", root / "CONTRIBUTING.md", *sorted((root / "docs").glob("*.md"))]
for path in files:
    for number, line in enumerate(path.read_text().splitlines(), 1):
        for what, pattern in CHECKS:
            for m in pattern.finditer(line):
                found = m.groupdict()
                if found.get("version") not in (None, version) or found.get("api") not in (None, api):
                    problems.append(f"{path.relative_to(root)}:{number}: {what} says "
                                    f"{', '.join(f'{k} {v}' for k, v in found.items() if v)}; "
                                    f"version.h says version {version}, API {api}: {line.strip()[:120]}")

changelog = (root / "CHANGELOG.md").read_text()
newest = re.search(r"^## (\d+\.\d+\.\d+)[^\n]*", changelog, re.M)
if not newest or newest.group(1) != version or f"plugin API {api}" not in newest.group(0):
    problems.append(f"CHANGELOG.md: the newest section is {newest.group(0) if newest else 'missing'!r}; "
                    f"version.h says {version}, plugin API {api}")

for p in problems:
    print(p)
print(f"{len(problems)} differences from version.h (refit {version}, plugin API {api})")
sys.exit(1 if problems else 0)
