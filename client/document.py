"""sme2-client report ID --markdown|--html [-o FILE] [--svg-files] [--depth N]: one experiment as a
document to paste into a design review, with the charts embedded as SVG. `report ID --by module
[--depth N]` prints each arm's time by module in the terminal instead (from the model's ETRecord;
an emulated arm: which kernel path each module ran, no time).

The charts are the server's (GET /experiments/{id}/charts/{name}.svg, drawn by
analysis/charts.py): the document shows exactly what the dashboard shows. Tables come from the
experiment's JSON: the verdicts (ratio, 95% interval, verdict, sessions and iterations, the
sentence and what would decide an open one), latency per run, the categories per arm, each
comparison's per-category verdicts and its narrative; for an LLM run, its prefill and decode figures,
each phase's categories and the comparison's verdict per phase.

Where the SVG goes:
- ``--html``: a standalone page, the SVGs inline (any browser, any mail client that shows HTML);
- ``--markdown``: the SVGs inline as raw HTML blocks. They render where Markdown allows raw HTML
  (VS Code's preview, Obsidian, pandoc, GitLab) but NOT on GitHub, whose sanitizer removes both
  ``<svg>`` and ``data:`` image URIs from Markdown;
- ``--markdown -o report.md --svg-files``: each chart written beside the document
  (``report-distribution.svg``, ...) and referenced as an image; GitHub renders SVG files from the
  repository that a Markdown file references relatively, so this is the form to commit or attach.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sme2farm.client import document_blocks
from sme2farm.client.common import connect, experiment_id
from sme2farm.client.document_fetch import fetch
from sme2farm.client.document_writers import to_html, to_markdown
from sme2farm.client.scaling_cmd import experiment_ids

# The docstring above is the command's --help. The command's parts, one module each:
# document_fetch.py (the typed report, the charts, the scaling view), document_blocks.py (what the
# document says, as neutral blocks) and document_writers.py (those blocks as Markdown or HTML).


def cmd_report(args) -> int:
    depth, by = getattr(args, "depth", 2), getattr(args, "by", None)
    if depth < 1:
        print(f"sme2-client: --depth {depth}: the depth of the module tree starts at 1 (the top-level modules)",
              file=sys.stderr)
        return 2
    if by == "module" and not (args.markdown or args.html):
        if args.output or args.svg_files:
            print("sme2-client: --by module alone prints to the terminal: -o and --svg-files need --markdown or --html",
                  file=sys.stderr)
            return 2
        client = connect(args)
        sys.stdout.write(document_blocks.modules_text(client.experiment(args.id, runs="full"), depth))
        return 0
    if not (args.markdown or args.html):
        print("sme2-client: report needs --markdown or --html (or --by module, the terminal view)", file=sys.stderr)
        return 2
    if args.svg_files and not (args.markdown and args.output):
        print("sme2-client: --svg-files writes the charts beside the document: it needs --markdown and -o FILE",
              file=sys.stderr)
        return 2
    if args.output and not Path(args.output).resolve().parent.is_dir():
        print(f"sme2-client: cannot write {args.output}: the directory {Path(args.output).parent}/ does not exist "
              f"(create it first, e.g. mkdir -p {Path(args.output).parent})", file=sys.stderr)
        return 2
    client = connect(args)
    got = fetch(client, args.id, getattr(args, "joined", None))
    svgs = got.svgs
    blocks = document_blocks.blocks(got.report, svgs, got.missing, str(client.http.base_url), got.scaling,
                                    depth=depth)
    out = Path(args.output) if args.output else None
    if args.html:
        text = to_html(blocks)
    elif args.svg_files:
        files = {}
        for name, svg in svgs.items():
            if svg is not None:
                path = out.with_name(f"{out.stem}-{name}.svg")
                path.write_text(svg, encoding="utf-8")
                files[name] = path.name
        text = to_markdown(blocks, svg_files=files)
    else:
        text = to_markdown(blocks)
    if out is None:
        sys.stdout.write(text)
    else:
        out.write_text(text, encoding="utf-8")
        print(f"wrote {out}" + (f" and {len([s for s in svgs.values() if s])} SVG file(s) beside it" if args.svg_files else ""),
              file=sys.stderr)
    return 0


def add_parser(sub) -> None:
    rp = sub.add_parser("report", help="one experiment as a Markdown or HTML document with its charts (SVG)",
                        description=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    rp.add_argument("id", type=experiment_id, help="experiment id (12 or E12)")
    fmt = rp.add_mutually_exclusive_group()
    fmt.add_argument("--markdown", action="store_true", help="Markdown, charts as inline <svg> (or files: --svg-files)")
    fmt.add_argument("--html", action="store_true", help="a standalone HTML page, charts inline")
    rp.add_argument("--by", choices=["module"], default=None,
                    help="module: each arm's time by module in the terminal (no --markdown/--html), from the ETRecord")
    rp.add_argument("--depth", type=int, default=2, metavar="N",
                    help="how deep the time by module goes (1: the top-level modules; default 2)")
    rp.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    rp.add_argument("--svg-files", action="store_true",
                    help="with --markdown -o FILE: write each chart as FILE-<chart>.svg beside it and link it "
                         "(the form GitHub renders: it strips inline <svg> and data: images from Markdown)")
    rp.add_argument("--with", dest="joined", type=experiment_ids, default=None, metavar="ID,ID",
                    help="other experiments of the same model to join to the Thread scaling section and its chart "
                         "(as sme2-client scaling --with)")
    rp.set_defaults(fn=cmd_report)
