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


def headings(text):
    """The heading lines, leaving out `#` lines inside fenced code (shell comments, not headings)."""
    in_fence = False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
        elif not in_fence and line.startswith("#"):
            yield line


def anchors(path):
    """GitHub's anchors for a file: a repeated heading's later copies get -1, -2, ..."""
    seen, found = {}, set()
    for heading in headings(path.read_text()):
        base = anchor_of(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


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


def test_fenced_comments_are_not_headings_and_repeats_are_numbered(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("# Top\n```sh\n# not a heading\n```\n## Runs\n## Runs\n")
    assert anchors(doc) == {"top", "runs", "runs-1"}


def test_every_relative_link_resolves():
    assert markdown_files()[1:], "no docs found"
    assert broken_links() == []
