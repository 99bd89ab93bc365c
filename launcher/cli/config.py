"""``ddpjob config show``: the defaults from the project file and the user config, and where each
value comes from. Imports only click at start-up."""

from __future__ import annotations

import json

import click

from launcher.cli.formats import MACHINE, echo, output_option
from launcher.cli.support import guard
from launcher.cli.tools import complete_spec_files


@click.group(name="config")
def config_group() -> None:
    """Defaults from files: the project file and the user config.

    \b
    Precedence, highest first:
      flags (--set, --env, --env-file, --nodes, --target) > the spec > the project
      file (.ddpjob.yaml, found upward from the current folder) > the user config
      ($DDPJOB_CONFIG, else ~/.config/ddpjob/config.yaml) > built-in defaults.
    Either file holds spec fields and target, e.g.:
    \b
      target: slurm
      image: registry.example.com/team/train:1.4
      slurm: {partition: gpu, account: ml, time: "4:00:00"}
      k8s: {context: prod, namespace: team-ml, queue: team-queue}
    DDPJOB_CONFIG=none reads neither file.
    """


@config_group.command(name="show")
@click.argument("spec_file", metavar="[SPEC]", required=False, shell_complete=complete_spec_files)
@output_option()
@guard
def show(spec_file: str | None, output: str) -> None:
    """Show every default the files set and where it comes from; with SPEC, also which of them the
    spec sets itself (the spec wins). Values of secret-named env variables are shown as ***, a
    notify URL as scheme://host/*** (a webhook's path is often its secret).

    \b
    Examples:
      ddpjob config show
      ddpjob config show train.yaml -o json
      ddpjob config show -o yaml
    """
    from launcher.spec import defaults, yamlread
    found = defaults.layers()
    in_spec: dict[tuple[str | int, ...], tuple[int, int]] = {}
    if spec_file is not None:
        _, in_spec, _ = yamlread.parse(yamlread.read_spec_text(spec_file), spec_file)
    rows: dict[str, dict[str, object]] = {}
    hidden: dict[str, list[str]] = {}  # each key's sources that a higher one hides
    for layer in reversed(found):  # the higher file first: its value is the one used
        entries: list[tuple[tuple[str, ...], object]] = [(("target",), layer.data["target"])] if "target" in layer.data else []
        entries += defaults.leaves({k: v for k, v in layer.data.items() if k != "target"}, ())
        for path, value in entries:
            key = ".".join(str(p) for p in path)
            row = rows.setdefault(key, {"key": key, "value": _shown(path, value),
                                        "from": layer.source(path), "spec_sets_it": path in in_spec})
            if row["from"] != layer.source(path):
                row["hidden"] = hidden.setdefault(key, [])
                hidden[key].append(layer.source(path))
    user, project = defaults.user_config_path(), defaults.project_file()
    files = {"user_config": user, "user_config_found": bool(user and any(la.kind == defaults.USER_KIND for la in found)),
             "project_file": project if user is not None else None}
    if output in MACHINE:
        echo({**files, "precedence": PRECEDENCE, "defaults": list(rows.values())}, output)
        return
    click.echo(f"user config:   {user or 'none (DDPJOB_CONFIG=none)'}"
               + ("" if files["user_config_found"] or user is None else "  (not found)"))
    click.echo(f"project file:  {files['project_file'] or 'none found (.ddpjob.yaml here or in a folder above)'}")
    click.echo(f"precedence:    {' > '.join(PRECEDENCE)}")
    if not rows:
        click.echo("\nno defaults set: the built-in ones apply (target: local)")
        return
    shown = {k: r["value"] if isinstance(r["value"], str) else json.dumps(r["value"]) for k, r in rows.items()}
    width, value_width = max(len(k) for k in rows), min(40, max(len(v) for v in shown.values()))
    click.echo("")
    for key, row in rows.items():
        line = f"{key:<{width}}  {shown[key]:<{value_width}}  {row['from']}"
        click.echo(line + ("  (the spec sets its own: the spec wins)" if row["spec_sets_it"] else ""))


def _shown(path: tuple[str, ...], value: object) -> object:
    """A default's value as shown: secrets masked as everywhere else (``launcher.spec.secrets``)."""
    from launcher.spec.secrets import MASK, is_secret, shown_url

    if len(path) == 2 and path[0] == "env" and is_secret(path[1], value):
        return MASK
    if path == ("notify", "url"):
        return shown_url(value) if isinstance(value, str) else MASK
    return value


PRECEDENCE = ["flags", "spec", "project file", "user config", "built-in"]
