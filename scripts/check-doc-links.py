#!/usr/bin/env python3
"""Fails on a broken relative link or a missing #anchor in the project's Markdown.

Checks README.md, ARCHITECTURE.md, BENCHMARKS.md, CONTRIBUTING.md and docs/src/**/*.md: every
link and image whose target is a relative path (not http:, https:, mailto: and the like) must
name a file or folder that exists, and an `#anchor` must be a heading of the target Markdown
file (or of the file itself, for `#anchor` alone), slugged as GitHub and mdBook slug them:
lowercase, spaces to `-`, punctuation dropped, `-1`, `-2`... after repeated headings. Code
blocks and code spans are not read. Prints each problem as FILE:LINE and exits 1 if any.

usage: python3 scripts/check-doc-links.py [REPO]   (default: the checkout this script is in)
"""

import pathlib
import re
import sys

ROOT_FILES = ("README.md", "ARCHITECTURE.md", "BENCHMARKS.md", "CONTRIBUTING.md")

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
EXPLICIT_ID = re.compile(r"\{#([^}\s]+)[^}]*\}\s*$")
HTML_ID = re.compile(r"""<a\s+(?:name|id)=["']([^"']+)["']""")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target) and ![alt](target); the target may be wrapped in <...> and followed by a title.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^()\s]*(?:\([^()\s]*\)[^()\s]*)*)(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(\S+)")
HTML_LINK = re.compile(r"""<(?:a|img)\s[^>]*?(?:href|src)=["']([^"']+)["']""")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def unfenced_lines(text):
    """(line number, line) of the lines outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
            continue
        if m:
            fence = m.group(1)
            continue
        yield number, line


def prose_lines(text):
    """(line number, line) of the lines outside fenced code blocks, code spans blanked."""
    for number, line in unfenced_lines(text):
        yield number, CODE_SPAN.sub(lambda c: " " * len(c.group(0)), line)


def slug(heading):
    """The anchor GitHub and mdBook give a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").replace("*", "")
    out = []
    for ch in text.strip().lower():
        if ch.isalnum() or ch in "-_":
            out.append(ch)
        elif ch.isspace():
            out.append("-")
    return "".join(out)


def anchors(path, cache={}):
    if path not in cache:
        found, seen = set(), {}
        text = path.read_text(encoding="utf-8")
        for _, line in unfenced_lines(text):
            found.update(HTML_ID.findall(line))
            h = HEADING.match(line)
            if not h:
                continue
            title = h.group(2)
            explicit = EXPLICIT_ID.search(title)
            if explicit:
                found.add(explicit.group(1))
                title = title[: explicit.start()]
            base = slug(title)
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        cache[path] = found
    return cache[path]


def targets(line):
    for m in INLINE_LINK.finditer(line):
        yield m.group(1).strip("<>")
    m = REF_DEF.match(line)
    if m:
        yield m.group(1).strip("<>")
    yield from HTML_LINK.findall(line)


def check(repo):
    files = [repo / name for name in ROOT_FILES if (repo / name).exists()]
    files += sorted((repo / "docs" / "src").rglob("*.md"))
    problems = []
    links = 0
    for path in files:
        rel = path.relative_to(repo)
        for number, line in prose_lines(path.read_text(encoding="utf-8")):
            for target in targets(line):
                if not target or SCHEME.match(target) or target.startswith("//"):
                    continue
                links += 1
                file_part, _, anchor = target.partition("#")
                dest = (path.parent / file_part).resolve() if file_part else path
                where = f"{rel}:{number}"
                if file_part and not dest.exists():
                    problems.append(f"{where}: {target}: no such file")
                    continue
                if anchor and dest.suffix == ".md" and dest.is_file():
                    if anchor not in anchors(dest):
                        problems.append(f"{where}: {target}: no heading #{anchor} in {dest.name}")
    return files, links, problems


def main():
    repo = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent / "..")
    repo = repo.resolve()
    missing = [name for name in ROOT_FILES if not (repo / name).exists()]
    files, links, problems = check(repo)
    for problem in problems:
        print(problem)
    note = f" (not there: {', '.join(missing)})" if missing else ""
    print(f"checked {links} relative links in {len(files)} files{note}: {len(problems)} broken")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
