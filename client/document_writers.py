"""The writers of `sme2-client report`'s document: its blocks (client/document_blocks.py) as
Markdown or as a standalone HTML page, the charts' SVG inline (or, in Markdown, as images of files
written beside the document)."""

from __future__ import annotations

import html
import re
from typing import Any

_ENTITY = re.compile(r"&(?=#?[0-9A-Za-z]+;)")


def _md_cell(s: Any) -> str:
    """Markdown text: what would start HTML (``<``, an ``&entity;``) escaped, table pipes escaped; ``->``
    and ``a > b`` stay as written (only a leading ``>``, a blockquote, is backslash-escaped)."""
    text = _ENTITY.sub("&amp;", str(s)).replace("<", "&lt;").replace("|", "\\|").replace("\n", " ")
    return "\\" + text if text.startswith(">") else text


def to_markdown(blocks: list[tuple], *, svg_files: dict[str, str] | None = None) -> str:
    """Markdown; charts inline as raw <svg> blocks, or as images of the files in `svg_files`
    ({chart name: relative path})."""
    out: list[str] = []
    for b in blocks:
        kind = b[0]
        if kind == "h":
            out += ["#" * b[1] + " " + _md_cell(b[2]), ""]
        elif kind == "p":
            out += [_md_cell(b[1]), ""]
        elif kind == "list":
            out += [f"- {_md_cell(x)}" for x in b[1]] + [""]
        elif kind == "table":
            out.append("| " + " | ".join(_md_cell(x) for x in b[1]) + " |")
            out.append("|" + "---|" * len(b[1]))
            out += ["| " + " | ".join(_md_cell(x) for x in row) + " |" for row in b[2]]
            out.append("")
        elif kind == "chart":
            _, name, title, svg, why = b
            if svg is None:
                if why:
                    out += [f"*({_md_cell(title)}: not available, {_md_cell(why)})*", ""]
                continue
            if svg_files and name in svg_files:
                out += [f"![{_md_cell(title)}]({svg_files[name]})", ""]
            else:  # an HTML block: no blank line may occur inside it
                out += ["\n".join(line for line in svg.splitlines() if line.strip()), ""]
    return "\n".join(out).rstrip() + "\n"


HTML_STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d2330; max-width: 1100px; margin: 24px auto; padding: 0 20px; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #e2e5ea; padding-bottom: 4px; } h3 { font-size: 14px; }
table { border-collapse: collapse; margin: 8px 0 12px; font-size: 13px; }
th, td { border: 1px solid #e2e5ea; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #fafbfc; color: #6a7282; }
figure { margin: 8px 0; } figure svg { max-width: 100%; height: auto; }
.muted { color: #6a7282; }
"""


def to_html(blocks: list[tuple]) -> str:
    title = next((b[2] for b in blocks if b[0] == "h"), "Experiment report")
    esc = html.escape
    out = ["<!doctype html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           f"<title>{esc(str(title))}</title>", f"<style>{HTML_STYLE}</style>", "</head>", "<body>"]
    for b in blocks:
        kind = b[0]
        if kind == "h":
            out.append(f"<h{b[1]}>{esc(str(b[2]))}</h{b[1]}>")
        elif kind == "p":
            out.append(f"<p>{esc(str(b[1]))}</p>")
        elif kind == "list":
            out.append("<ul>" + "".join(f"<li>{esc(str(x))}</li>" for x in b[1]) + "</ul>")
        elif kind == "table":
            out.append("<table><thead><tr>" + "".join(f"<th>{esc(str(x))}</th>" for x in b[1]) + "</tr></thead><tbody>"
                       + "".join("<tr>" + "".join(f"<td>{esc(str(x))}</td>" for x in row) + "</tr>" for row in b[2])
                       + "</tbody></table>")
        elif kind == "chart":
            _, name, title_, svg, why = b
            if svg is not None:
                out.append(f'<figure data-chart="{esc(name)}">{svg}</figure>')
            elif why:
                out.append(f'<p class="muted">({esc(title_)}: not available, {esc(why)})</p>')
    out += ["</body>", "</html>"]
    return "\n".join(out) + "\n"
