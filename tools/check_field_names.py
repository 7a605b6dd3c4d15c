#!/usr/bin/env python3
"""Each checkpoint field's stored name is spelled in at most 2 files (ctest
`hygiene_field_names`).

The stored names are read from the sources themselves:
  - the RunPosition fields: `PositionField{"name", ...}` in
    include/resnet_ddp/io/checkpoint.h (for_each_position_field);
  - the CheckpointMeta attributes: the meta_key constants there, and any name the
    HDF5 writer (src/io/checkpoint_writer.cpp) spells itself when it fills an
    attribute from a meta member (`w.i64(f, "name", m.member)`,
    `write_strings(f, "name", m.member)`).
For each name, the files under src/ and include/ that hold it as a whole string
literal ("global_step"; comments are not read) are counted; more than 2 fails,
naming the files.

Files that speak another format whose keys happen to equal a field's name are not
counted, each for the reason in OTHER_FORMATS (e.g. the metrics JSON and CSV have a
`global_step` column of their own). A file there is skipped as a whole, so a
checkpoint field spelled in it would go unseen: keep the list to files that write
or read no checkpoint.

    tools/check_field_names.py [--root DIR]
"""
import argparse
import os
import re
import sys

LIMIT = 2
POSITION_HEADER = "include/resnet_ddp/io/checkpoint.h"
WRITER = "src/io/checkpoint_writer.cpp"
OTHER_FORMATS = {
    "src/train/report.cpp": "declares the metrics JSON/CSV columns (epoch, global_step, ...)",
    "src/train/trainer_report.cpp": "picks metrics columns by name",
    "src/train/timm_args.cpp": "reads timm's args.yaml keys (batch_size, seed, ...)",
    "src/data/packed.cpp": "reads the packed dataset's own HDF5 attributes",
    "src/data/pack_writer.cpp": "writes the packed dataset's own HDF5 attributes",
}
SUFFIXES = (".cpp", ".h", ".cu", ".cuh", ".hpp", ".def")
POSITION_NAME = re.compile(r'PositionField\{"(\w+)"')
META_KEY = re.compile(r'inline constexpr char \w+\[\] = "(\w+)";')
META_NAME = re.compile(r'(?:\bw\.\w+|write_strings)\(\s*f,\s*"(\w+)",\s*m\.')
COMMENT = re.compile(r'//[^\n]*|/\*.*?\*/|("(?:\\.|[^"\\\n])*")', re.S)


def without_comments(text):
    """The text with // and /* */ comments removed, string literals kept."""
    return COMMENT.sub(lambda m: m.group(1) or " ", text)


def read(root, rel):
    with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
        return without_comments(f.read())


def stored_names(root):
    header = read(root, POSITION_HEADER)
    names = POSITION_NAME.findall(header) + META_KEY.findall(header) + META_NAME.findall(read(root, WRITER))
    if not names:
        sys.exit(f"check_field_names: no field names found in {POSITION_HEADER} or {WRITER}")
    return list(dict.fromkeys(names))


def holders(root, names):
    """name -> the files (relative paths) that hold it as a string literal."""
    found = {n: [] for n in names}
    literal = {n: re.compile(r'"' + n + r'"') for n in names}
    for top in ("src", "include"):
        for d, _, files in os.walk(os.path.join(root, top)):
            for fn in sorted(files):
                rel = os.path.relpath(os.path.join(d, fn), root)
                if not fn.endswith(SUFFIXES) or rel in OTHER_FORMATS:
                    continue
                text = read(root, rel)
                for n in names:
                    if literal[n].search(text):
                        found[n].append(rel)
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    args = ap.parse_args()
    names = stored_names(args.root)
    found = holders(args.root, names)
    problems = []
    for n in names:
        if len(found[n]) > LIMIT:
            problems.append(f'"{n}" is spelled in {len(found[n])} files (at most {LIMIT}): {", ".join(sorted(found[n]))}')
    if problems:
        print("\n".join(problems))
        print("A checkpoint field's stored name belongs to one list (for_each_position_field, meta_key in "
              f"{POSITION_HEADER}): take it from there.")
        return 1
    print(f"check_field_names: {len(names)} stored names, each in at most {LIMIT} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
