#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Turns the C++ code blocks of strata's docs into translation units, so that a block that no
longer compiles fails the build (tests/docs/CMakeLists.txt).

Every ```cpp block of the given Markdown files must be preceded by a directive, an HTML comment
on the lines right before its fence (invisible on GitHub):

    <!-- snippet host [run]          a block of host-only code (g++); `run`: also a ctest
    ...declarations it assumes...    (optional) what the block uses but does not show
    -->
    <!-- snippet cuda [run] ... -->  the same for code that needs nvcc and strata::cuda
    <!-- snippet skip: reason -->    not compiled (say why)

A block's #include lines go to file scope; the rest, after the declarations, becomes the body of a
function. A `run` block gets a main() that calls it (a cuda one exits 77 without a device, which
ctest reports as skipped).

usage: snippets.py OUTDIR ROOT FILE.md...   writes OUTDIR/<stem>_<n>.{cpp,cu} and OUTDIR/snippets.cmake
"""
import os
import re
import sys

DIRECTIVE = re.compile(r"<!--\s*snippet\s+(host|cuda|skip)\b(.*?)-->", re.S)


def blocks(text):
    """(directive or None, code, line) for every ```cpp block."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```cpp":
            start = i
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            code = "\n".join(lines[i + 1:j])
            # the directive: an HTML comment ending on the line right before the fence
            before = "\n".join(lines[max(0, start - 40):start])
            m = None
            if lines[start - 1].strip().endswith("-->") if start > 0 else False:
                k = before.rfind("<!--")
                m = DIRECTIVE.fullmatch(before[k:].strip()) if k >= 0 else None
            yield m, code, start + 1
            i = j + 1
        else:
            i += 1


def main():
    out, root, docs = sys.argv[1], sys.argv[2], sys.argv[3:]
    os.makedirs(out, exist_ok=True)
    cmake = []
    errors = []
    for doc in docs:
        text = open(os.path.join(root, doc), encoding="utf-8").read()
        stem = re.sub(r"[^A-Za-z0-9]", "_", os.path.splitext(doc)[0])
        for n, (m, code, line) in enumerate(blocks(text), 1):
            where = f"{doc}:{line}"
            if m is None:
                errors.append(f"{where}: a ```cpp block without a <!-- snippet host|cuda|skip --> directive")
                continue
            kind, rest = m.group(1), m.group(2)
            if kind == "skip":
                if not rest.strip(":").strip():
                    errors.append(f"{where}: 'snippet skip' needs a reason")
                continue
            first, _, preamble = rest.partition("\n")
            flags = first.split()
            run = "run" in flags
            includes, body = [], []
            for src in (preamble, code):
                for l in src.split("\n"):
                    (includes if l.lstrip().startswith("#include") else body).append(l)
            name = f"{stem}_{n}"
            ext = "cu" if kind == "cuda" else "cpp"
            unit = [f"// Generated from {where} by tests/docs/snippets.py: edit the doc, not this file."]
            unit += includes
            unit += ["", "namespace {", "[[maybe_unused]] void snippet()", "{"]
            unit += body
            unit += ["}", "}  // namespace", ""]
            if run:
                if kind == "cuda":
                    unit += ["int main()", "{", "  int n = 0;",
                             "  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) { return 77; }",
                             "  snippet();", "  return 0;", "}"]
                else:
                    unit += ["int main()", "{", "  snippet();", "  return 0;", "}"]
            path = os.path.join(out, f"{name}.{ext}")
            content = "\n".join(unit) + "\n"
            if not os.path.exists(path) or open(path).read() != content:
                open(path, "w").write(content)
            cmake.append(f"strata_doc_snippet({name} {kind} {'run' if run else 'compile'} \"{path}\" \"{where}\")")
    if errors:
        for e in errors:
            print(f"snippets.py: {e}", file=sys.stderr)
        sys.exit(1)
    content = "\n".join(cmake) + "\n"
    p = os.path.join(out, "snippets.cmake")
    if not os.path.exists(p) or open(p).read() != content:
        open(p, "w").write(content)


if __name__ == "__main__":
    main()
