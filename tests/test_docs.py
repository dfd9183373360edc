"""The documentation holds together: docs/configuration.md is what the generator makes from the
settings classes, no Markdown line is over 120 characters, and every relative link (and its
#anchor) reaches something that exists."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from sme2farm.farm import configdoc

ROOT = Path(__file__).resolve().parent.parent
MAX_LINE = 120
SKIP_DIRS = {"node_modules", "__pycache__", "test-artifacts"}
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def markdown_files() -> list[Path]:
    """Every Markdown page of the repository, not those of the virtualenv, caches or build outputs."""
    found = []
    for folder, dirs, files in os.walk(ROOT):
        rel = Path(folder).relative_to(ROOT)
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS and not d.endswith(".egg-info")
                   and (rel / d).as_posix() != "runners/build"]
        found += [Path(folder) / f for f in files if f.endswith(".md")]
    return sorted(found)


def doc_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*$", text, flags=re.M)}


def broken_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no file {dest})")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.name})")
    return broken


def test_configuration_page_is_generated_from_the_settings_classes():
    page = ROOT / "docs" / "configuration.md"
    assert page.exists(), f"docs/configuration.md is missing: generate it with `{configdoc.REGENERATE}`"
    assert page.read_text(encoding="utf-8") == configdoc.render(), (
        f"docs/configuration.md is stale: regenerate it with `{configdoc.REGENERATE}`")


def test_configuration_page_lists_every_field_of_every_section():
    page = configdoc.render()
    for section in configdoc.SECTIONS:
        assert f"`{section.cls.__module__}.{section.cls.__name__}`" in page
        for name, field in section.cls.model_fields.items():
            for env in configdoc.env_names(section.cls, name, field):
                assert f"`{env}`" in page, env
    for var in configdoc.OTHER_VARIABLES:
        assert f"`{var.name}`" in page


def test_a_new_field_appears_with_its_variable_type_default_and_description():
    class Example(BaseSettings):
        model_config = SettingsConfigDict(env_prefix="SME2_")
        queue_depth_limit: int = Field(default=7, ge=1, description="How many runs may wait in the example queue")
        label: str | None = Field(default=None, description="An optional label " + "word " * 40)

    page = configdoc.render((configdoc.Section("Example", "the tests", Example),), ())
    assert "- `SME2_QUEUE_DEPTH_LIMIT`: integer, default `7`, ≥ 1. How many runs may wait in the example queue." in page
    assert "- `SME2_LABEL`: text or unset, default unset. An optional label" in page
    assert all(len(line) <= MAX_LINE for line in page.splitlines())
    assert "Read outside the settings classes" not in page


def test_check_mode_fails_on_a_stale_page_and_names_the_command(tmp_path):
    stale = tmp_path / "configuration.md"
    stale.write_text(configdoc.render().replace("SME2_DATA_DIR", "SME2_OLD_NAME"), encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "sme2farm.farm.configdoc", "--check", "--output", str(stale)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert configdoc.REGENERATE in done.stderr
    assert configdoc.main(["--output", str(stale)]) == 0
    assert configdoc.main(["--check", "--output", str(stale)]) == 0
    assert stale.read_text(encoding="utf-8") == configdoc.render()


def test_no_markdown_line_is_over_120_characters():
    pages = markdown_files()
    assert ROOT / "README.md" in pages and ROOT / "docs" / "configuration.md" in pages
    long = [f"{page.relative_to(ROOT)}:{number}: {len(line)} characters"
            for page in pages
            for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
            if len(line) > MAX_LINE]
    assert not long, "Markdown lines over 120 characters:\n" + "\n".join(long)


def test_every_relative_link_reaches_a_file_and_heading():
    broken = [f"{page.relative_to(ROOT)}: {link}" for page in doc_pages() for link in broken_links(page)]
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_readme_links_every_docs_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = {Path(t.partition("#")[0]).as_posix() for t in LINK.findall(readme)}
    missing = [page.name for page in sorted((ROOT / "docs").glob("*.md")) if f"docs/{page.name}" not in targets]
    assert not missing, f"docs pages the README does not link: {missing}"


def test_the_link_check_finds_a_broken_link_and_a_missing_heading(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## A `code` heading: here\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#a-code-heading-here) [gone](nowhere.md) [bad](other.md#nope) "
                    "[web](https://example.com/x)\n```\n[in code](ignored.md)\n```\n", encoding="utf-8")
    assert broken_links(page) == [f"nowhere.md (no file {tmp_path / 'nowhere.md'})",
                                  "other.md#nope (no heading #nope in other.md)"]


def folder_rows() -> dict[str, str]:
    """docs/layout.md's folder table: each folder it names, with the text of its row and continuation rows."""
    layout = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    table = layout.split("| folder | what |", 1)[1].split("\n\n", 1)[0]
    rows: dict[str, str] = {}
    current: list[str] = []
    for line in table.splitlines()[2:]:
        where, what = (cell.strip() for cell in line.strip().strip("|").split("|", 1))
        if where:
            current = re.findall(r"`([^`]+/)`", where)
            for folder in current:
                rows[folder] = ""
        for folder in current:
            rows[folder] += " " + what
    return rows


