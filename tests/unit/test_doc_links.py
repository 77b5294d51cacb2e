"""Every relative link in the repository's markdown resolves: the file or directory it names
exists, and its `#anchor`, in a markdown file, is one of that file's headings (GitHub's
slugs). Links inside code (fenced blocks, inline spans) are text, not links; absolute URLs are
not fetched."""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKIPPED = {".git", ".venv", "build", "dist", "node_modules", "__pycache__"}

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
INLINE_CODE = re.compile(r"(`+)(?!`).+?(?<!`)\1(?!`)", re.S)
COMMENT = re.compile(r"<!--.*?-->", re.S)
# [text](target "title") and ![alt](target); the text may hold one level of brackets.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$", re.M)
HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def markdown_files() -> list[Path]:
    return sorted(
        path
        for path in ROOT.rglob("*.md")
        if not any(
            part in SKIPPED or part.startswith(".") or part.endswith(".egg-info")
            for part in path.relative_to(ROOT).parts[:-1]
        )
    )


def prose(text: str) -> str:
    """The text with code and comments blanked (so no link is read from an example)."""
    return INLINE_CODE.sub("", COMMENT.sub("", FENCE.sub("", text)))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation other than `-`
    and `_` removed, spaces as `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's slug, a repeated one also with `-1`, `-2`, ... as GitHub adds."""
    found: set[str] = set()
    counts: dict[str, int] = {}
    for heading in HEADING.findall(FENCE.sub("", path.read_text())):
        base = slug(heading)
        count = counts.get(base, 0)
        counts[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[str]:
    text = prose(path.read_text())
    return INLINE_LINK.findall(text) + REFERENCE.findall(text)


def broken(path: Path, root: Path = ROOT) -> list[str]:
    problems = []
    for target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:, ...
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / urllib.parse.unquote(file_part)).resolve() if file_part else path
        if not resolved.exists():
            problems.append(f"{target}: no such file or directory")
            continue
        if root not in resolved.parents and resolved != root:
            problems.append(f"{target}: outside the repository")
            continue
        if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{target}: no heading with the anchor #{anchor}")
    return problems


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path: Path) -> None:
    """Rule: every relative link of a markdown file names a file or directory of the
    repository and, with an `#anchor` into markdown, one of its headings."""
    assert broken(path) == []


def test_the_checker_sees_a_broken_link_and_an_unknown_anchor(tmp_path: Path) -> None:
    """Rule: the checker itself reports a missing file, a missing anchor, and reads neither
    a link in code nor an absolute URL (else the test above could pass with links unread)."""
    doc = tmp_path / "doc.md"
    doc.write_text(
        "# A `Title`, with: marks\n\n## Again\n\n## Again\n\n"
        "[ok](#a-title-with-marks) [dup](#again-1) [self](doc.md#again) ![img](doc.md)\n"
        "[gone](missing.md) [bad](#nowhere) [web](https://example.com/x)\n"
        "`[code](missing-in-code.md)`\n\n```\n[fenced](missing-in-fence.md)\n```\n"
        "[ref]: other.md\n"
    )
    assert sorted(broken(doc, tmp_path)) == [
        "#nowhere: no heading with the anchor #nowhere",
        "missing.md: no such file or directory",
        "other.md: no such file or directory",
    ]
    assert markdown_files()  # the repository's own files are found
