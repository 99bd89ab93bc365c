"""The generated parts of docs/commands.md and docs/spec.md: every command and option, read from the
click commands ``main`` builds (what ``--help`` prints), and every spec field with its type, default
and description, read from the spec's JSON Schema (what ``ddpjob schema`` prints). Each goes between
its page's markers; the prose around it is the page's own. ``python -m launcher.cli.reference``
rewrites them (``--check``: exit 1, naming the stale pages, instead), and
tests/foundation/test_found_reference_docs.py fails when a page lags the code. Imports only click at
start-up; the commands and the spec's models are loaded when a reference is made."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence

import click

COMMAND = "python -m launcher.cli.reference"
# (name, page in docs/): the references, each between its markers on its page.
REFERENCES = (("commands", "commands.md"), ("spec", "spec.md"))
END = "<!-- end generated -->"

# A JSON Schema as pydantic writes it: nested mappings and lists of plain values.
Schema = Mapping[str, object]


def begin(name: str) -> str:
    """The line that opens reference ``name`` on its page."""
    return f"<!-- generated: ddpjob reference {name}; do not edit by hand, run: {COMMAND} -->"


# --------------------------------------------------------------------------- commands and options

def _one_line(text: str) -> str:
    return " ".join(text.split())


def _first_paragraph(help_text: str | None) -> str:
    return _one_line((help_text or "").replace("\b", "").strip().split("\n\n", 1)[0])


def _walk(command: click.Command, ctx: click.Context) -> Iterator[tuple[click.Command, click.Context]]:
    """The command and every command below it, in the order they were added (the groups' own too)."""
    yield command, ctx
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            if not sub.hidden:
                yield from _walk(sub, click.Context(sub, info_name=name, parent=ctx))


def command_paths() -> list[str]:
    """Every command as it is typed (``ddpjob``, ``ddpjob submit``, ``ddpjob config show``)."""
    from launcher.cli.main import cli

    return [ctx.command_path for _, ctx in _walk(cli, click.Context(cli, info_name="ddpjob"))]


def commands_reference() -> str:
    """Markdown: for each command, its usage, what it does (the first paragraph of its ``--help``) and
    each option as ``--help`` gives it (names, value, help, default and range)."""
    from launcher.cli.main import cli

    out = ["Every command also takes `-h`, `--help`, which adds examples. Options and help as "
           "`--help` prints them:"]
    for command, ctx in _walk(cli, click.Context(cli, info_name="ddpjob")):
        usage = " ".join([ctx.command_path, *command.collect_usage_pieces(ctx)])
        out += ["", f"### {ctx.command_path}", "", f"`{usage}`: {_first_paragraph(command.help)}"]
        help_option = command.get_help_option(ctx)
        options = [p for p in command.get_params(ctx) if isinstance(p, click.Option) and p is not help_option]
        if isinstance(command, click.Group):
            subs = [name for name, sub in command.commands.items() if not sub.hidden]
            out += ["", f"Commands: {', '.join(f'`{name}`' for name in subs)}."]
        if options:
            out.append("")
        for option in options:
            record = option.get_help_record(ctx)
            if record is not None:  # None: a hidden option
                spelled, text = record
                out.append(f"- `{spelled}`: {_one_line(text)}")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- spec fields

def _map(value: object) -> Schema:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Schema]:
    return [_map(v) for v in value] if isinstance(value, list) else []


def _model(schema: Schema, defs: Schema) -> Schema | None:
    """The model (a section with fields of its own) that ``schema`` refers to, alone or beside null."""
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return _map(defs.get(ref.rsplit("/", 1)[-1]))
    found = [m for option in _list(schema.get("anyOf")) if (m := _model(option, defs)) is not None]
    return found[0] if len(found) == 1 else None


def _bounds(schema: Schema) -> str:
    low, high = schema.get("minimum"), schema.get("maximum")
    if low is not None and high is not None:
        return f" {low} to {high}"
    if low is not None:
        return f" from {low}"
    return f" up to {high}" if high is not None else ""


def type_text(schema: Schema, defs: Schema) -> str:
    """What a field holds, in words: ``integer 1 to 1024 or `auto` ``, ``list of string``, ``section``."""
    if _model(schema, defs) is not None:
        return "section"
    options = [o for o in _list(schema.get("anyOf")) if o.get("type") != "null"]
    if options:
        return " or ".join(type_text(o, defs) for o in options)
    if "const" in schema:
        return f"`{_value(schema['const'])}`"
    enum = schema.get("enum")
    if isinstance(enum, list):
        return "one of " + ", ".join(f"`{_value(v)}`" for v in enum)
    kind = schema.get("type")
    if kind == "array":
        items = _map(schema.get("items"))
        if _model(items, defs) is not None:
            return "list of sections"
        return f"list of {type_text(items, defs).replace('one of ', 'any of ', 1)}"
    if kind == "object":
        values = _map(schema.get("additionalProperties"))
        if _model(values, defs) is not None:
            return "mapping of names to sections"
        return f"mapping of names to {type_text(values, defs)}" if values else "mapping"
    if kind in ("integer", "number"):
        return f"{kind}{_bounds(schema)}"
    return str(kind) if kind else "any value"


