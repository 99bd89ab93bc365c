"""YAML edges reported in ddpjob's words at their line: a NUL or other control byte (PyYAML says
"position 58"), an anchor defined twice, nesting deeper than 64 levels in every form."""

from __future__ import annotations

import pytest

from launcher.core.errors import SpecError
from launcher.spec.load import load_spec


def _problem(tmp_path, text: str) -> str:
    spec = tmp_path / "s.yaml"
    spec.write_text(text)
    with pytest.raises(SpecError) as info:
        load_spec(str(spec))
    return str(info.value).replace(str(spec), "s.yaml")


def test_a_nul_byte_is_reported_at_its_line_and_column(tmp_path):
    text = _problem(tmp_path, 'name: a\ncommand: [python, x]\nenv:\n  A: "x\0y"\n')
    assert "s.yaml:4:8:" in text and "NUL byte" in text and "position" not in text, text
    text = _problem(tmp_path, "name: a\ncommand: [python, x]\nenv:\n  B: x\x1by\n")
    assert "s.yaml:4:7:" in text and "'\\x1b'" in text, text


def test_control_characters_are_found_in_non_ascii_text_too(tmp_path):
    # ASCII text is checked with a smaller pattern than text with other characters: both must refuse
    text = _problem(tmp_path, "name: a\ncommand: [python, x]\nenv:\n  B: caf\u00e9\x1by\n")
    assert "s.yaml:4:10:" in text and "'\\x1b'" in text, text
    text = _problem(tmp_path, "name: a\ncommand: [python, x]\nenv:\n  B: \u00e9\ufffe\n")
    assert "s.yaml:4:7:" in text and "'\\ufffe'" in text, text
    spec = tmp_path / "ok.yaml"
    spec.write_text("name: a\ncommand: [python, x]\nenv:\n  B: caf\u00e9 \u00a0\U0001F600 \x85\n")
    assert load_spec(str(spec)).spec.env["B"].startswith("caf\u00e9")


def test_an_anchor_defined_twice_is_named_at_its_line(tmp_path):
    text = _problem(tmp_path, "name: a\ncommand: [python, x]\nsweep: &ab {}\nenv:\n  X: &ab x\n")
    assert "s.yaml:5:6: env.X: anchor &ab is defined twice" in text, text


@pytest.mark.parametrize("value", ["[" * 70 + "]" * 70, "{a: " * 70 + "1" + "}" * 70, "[" * 5000 + "]" * 5000,
                                   "- " * 200 + "x", "[" * 1001])
def test_deep_nesting_is_ddpjobs_message_in_every_form(tmp_path, value):
    text = _problem(tmp_path, f"name: a\ncommand: [python, x]\nenv:\n  {value}\n")
    assert "nested more than 64 levels deep" in text and "YAML syntax error" not in text, text
