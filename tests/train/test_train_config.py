"""The trainer's typed config: what the command line builds, what --help shows. Pure tier: no torch."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from launcher.train import cli
from launcher.train.config import HarnessConfig

ARGVS = [
    [],
    ["--dataset", "linreg", "--model", "linear", "--lr", "0.1", "--grad-accum", "2", "--amp", "bf16"],
    ["--dataset", "cifar10", "--data-dir", "/d", "--model", "resnet18", "--sync-bn", "--grad-compression", "fp16",
     "--checkpoint-every", "5", "--output-dir", "/o", "--step-delay", "0.5", "--bench-no-sync", "--compile",
     "--bench-data-delay", "0.1", "--bench-comm-delay", "0.2", "--bench-no-split"],
    ["--eval-only", "--resume", "/o/checkpoint.pt", "--dataset", "synthetic", "--seed", "3"],
]


def hidden_options(p: argparse.ArgumentParser) -> set[str]:
    return {opt for a in p._actions if a.help == argparse.SUPPRESS for opt in a.option_strings}


def test_help_lists_no_hidden_option():
    p = cli.parser()
    text = p.format_help()  # what --help prints
    harness = {f"--{f.name.replace('_', '-')}" for f in dataclasses.fields(HarnessConfig)}
    assert hidden_options(p) == harness == {"--step-delay", "--bench-no-sync", "--bench-data-delay",
                                            "--bench-comm-delay", "--bench-no-split", "--slow-rank",
                                            "--slow-rank-delay"}
    for opt in harness:
        assert opt not in text, opt
    assert "--log-every" in text and "--stop-check-every" in text  # the user's options are there


def test_hidden_options_still_work():
    assert cli.parse(["--step-delay", "0.25", "--bench-no-sync", "--bench-data-delay", "0.5", "--bench-comm-delay",
                      "0.125", "--bench-no-split", "--slow-rank", "1", "--slow-rank-delay", "0.05"]
                     ).harness == HarnessConfig(0.25, True, 0.5, 0.125, True, 1, 0.05)
    assert cli.parse([]).harness == HarnessConfig(step_delay=0.0, bench_no_sync=False, bench_data_delay=0.0,
                                                  bench_comm_delay=0.0, bench_no_split=False)


@pytest.mark.parametrize("argv", ARGVS)
def test_config_records_the_command_line_as_argparse_gave_it(argv):
    # A checkpoint keeps the record under "args": the same keys and values as vars() of the namespace
    # (the model resolved to mlp when training), so every option lands in the config and none is lost.
    ns = cli.parser().parse_args(argv)
    if not ns.eval_only:
        ns.model = ns.model or "mlp"
    assert cli.parse(argv).as_record() == vars(ns)


def test_config_is_typed_and_frozen():
    cfg = cli.parse(["--eval-only", "--resume", "ckpt", "--model", "resnet18", "--epochs", "4"])
    assert cfg.optim.epochs == 4 and cfg.eval_only is not None
    assert (cfg.eval_only.resume, cfg.eval_only.model) == ("ckpt", "resnet18")
    cfg = cli.parse(["--eval-only", "--resume", "ckpt"])
    assert cfg.eval_only is not None and cfg.eval_only.model is None  # None: the checkpoint's model
    assert cli.parse([]).eval_only is None and cli.parse([]).model == "mlp"
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.optim.epochs = 5  # type: ignore[misc]
