#!/usr/bin/env python3
"""Lists functions in src/ longer than a limit (ctest `hygiene_function_length`).

A function may run past the limit (default 80 lines, its opening brace to its
closing one) when the comment just above it says why, with the marker
"Long because:" (e.g. "// Long because: one switch over every op, each case a
line."). Functions listed in tools/function_length_allow.txt ("path function" a
line: today's offenders, being shortened) pass too; an entry that no longer
names a long function fails, so the list only shrinks, and so does a "Long
because:" above a function that is no longer over the limit (a stale reason).

The C++ is not parsed: comments, strings and preprocessor lines are blanked,
then braces are matched. A brace whose text since the previous ';', '{' or '}'
holds a parameter list ')' and is not a namespace, class, enum or initialiser
opens a function; lambdas and local classes count toward their function.

    tools/check_function_length.py [--root DIR] [--limit 80] [--list]
"""
import argparse
import os
import re
import sys

MARKER = "Long because:"
SUFFIXES = (".cpp", ".h", ".cu", ".cuh", ".hpp")
KEYWORDS = {"if", "for", "while", "switch", "catch", "return", "sizeof", "decltype"}
SCOPE = re.compile(r"\b(namespace|class|struct|union|enum)\b")


def blank(text):
    """Comments, string/char literals and preprocessor lines as spaces (newlines kept)."""
    out, i, n = [], 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c == "#" or (line_start and c in " \t" and text[i:].lstrip(" \t").startswith("#")):
            j = i
            while j < n:  # the directive, with its continuation lines
                k = text.find("\n", j)
                k = n if k < 0 else k
                if k > 0 and text[k - 1] == "\\":
                    j = k + 1
                    continue
                break
            out.append(re.sub(r"[^\n]", " ", text[i:k]))
            i = k
            continue
        if text.startswith("//", i):
            k = text.find("\n", i)
            k = n if k < 0 else k
            out.append(" " * (k - i))
            i = k
            continue
        if text.startswith("/*", i):
            k = text.find("*/", i + 2)
            k = n if k < 0 else k + 2
            out.append(re.sub(r"[^\n]", " ", text[i:k]))
            i = k
            continue
        m = re.match(r'R"([^(\s]*)\(', text[i:i + 20])
        if m:
            end = text.find(")" + m.group(1) + '"', i)
            k = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:k]))
            i = k
            continue
        if c in "\"'" and not (c == "'" and i > 0 and text[i - 1].isalnum()):  # 1'000 digit separators
            k = i + 1
            while k < n and text[k] != c and text[k] != "\n":
                k += 2 if text[k] == "\\" else 1
            k = min(k + 1, n)
            out.append(c + " " * (k - i - 2) + c if k - i >= 2 else text[i:k])
            i = k
            continue
        out.append(c)
        line_start = c == "\n" or (line_start and c in " \t")
        i += 1
    return "".join(out)


def functions(text):
    """(name, first line of the signature, line of '{', line of '}') of each function."""
    code = blank(text)
    line_of = [0] * (len(code) + 1)
    ln = 1
    for i, c in enumerate(code):
        line_of[i] = ln
        if c == "\n":
            ln += 1
    found = []
    stack = []  # (kind, start offset, header start offset, name)
    head_start = 0  # where the text before the next brace at this level begins
    for i, c in enumerate(code):
        if c == ";":
            if not stack or stack[-1][0] in ("scope",):
                head_start = i + 1
        elif c == "{":
            inside_function = any(k == "function" for k, *_ in stack)
            if inside_function:
                stack.append(("other", i, 0, ""))
                continue
            head = code[head_start:i]
            flat = " ".join(head.split())
            if SCOPE.search(flat.split("(")[0]) or flat.startswith("extern"):
                stack.append(("scope", i, 0, ""))
            elif ")" in flat and not re.search(r"=\s*$", flat) and not flat.endswith(","):
                m = re.search(r"([~\w:<>]+|operator\s*\S+)\s*\(", flat)
                name = m.group(1) if m else "?"
                if name in KEYWORDS:  # a statement: we lost track of a function around it
                    stack.append(("other", i, 0, ""))
                    head_start = i + 1
                    continue
                first = head_start + (len(head) - len(head.lstrip()))
                stack.append(("function", i, first, name))
            else:
                stack.append(("other", i, 0, ""))
            head_start = i + 1
        elif c == "}":
            if not stack:
                continue
            kind, start, first, name = stack.pop()
            if kind == "function":
                found.append((name, line_of[first], line_of[start], line_of[i]))
            if not any(k == "function" for k, *_ in stack):
                head_start = i + 1
    return found


def has_reason(lines, first_line):
    """The comment block right above line `first_line` (1-based) holds the marker."""
    j = first_line - 2
    while j >= 0 and (lines[j].strip().startswith("template") or lines[j].strip().startswith("[[")):
        j -= 1
    while j >= 0 and lines[j].strip().startswith("//"):
        if MARKER in lines[j]:
            return True
        j -= 1
    return False


def load_allowed(path):
    allowed = set()
    if os.path.exists(path):
        for line in open(path):
            line = line.split("#", 1)[0].strip()
            if line:
                parts = line.split()
                if len(parts) != 2:
                    sys.exit(f"{path}: expected 'path function', got '{line}'")
                allowed.add((parts[0], parts[1]))
    return allowed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--limit", type=int, default=80)
    ap.add_argument("--allow", help="allowed offenders (default: tools/function_length_allow.txt)")
    ap.add_argument("--list", action="store_true", help="print every long function as an allow-list line")
    a = ap.parse_args()
    root = os.path.abspath(a.root)
    allowed = load_allowed(a.allow or os.path.join(root, "tools", "function_length_allow.txt"))
    long_ones, used, stale_reasons = [], set(), []
    for dirpath, _, files in sorted(os.walk(os.path.join(root, "src"))):
        for f in sorted(files):
            if not f.endswith(SUFFIXES):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, root)
            text = open(path, errors="replace").read()
            lines = text.split("\n")
            for name, first, open_line, close_line in functions(text):
                length = close_line - open_line + 1
                if length <= a.limit:
                    if has_reason(lines, first):
                        stale_reasons.append((rel, first, name, length))
                    continue
                if has_reason(lines, first):
                    continue
                if (rel, name) in allowed:
                    used.add((rel, name))
                    if not a.list:
                        continue
                long_ones.append((rel, first, name, length))
    if a.list:
        for rel, _, name, length in long_ones:
            print(f"{rel} {name}  # {length} lines")
        return 0
    stale = sorted(allowed - used)
    for rel, first, name, length in long_ones:
        print(f"{rel}:{first}: {name} is {length} lines (limit {a.limit}): shorten it, or say why above it "
              f"with '{MARKER}'")
    for rel, name in stale:
        print(f"tools/function_length_allow.txt: '{rel} {name}' is no longer over the limit: remove it")
    for rel, first, name, length in stale_reasons:
        print(f"{rel}:{first}: {name} is {length} lines, within the limit ({a.limit}): remove its stale "
              f"'{MARKER}' comment")
    if long_ones or stale or stale_reasons:
        print(f"function length: {len(long_ones)} over {a.limit} lines, {len(stale)} stale allow-list entries, "
              f"{len(stale_reasons)} stale '{MARKER}' comments")
        return 1
    print(f"function length: ok ({len(used)} allowed offender(s) left in tools/function_length_allow.txt)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
