#!/usr/bin/env python3
"""Checks the source tree's layout rules (docs/design.md, "The map"):

1. Families are plug-ins: outside src/families/, no file under src/ or include/ names a family.
   The families are the folders of src/families/; a file names one when its text (code or
   comment) contains the folder name, case-insensitively, also with a "v" before its digits
   ("yolo9" and "YOLOv9"). No exceptions: a family's own names for shared things (a schedule's
   name, say) are declared by the family.
2. Include rules: a folder of src/ includes only the folders ALLOWED lists for it (resolved as
   check_includes.py resolves them); nothing outside src/families/ includes a family, and a
   family includes no other family (the registry, src/families/registry.cpp, includes them all).

usage: scripts/check_layout.py [ROOT]   (default: the repository of this script)
       scripts/check_layout.py --self-test
Prints "layout ok: ..." and exits 0, or prints each violation (file:line: text) and exits 1.
"""
import os
import re
import sys
import tempfile

EXTENSIONS = (".hpp", ".h", ".cpp", ".cc", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')

# Folder of src/ -> folders of src/ its files may include. A folder not listed may include every
# folder but src/families/.
ALLOWED = {
    "core": {"core"},
    "kernels": {"kernels"},
    "io": {"core", "io"},
    "layers": {"core", "kernels", "layers"},
    "ops": {"core", "kernels", "layers", "ops"},
    "loss": {"core", "loss"},
    "data": {"core", "data", "io", "kernels", "ops"},
    "models": {"core", "data", "io", "kernels", "layers", "models", "ops"},
    "families": {"core", "data", "families", "io", "kernels", "layers", "loss", "models", "ops"},
}


def family_names(src):
    root = os.path.join(src, "families")
    if not os.path.isdir(root):
        return []
    return sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))


def name_pattern(name):
    m = re.match(r"^([a-z_]+)(\d.*)$", name)
    text = re.escape(m.group(1)) + "v?" + re.escape(m.group(2)) if m else re.escape(name)
    return re.compile(text, re.IGNORECASE)


def source_files(root, folders):
    for top in folders:
        base = os.path.join(root, top)
        for folder, _, names in os.walk(base):
            for n in sorted(names):
                if n.endswith(EXTENSIONS):
                    yield os.path.relpath(os.path.join(folder, n), root)


def top_folder(src_rel):
    """'engine/step.cpp' -> 'engine'; a file directly in src/ -> ''."""
    parts = src_rel.split("/")
    return parts[0] if len(parts) > 1 else ""


def check(root):
    src = os.path.join(root, "src")
    families = family_names(src)
    patterns = [(f, name_pattern(f)) for f in families]
    problems = []
    files = 0
    for rel in source_files(root, ["src", "include"]):
        files += 1
        path = os.path.join(root, rel)
        in_src = rel.startswith("src/")
        src_rel = rel[4:] if in_src else None
        folder = top_folder(src_rel) if in_src else "include"
        own_family = src_rel.split("/")[1] if in_src and folder == "families" and src_rel.count("/") >= 2 else None
        with open(path, encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
        for number, line in enumerate(lines, 1):
            if folder != "families":
                for fam, pat in patterns:
                    if pat.search(line):
                        problems.append(f"{rel}:{number}: names the family '{fam}' outside src/families/: {line.strip()}")
            inc = INCLUDE.match(line)
            if not inc or not in_src:
                continue
            target = None
            for candidate in (inc.group(1), os.path.join(os.path.dirname(src_rel), inc.group(1))):
                candidate = os.path.normpath(candidate).replace(os.sep, "/")
                if os.path.isfile(os.path.join(src, candidate)):
                    target = candidate
                    break
            if target is None:
                continue
            to = top_folder(target)
            if to == "families" and folder != "families":
                problems.append(f"{rel}:{number}: includes a family outside src/families/ (ask the registry): {line.strip()}")
            elif folder in ALLOWED and to and to not in ALLOWED[folder]:
                problems.append(f"{rel}:{number}: {folder}/ may not include {to}/: {line.strip()}")
            elif folder == "families" and own_family and to == "families":
                other = target.split("/")[1] if target.count("/") >= 2 else None
                if other and other != own_family:
                    problems.append(f"{rel}:{number}: the family '{own_family}' includes the family '{other}': {line.strip()}")
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} layout violation(s)")
        return 1
    print(f"layout ok: {files} files, families {', '.join(families) or '(none)'}")
    return 0


def self_test():
    with tempfile.TemporaryDirectory() as root:
        def write(path, text):
            os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
            with open(os.path.join(root, path), "w") as fh:
                fh.write(text)
        write("src/families/yolo7/model.hpp", "// YOLOv7\n")
        write("src/families/picodet/model.hpp", '#include "families/yolo7/model.hpp"\n')
        write("src/families/registry.cpp", '#include "families/yolo7/model.hpp"\n#include "families/picodet/model.hpp"\n')
        write("src/core/log.hpp", "// plain\n")
        write("src/engine/step.cpp", '#include "core/log.hpp"\n// uses the scheduler yoloxwarmcos\n')
        assert check(root) == 1  # picodet includes yolo7
        write("src/families/picodet/model.hpp", '#include "core/log.hpp"\n')
        assert check(root) == 0
        for bad in ("// as YOLOv7 does\n", "int picodet_width = 1;\n", '#include "families/yolo7/model.hpp"\n'):
            write("src/engine/step.cpp", bad)
            assert check(root) == 1, bad
        write("src/engine/step.cpp", "// fine\n")
        write("src/layers/conv.hpp", '#include "engine/step.cpp"\n')
        assert check(root) == 1  # layers/ may not include engine/
        write("src/layers/conv.hpp", '#include "core/log.hpp"\n')
        write("include/libreyolo/api.hpp", "// PicoDet\n")
        assert check(root) == 1
        write("include/libreyolo/api.hpp", "// none\n")
        assert check(root) == 0
    print("self-test passed")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--self-test":
        sys.exit(self_test())
    here = os.path.dirname(os.path.abspath(__file__))
    sys.exit(check(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(here)))
