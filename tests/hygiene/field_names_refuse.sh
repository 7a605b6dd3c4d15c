#!/usr/bin/env bash
# tools/check_field_names.py must be able to fail: on a scratch tree it refuses a
# position field's name and a meta key spelled in a third file, and a name the writer
# spells itself, naming the files; literals in comments and in OTHER_FORMATS files
# (the metrics columns) are not counted.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
check() { python3 "$repo/tools/check_field_names.py" --root "$tmp" > "$tmp/out" 2>&1; }

mkdir -p "$tmp/include/resnet_ddp/io" "$tmp/src/io" "$tmp/src/app" "$tmp/src/train"
cat > "$tmp/include/resnet_ddp/io/checkpoint.h" <<'H'
  visit(PositionField{"global_step", true, false, E::WhenPositive}, p.global_step);
namespace meta_key {
inline constexpr char arch[] = "arch";
}
H
printf 'void write_attributes() { w.str(f, meta_key::arch, m.arch); }\n' > "$tmp/src/io/checkpoint_writer.cpp"
printf 'int global_step = read("global_step");  // "arch"\n' > "$tmp/src/io/reader.cpp"
printf 'Column c{"global_step", 1.0, true}; Column d{"arch", 2.0, true};\n' > "$tmp/src/train/report.cpp"
check || fail "a clean tree failed: $(cat "$tmp/out")"
grep -q "2 stored names, each in at most 2 files" "$tmp/out" || fail "names not read: $(cat "$tmp/out")"

printf 'auto x = "global_step";\n' > "$tmp/src/app/info.cpp"
check && fail "global_step in 3 files passed"
grep -q '"global_step" is spelled in 3 files (at most 2): include/resnet_ddp/io/checkpoint.h, src/app/info.cpp, src/io/reader.cpp' \
  "$tmp/out" || fail "the files not named: $(cat "$tmp/out")"
printf 'auto x = "arch"; auto y = "arch";\n' > "$tmp/src/app/info.cpp"
printf 'auto a = "arch";\n' > "$tmp/src/app/export.cpp"
check && fail "a meta key in 3 files passed"
grep -q '"arch" is spelled in 3 files' "$tmp/out" || fail "meta key not named: $(cat "$tmp/out")"
rm "$tmp/src/app/info.cpp" "$tmp/src/app/export.cpp"

printf 'void write_attributes() { w.str(f, meta_key::arch, m.arch); w.i64(f, "seed", m.seed); }\n' \
  > "$tmp/src/io/checkpoint_writer.cpp"
printf 'auto s = "seed";\n' > "$tmp/src/io/reader.cpp"
printf 'auto s = "seed";\n' > "$tmp/src/app/export.cpp"
check && fail "a name the writer spells, in 3 files, passed"
grep -q '"seed" is spelled in 3 files (at most 2): src/app/export.cpp, src/io/checkpoint_writer.cpp, src/io/reader.cpp' \
  "$tmp/out" || fail "the writer's own name not counted: $(cat "$tmp/out")"
echo "check_field_names refuses what it should"
