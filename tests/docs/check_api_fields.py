#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""docs/api.md names every public field of strata's public structs.

For each `struct NAME { ... };` of a public header (include/strata, not detail/) that has data
members, docs/api.md must contain `NAME{...}` (balanced braces) in which every member's name
appears as a word. So a field added, renamed or removed in a header without the docs fails this
test, naming the struct and the fields.

usage: check_api_fields.py ROOT
"""
import os
import re
import sys

# Structs whose members are not part of the documented API, with the reason.
IGNORED = {
    "request_hash": "a hash functor, no fields",
}

DECL = re.compile(r"^\s*(?:static\s+constexpr|constexpr|static|mutable|inline)?\s*"
                  r"[A-Za-z_][\w:<>,\s\*&\[\]]*?[\s\*&>]([A-Za-z_]\w*)\s*(?:\[[^\]]*\]\s*)*(?:=[^;]*|\{[^;]*\})?;")


def structs(text):
    """(name, [fields]) of every struct defined at namespace scope in `text` (a line that starts
    with `struct`: the house format does not indent namespaces; nested structs are machinery)."""
    out = []
    for m in re.finditer(r"(?m)^struct\s+([A-Za-z_]\w*)\s*(?:final\s*)?(?::[^{;]*)?\{", text):
        name = m.group(1)
        i = m.end()
        depth = 1
        body_start = i
        while i < len(text) and depth > 0:
            c = text[i]
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
            i += 1
        body = text[body_start:i - 1]
        fields = []
        level = 0
        line_buf = ""
        private = False
        for raw in body.split("\n"):
            line = re.sub(r"//.*", "", raw)
            if level == 0:
                s = line.strip()
                if s.startswith("private:") or s.startswith("protected:"):
                    private = True
                elif s.startswith("public:"):
                    private = False
                if not private and s and "(" not in s.split("=")[0] and not s.startswith(("using", "friend",
                                                                                          "template", "struct",
                                                                                          "enum", "static_assert",
                                                                                          "typedef", "#")):
                    d = DECL.match(line)
                    if d and not re.match(r"^\s*static\b", line):
                        fields.append(d.group(1))
            level += line.count("{") - line.count("}")
        out.append((name, fields))
    return out


def braced(doc, name):
    """Every `name{...}` of the doc, as the text between the braces."""
    found = []
    for m in re.finditer(r"(?<![\w:])" + re.escape(name) + r"(?:<[^<>{}]*>)?\{", doc):
        i, depth = m.end(), 1
        while i < len(doc) and depth > 0:
            depth += {"{": 1, "}": -1}.get(doc[i], 0)
            i += 1
        found.append(doc[m.end():i - 1])
    return found


def main():
    root = sys.argv[1]
    doc = open(os.path.join(root, "docs", "api.md"), encoding="utf-8").read()
    problems = []
    checked = 0
    inc = os.path.join(root, "include", "strata")
    for dirpath, _, files in os.walk(inc):
        if "/detail/" in dirpath.replace(os.sep, "/") + "/":
            continue
        for f in sorted(files):
            if not f.endswith((".hpp", ".cuh")):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, inc)
            text = open(path, encoding="utf-8").read()
            text = re.sub(r"namespace detail \{.*?\}  // namespace detail", "", text, flags=re.S)
            for name, fields in structs(text):
                if not fields or name in IGNORED:
                    continue
                checked += 1
                lists = braced(doc, name)
                if not lists:
                    problems.append(f"{rel}: struct {name} has fields {', '.join(fields)}; docs/api.md has no `{name}{{...}}`")
                    continue
                missing = [fl for fl in fields if not any(re.search(r"\b" + re.escape(fl) + r"\b", l) for l in lists)]
                if missing:
                    problems.append(f"{rel}: docs/api.md's `{name}{{...}}` lacks {', '.join(missing)}")
    for p in problems:
        print("check_api_fields: " + p)
    if problems:
        print(f"check_api_fields: {len(problems)} of {checked} structs are not documented field by field")
        return 1
    print(f"check_api_fields: {checked} structs, every public field named in docs/api.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
