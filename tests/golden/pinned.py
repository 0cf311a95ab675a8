"""The package versions a golden generator's fixtures were made with, checked before anything is
imported or computed: another version may give other numbers, and the fixtures name these
versions (CONTRIBUTING.md, "Adding a golden fixture"). Each generator starts with

    import pinned; pinned.require(__file__, {"torch": "2.11.0", ...})
"""
from importlib import metadata


def require(script, versions):
    for package, wanted in versions.items():
        try:
            found = metadata.version(package)
        except metadata.PackageNotFoundError:
            found = "none"
        if found.split("+")[0] != wanted:
            raise SystemExit(f"{script}: needs {package}=={wanted}, the version its fixtures were made with; "
                             f"found {found} (~/.cache/refit/torch-2.11.0/bin/pip install {package}=={wanted})")
