"""Every relative link in the docs points at a file that exists and, for a Markdown target with an
anchor, at a heading that file has (GitHub's anchor rule: lower case, punctuation dropped, spaces to
hyphens). The performance log is split into files by topic and sections move between them; this
catches a link left pointing at the old place."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchor_of(heading):
    text = heading.lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path):
    return {anchor_of(line) for line in path.read_text().split("\n") if line.startswith("#")}


def markdown_files():
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def broken_links():
    cache, broken = {}, []
    for md in markdown_files():
        for target in LINK.findall(md.read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            dest = (md.parent / path).resolve() if path else md.resolve()
            if not dest.exists():
                broken.append(f"{md.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md":
                if dest not in cache:
                    cache[dest] = anchors(dest)
                if anchor not in cache[dest]:
                    broken.append(f"{md.relative_to(ROOT)}: {target} (no such heading)")
    return broken


def test_anchor_rule_matches_github():
    assert anchor_of("## Session 4: int8 / int4 decode GEMV v3 (quant/qgemv_v3.cu)") == \
        "session-4-int8--int4-decode-gemv-v3-quantqgemv_v3cu"


def test_every_relative_link_resolves():
    assert markdown_files()[1:], "no docs found"
    assert broken_links() == []