def test_the_folder_table_names_every_folder_and_package_and_only_modules_that_exist():
    rows = folder_rows()
    top = {f"{d.name}/" for d in ROOT.iterdir()
           if d.is_dir() and not d.name.startswith(".") and not d.name.endswith(".egg-info")
           and d.name not in SKIP_DIRS}
    packages = {f"{init.parent.relative_to(ROOT).as_posix()}/" for init in ROOT.glob("*/**/__init__.py")
                if not init.parent.relative_to(ROOT).parts[0].startswith((".", "tests"))
                and "build" not in init.parent.relative_to(ROOT).parts}
    assert not (top | packages) - set(rows), f"folders missing from docs/layout.md's table: {(top | packages) - set(rows)}"
    missing = [f"{folder}{name}" for folder, what in rows.items()
               for name in re.findall(r"`([\w.]+\.(?:py|cpp))`", what) if not (ROOT / folder / name).exists()]
    assert not missing, f"docs/layout.md's folder table names modules that do not exist: {missing}"


PACKAGE_FOLDERS = ("sme2farm", "farm", "server", "worker", "agent", "client", "analysis", "runners", "migrations")
ENV_READ = re.compile(r"""(?:environ\.get\(|environ\[|getenv\()\s*["'](SME2_[A-Z0-9_]+)["']""")


def test_every_sme2_variable_the_code_reads_is_on_the_configuration_page_once():
    documented = [env for section in configdoc.SECTIONS for name, field in section.cls.model_fields.items()
                  for env in configdoc.env_names(section.cls, name, field)]
    others = [var.name for var in configdoc.OTHER_VARIABLES]
    assert not set(documented) & set(others), "listed both in a settings class and as read outside one"
    assert len(others) == len(set(others))
    read = {name for folder in PACKAGE_FOLDERS for path in (ROOT / folder).rglob("*.py")
            for name in ENV_READ.findall(path.read_text(encoding="utf-8"))}
    assert read, "the scan found no environment reads at all"
    undocumented = read - set(documented) - set(others)
    assert not undocumented, f"read from the environment but not in docs/configuration.md: {sorted(undocumented)}"


def test_every_source_path_the_pages_name_exists():
    """A module or page named by its path (`server/services/runs/status.py`) is there: pages follow moves."""
    named = {(page.relative_to(ROOT).as_posix(), path) for page in doc_pages()
             for path in re.findall(r"`((?:[\w.-]+/)+[\w.-]+\.(?:py|cpp|md))`", page.read_text(encoding="utf-8"))}
    assert named, "no source path found in the pages"
    missing = sorted(f"{page}: {path}" for page, path in named if not (ROOT / path).exists())
    assert not missing, "the pages name files that do not exist:\n" + "\n".join(missing)
