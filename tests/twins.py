"""What a page's Dutch twin must keep from its English page (course/NN-slug.md -> NN-slug.nl.md).

`structure(text)` reads a course page's markdown into the parts a translation may not change:
macro calls (figure captions excepted), snippet include lines, fenced code blocks, headings (level
and id) and link targets. `differences(en, nl)` says, part by part, what a twin changed.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from markdown.extensions.toc import slugify, unique

from minimega.classroom.sitebuild import FIGURE, MACRO

FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
ATTR_ID = re.compile(r"\s*\{[^}]*#([\w-]+)[^}]*\}\s*$")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
INLINE_CODE = re.compile(r"(`+)(?:.+?)\1")
SNIPPET = re.compile(r"^\s*;?--8<--")


@dataclass
class Structure:
    macros: list[str] = field(default_factory=list)          # calls, a figure reduced to its id
    snippets: list[str] = field(default_factory=list)        # include lines, stripped
    code: list[str] = field(default_factory=list)            # each fenced block, fences included
    headings: list[tuple[int, str]] = field(default_factory=list)   # (level, id), in order
    links: Counter = field(default_factory=Counter)          # targets of [..](..) and [..]: ..


def _front_matter(lines: list[str]) -> int:
    if lines and lines[0].strip() == "---":
        for i, line in enumerate(lines[1:], 1):
            if line.strip() == "---":
                return i + 1
    return 0


def _macro(call: str) -> str:
    if m := FIGURE.match(call):
        return f'figure("{m.group(1)}", …)'
    return call.strip()


def structure(text: str) -> Structure:
    s = Structure()
    lines = text.splitlines()
    ids: set[str] = set()
    i = _front_matter(lines)
    prose: list[str] = []
    while i < len(lines):
        line = lines[i]
        if m := FENCE.match(line):
            indent, fence = m.groups()
            block = [line]
            i += 1
            while i < len(lines) and not re.match(rf"^{re.escape(indent)}{fence[0]}{{{len(fence)},}}\s*$", lines[i]):
                block.append(lines[i])
                i += 1
            block.append(lines[i] if i < len(lines) else "")
            s.code.append("\n".join(block))
            s.snippets += [b.strip() for b in block if SNIPPET.match(b)]
            i += 1
            continue
        if SNIPPET.match(line):
            s.snippets.append(line.strip())
        elif m := HEADING.match(line):
            title = m.group(2)
            if explicit := ATTR_ID.search(title):
                hid = explicit.group(1)
            else:
                plain = re.sub(r"[*_`]|\[([^\]]*)\]\([^)]*\)", r"\1", title)
                hid = unique(slugify(plain, "-"), ids)
            ids.add(hid)
            s.headings.append((len(m.group(1)), hid))
        if m := REF_DEF.match(line):
            s.links[m.group(1)] += 1
        else:
            prose.append(line)
        i += 1
    body = "\n".join(prose)
    s.macros = [_macro(m.group(1)) for m in MACRO.finditer(body)]
    without_code = INLINE_CODE.sub("", MACRO.sub("", body))
    s.links.update(m.group(1) for m in LINK.finditer(without_code))
    return s


def differences(en: Structure, nl: Structure) -> list[str]:
    """What the twin changed, one line per part; empty when the structure is the same."""
    out = []
    for name, what in (("macros", "macro calls"), ("snippets", "snippet include lines"), ("code", "code blocks")):
        a, b = getattr(en, name), getattr(nl, name)
        if a != b:
            missing = [x for x in a if x not in b]
            extra = [x for x in b if x not in a]
            detail = (f"missing {missing[:3]!r}; not in English {extra[:3]!r}" if missing or extra
                      else "same ones, other order")
            out.append(f"{what} differ ({len(a)} in English, {len(b)} in Dutch): {detail}")
    levels_en, levels_nl = Counter(lv for lv, _ in en.headings), Counter(lv for lv, _ in nl.headings)
    if levels_en != levels_nl:
        out.append("headings per level differ: English " + ", ".join(f"h{k}: {levels_en[k]}" for k in sorted(levels_en))
                   + "; Dutch " + ", ".join(f"h{k}: {levels_nl[k]}" for k in sorted(levels_nl)))
    if [h for _, h in en.headings] != [h for _, h in nl.headings]:
        pairs = [(a, b) for a, b in zip(en.headings, nl.headings) if a != b]
        first = pairs[0] if pairs else (en.headings[len(nl.headings):] or nl.headings[len(en.headings):])
        out.append("heading ids differ (give each Dutch heading the English id as { #id }): "
                   f"first difference {first!r}")
    if en.links != nl.links:
        out.append(f"link targets differ: missing {sorted((en.links - nl.links).elements())!r}; "
                   f"not in English {sorted((nl.links - en.links).elements())!r}")
    return out