def _value(value: object) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value)


def _default(schema: Schema, required: bool) -> str:
    if required:
        return "required"
    if "default" not in schema:  # a section made of its fields' defaults
        return ""
    value = schema["default"]
    return "unset" if value is None else f"default `{_value(value)}`"


def _fields(path: str, model: Schema, defs: Schema) -> Iterator[tuple[str, Schema, bool]]:
    """(dotted path, schema, required) of each field of ``model``, in the order the model declares them."""
    required = model.get("required")
    for name, schema in _map(model.get("properties")).items():
        yield f"{path}{name}", _map(schema), isinstance(required, list) and name in required


def _sections(path: str, model: Schema, intro: str, defs: Schema) -> Iterator[tuple[str, str, Schema]]:
    """(path, what it is, model) of ``model`` and every section below it, depth first. A list of
    sections is ``path[]``, a mapping of names to sections ``path.<NAME>``."""
    yield path, intro, model
    for field, schema, _ in _fields(f"{path}." if path else "", model, defs):
        description = _one_line(str(schema.get("description", "")))
        below = _model(schema, defs)
        if below is None and schema.get("type") == "array":
            below, field = _model(_map(schema.get("items")), defs), f"{field}[]"
        elif below is None and schema.get("type") == "object":
            below, field = _model(_map(schema.get("additionalProperties")), defs), f"{field}.<NAME>"
        if below is not None:
            yield from _sections(field, below, description, defs)


def spec_reference() -> str:
    """Markdown: for each section of the spec (the top level, ``resources``, ``k8s``, ``k8s.volumes[]``
    ...), each field's path, type, default and description, as the JSON Schema gives them."""
    from launcher.spec.model import json_schema

    schema = json_schema()
    defs = _map(schema.get("$defs"))
    out = ["Every field of a spec, section by section, with its type, its default and what it does "
           "(`ddpjob schema` gives the same as a JSON Schema). A field left out takes its default; "
           "`unset`: no value, and its description says what happens then."]
    for path, intro, model in _sections("", schema, "", defs):
        out += ["", f"### `{path}`" if path else "### Top level", ""]
        if intro:
            out += [intro, ""]
        for field, field_schema, required in _fields(f"{path}." if path else "", model, defs):
            kind = type_text(field_schema, defs)
            default = _default(field_schema, required)
            facts = f"{kind}, {default}" if default else kind
            description = _one_line(str(field_schema.get("description", "")))
            out.append(f"- `{field}` ({facts}): {description}")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- the pages

def reference(name: str) -> str:
    """The generated text of reference ``name`` (``commands`` or ``spec``)."""
    return commands_reference() if name == "commands" else spec_reference()


def with_reference(page: str, name: str, text: str) -> str:
    """``page`` with reference ``name``'s block holding ``text``; every line outside it kept."""
    start, end = begin(name), END
    if page.count(start) != 1:
        raise ValueError(f"the page needs the line {start!r} once, and {end!r} after it")
    head, rest = page.split(start, 1)
    if end not in rest:
        raise ValueError(f"no {end!r} after {start!r}")
    tail = rest.split(end, 1)[1]
    return f"{head}{start}\n{text}{end}{tail}"


def folder() -> str:
    """docs/ (through ``launcher/docs``, the package's link to it)."""
    from launcher.cli.docs import folder as docs_folder

    return docs_folder()


def update(where: str, *, check: bool) -> list[str]:
    """Rewrite each page's reference in folder ``where`` (with ``check``, only compare); the pages that
    were stale."""
    stale = []
    for name, page in REFERENCES:
        path = os.path.join(where, page)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        new = with_reference(text, name, reference(name))
        if new != text:
            stale.append(page)
            if not check:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(new)
    return stale


def main(argv: Sequence[str]) -> int:
    check = "--check" in argv
    if set(argv) - {"--check"}:
        print(f"usage: {COMMAND} [--check]", file=sys.stderr)
        return 2
    where = folder()
    stale = update(where, check=check)
    for page in stale:
        print(f"{os.path.join(os.path.realpath(where), page)}: {'stale, run: ' + COMMAND if check else 'reference rewritten'}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
