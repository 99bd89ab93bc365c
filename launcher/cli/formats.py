"""The machine-readable outputs, alike in every command that has them: ``-o json`` and ``-o yaml``
(kubectl's pair). The YAML is the JSON record itself, read back and dumped in block style: the same
keys in the same order, nothing the JSON leaves out (secrets masked there stay masked), so the two
cannot drift apart. Imports only click at start-up."""

from __future__ import annotations

from collections.abc import Callable

import click
from click.decorators import FC

MACHINE = ("json", "yaml")


def output_option(*texts: str, help: str | None = None) -> Callable[[FC], FC]:
    """``--output/-o`` taking ``texts`` (default: ``text``) then json and yaml, in any case, as every
    choice of ddpjob does (``-o JSON`` is ``-o json``)."""
    choice = click.Choice([*(texts or ("text",)), *MACHINE], case_sensitive=False)
    return click.option("--output", "-o", type=choice, default=(texts or ("text",))[0], show_default=True, help=help)


def dumps(data: object, output: str, *, sort_keys: bool = False, indent: int | None = 2) -> str:
    """``data`` as ``-o json`` prints it (``indent`` None: on one line) or as ``-o yaml`` does (block
    style, without a final newline either way)."""
    import json

    text = json.dumps(data, indent=indent, sort_keys=sort_keys)
    if output == "json":
        return text
    return yaml_text(json.loads(text))


def yaml_text(data: object, *, explicit_start: bool = False) -> str:
    """Plain data (what ``json.loads`` gives) as block-style YAML: keys in their order, no anchors or
    aliases, no line folded (a long message stays one line for grep), unicode as it is; a control
    character is escaped (a message's terminal codes never reach the terminal)."""
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: object) -> bool:
            return True

    text: str = yaml.dump(data, Dumper=Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True,
                          width=1 << 30, explicit_start=explicit_start)
    # A lone scalar (a string, null) is dumped with the end-of-document marker "..." after it.
    return text.removesuffix("\n...\n").rstrip("\n")


def echo(data: object, output: str, *, sort_keys: bool = False) -> None:
    """Print ``data`` as ``-o json`` or ``-o yaml`` asks."""
    click.echo(dumps(data, output, sort_keys=sort_keys))
