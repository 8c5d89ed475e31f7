#!/usr/bin/python3
"""Fails when a function in the given C++ sources is longer than the limit (lines from its
signature's last line to its closing brace), naming each one: long functions in the code
generators hide what they emit.

Usage: function_lengths.py LIMIT FILE_OR_DIR...

Blocks are found by brace matching over the source with comments, string and character literals
blanked; a block is a function body when the text before its `{` ends with `)` or with a
qualifier after it (`const`, `override`, `noexcept`, a trailing return type) and is not a control
statement; bodies of lambdas and nested blocks count toward the function that holds them.
"""
import re
import sys
from pathlib import Path

CONTROL = re.compile(r"\b(if|for|while|switch|catch|do|else)\s*(\(.*\))?\s*$", re.S)
FUNCTION_END = re.compile(r"\)\s*(const|override|final|noexcept|mutable|->\s*[\w:<>,\s*&]+|\s)*$",
                          re.S)


def blank(text):
    """`text` with comments and literals replaced by spaces (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
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
        elif text.startswith('R"', i):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            end = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(" " * (j + 1 - i))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def long_functions(path, limit):
    text = blank(path.read_text())
    found = []
    stack = []  # (is_function_start, line) per open brace
    outermost_function = None
    last_stop = 0  # where the text before the current brace starts (after ; { or })
    for i, c in enumerate(text):
        if c == "{":
            header = text[last_stop:i].strip()
            line = text.count("\n", 0, i) + 1
            is_function = (outermost_function is None and bool(FUNCTION_END.search(header)) and
                           not CONTROL.search(header) and "=" not in header.split("(")[0])
            if is_function:
                outermost_function = (len(stack), line, header.splitlines()[-1].strip())
            stack.append(line)
            last_stop = i + 1
        elif c == "}":
            if stack:
                stack.pop()
            if outermost_function and len(stack) == outermost_function[0]:
                start, name = outermost_function[1], outermost_function[2]
                end = text.count("\n", 0, i) + 1
                if end - start + 1 > limit:
                    found.append((start, end - start + 1, name))
                outermost_function = None
            last_stop = i + 1
        elif c == ";":
            last_stop = i + 1
    return found


def main():
    limit = int(sys.argv[1])
    files = []
    for arg in sys.argv[2:]:
        p = Path(arg)
        files += sorted(p.rglob("*.cpp")) + sorted(p.rglob("*.h")) if p.is_dir() else [p]
    bad = 0
    for f in files:
        for start, length, name in long_functions(f, limit):
            print(f"{f}:{start}: a function of {length} lines (limit {limit}): {name}")
            bad += 1
    print(f"{len(files)} files checked, {bad} functions over {limit} lines")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
