"""docs/configuration.md, generated from the settings classes: every field's environment
variable, type, default and description, so the page cannot say what the code does not.

    python -m sme2farm.farm.configdoc            # rewrite docs/configuration.md
    python -m sme2farm.farm.configdoc --check    # exit 1 when the page differs from the classes
    python -m sme2farm.farm.configdoc --stdout   # print the page
"""

from __future__ import annotations

import argparse
import sys
import textwrap
import types
import typing
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from pydantic import AliasChoices, SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from sme2farm.agent.config import AgentSettings
from sme2farm.client.config import ClientSettings
from sme2farm.server.config import Settings

WIDTH = 120
REGENERATE = "python -m sme2farm.farm.configdoc"
PAGE = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


@dataclass(frozen=True)
class Section:
    """One settings class and the processes that read it."""

    title: str
    readers: str
    cls: type[BaseSettings]


@dataclass(frozen=True)
class Variable:
    """An environment variable read outside the settings classes."""

    name: str
    default: str
    readers: str
    meaning: str


SECTIONS: tuple[Section, ...] = (
    Section("Server and worker", "the API server, the Celery worker and beat, and `sme2-farm`", Settings),
    Section("Agent", "`sme2-agent` on each device host; a command-line option wins", AgentSettings),
    Section("Client", "`sme2-client`; `--server` and `--token` win", ClientSettings),
)

# Read where no settings class reaches: the logging set-up every process shares, prometheus_client's
# multiprocess mode, the runner catalogue and adb.
OTHER_VARIABLES: tuple[Variable, ...] = (
    Variable("SME2_LOG_FORMAT", "`json` off a terminal, else `text`", "every process (`sme2farm/logs.py`)",
             "`json` (one object a line) or `text`."),
    Variable("PROMETHEUS_MULTIPROC_DIR", "unset (`sme2-farm up`: `<data dir>/metrics`)",
             "the server and the worker (`server/web/prometheus.py`)",
             "A directory server and worker both write, so `/metrics` counts the worker's tasks and ingest "
             "times too."),
    Variable("SME2_METRICS_SLOT", "unset (`sme2-farm up` and compose set one per child)",
             "the server and the worker (`server/web/prometheus.py`)",
             "Names this process's metrics files, so a restarted child reopens its own instead of adding "
             "files."),
    Variable("SME2_RUNNER_MANIFEST", "`runners/build/manifest.json`", "`sme2-agent`, `sme2-farm runners`",
             "The runner-build catalogue an agent registers and runs."),
    Variable("ANDROID_ADB_SERVER_PORT", "`5037`", "the `android` driver", "The adb server's port."),
)

_TYPE_NAMES: dict[object, str] = {
    str: "text", int: "integer", float: "number", bool: "boolean", Path: "path",
    SecretStr: "secret text", datetime: "UTC date-time",
}


def type_name(annotation: object) -> str:
    """A field's type in words: `number`, `path or unset`."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        names = [type_name(arg) for arg in args if arg is not type(None)]
        return " or ".join(names) + (" or unset" if type(None) in args else "")
    if typing.get_origin(annotation) is typing.Literal:
        return "one of " + ", ".join(f"`{arg}`" for arg in args)
    return _TYPE_NAMES.get(annotation, getattr(annotation, "__name__", str(annotation)))


def env_names(cls: type[BaseSettings], name: str, field: FieldInfo) -> list[str]:
    """The environment variables a field is read from, in the order they are tried."""
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return [choice for choice in alias.choices if isinstance(choice, str)]
    if isinstance(alias, str):
        return [alias]
    return [f"{cls.model_config.get('env_prefix', '')}{name}".upper()]


def default_text(field: FieldInfo) -> str:
    if field.default_factory is not None:
        return f"`{field.default_factory()}`"
    default = field.default
    if default is None:
        return "unset"
    if isinstance(default, bool):
        return "`1`" if default else "`0` (off)"
    if isinstance(default, float) and default.is_integer():
        return f"`{int(default)}`"
    return f"`{default}`"


def bounds_text(field: FieldInfo) -> str:
    words = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<"}
    parts = []
    for item in field.metadata:
        for attr, sign in words.items():
            value = getattr(item, attr, None)
            if value is not None:
                parts.append(f"{sign} {int(value) if isinstance(value, float) and value.is_integer() else value}")
    return ", ".join(parts)


def wrap_item(head: str, text: str) -> list[str]:
    """A list item: its head on the first line, then the text, every line within WIDTH."""
    body = textwrap.wrap(f"{head} {text}", WIDTH, initial_indent="- ", subsequent_indent="  ",
                         break_long_words=False, break_on_hyphens=False)
    return body


def sentence(text: str | None) -> str:
    text = (text or "No description").strip()
    return text if text.endswith(".") else text + "."


def render_field(cls: type[BaseSettings], name: str, field: FieldInfo) -> list[str]:
    names = " or ".join(f"`{env}`" for env in env_names(cls, name, field))
    head = f"{type_name(field.annotation)}, default {default_text(field)}"
    bounds = bounds_text(field)
    if bounds:
        head += f", {bounds}"
    return wrap_item(f"{names}: {head}.", sentence(field.description))


def render(sections: tuple[Section, ...] = SECTIONS, others: tuple[Variable, ...] = OTHER_VARIABLES) -> str:
    """The whole page, as it is written to docs/configuration.md."""
    lines = [
        "# Configuration",
        "",
        f"<!-- Generated by `{REGENERATE}` from the settings classes. Do not edit by hand. -->",
        "",
        "Every setting is an environment variable, read when its process starts. Each entry gives the",
        "variable, its type, its default and what it does. How the limits behave in operation (rate limits,",
        "lockout, proxies, patient agents) is in [operations](operations.md).",
    ]
    for section in sections:
        lines += ["", f"## {section.title}", "",
                  f"Read by {section.readers} (`{section.cls.__module__}.{section.cls.__name__}`).", ""]
        for name, field in section.cls.model_fields.items():
            lines += render_field(section.cls, name, field)
    if others:
        lines += ["", "## Read outside the settings classes", ""]
        for var in others:
            lines += wrap_item(f"`{var.name}`: default {var.default}; read by {var.readers}.", sentence(var.meaning))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=REGENERATE, description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 when the page is stale")
    mode.add_argument("--stdout", action="store_true", help="print the page instead of writing it")
    parser.add_argument("--output", type=Path, default=PAGE, help=f"the page (default {PAGE})")
    args = parser.parse_args(argv)
    page = render()
    if args.stdout:
        sys.stdout.write(page)
        return 0
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != page:
            print(f"{args.output} is stale: regenerate it with `{REGENERATE}`", file=sys.stderr)
            return 1
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(page, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
