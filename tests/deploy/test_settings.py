"""Operators' conventions: every flag from the environment and a config file (command line > environment >
config file > default), and --log-format json."""
from __future__ import annotations

import json
import logging

import pytest

from dynamiccl.cli import build_parser, main
from dynamiccl.settings import apply, finish


def _parse(argv, env=None, doc=None):
    p = build_parser()
    apply(p, env or {}, doc or {})
    return finish(p.parse_args(argv))


def test_one_precedence_command_line_environment_file_default():
    doc = {"detector": {"run": {"metrics": "0.0.0.0:1001", "serve": "tcp:0.0.0.0:1002", "warmup": 7}}}
    env = {"DYNAMICCL_DETECTOR_RUN_SERVE": "tcp:0.0.0.0:2002", "DYNAMICCL_DETECTOR_RUN_NO_AUTOENCODER": "yes"}
    ns = _parse(["detector", "run", "--warmup", "9"], env, doc)
    assert ns.metrics == "0.0.0.0:1001"              # file over default
    assert ns.serve == "tcp:0.0.0.0:2002"            # environment over file
    assert ns.warmup == 9                            # command line over file
    assert ns.no_autoencoder is True                 # an on/off flag from the environment
    assert ns.features == _parse(["detector", "run"]).features   # untouched: the built-in default


def test_repeatable_flags_are_lists_and_the_command_line_replaces_them():
    env = {"DYNAMICCL_COLLECTOR_LISTEN": "unix:/run/a.sock,tcp:0.0.0.0:9470"}
    assert _parse(["collector"], env).listen == ["unix:/run/a.sock", "tcp:0.0.0.0:9470"]
    assert _parse(["collector", "--listen", "unix:/x.sock"], env).listen == ["unix:/x.sock"]
    assert _parse(["collector"], doc={"collector": {"listen": ["unix:/f.sock"]}}).listen == ["unix:/f.sock"]


@pytest.mark.parametrize("env, doc, message", [
    ({"DYNAMICCL_COLLECTOR_WINDOW": "soon"}, {}, "DYNAMICCL_COLLECTOR_WINDOW='soon': invalid float"),
    ({"DYNAMICCL_LOG_FORMAT": "xml"}, {}, "expected one of text, json"),
    ({"DYNAMICCL_DETECTOR_RUN_NO_AUTOENCODER": "maybe"}, {}, "expected one of 1/true"),
    ({}, {"detector": {"run": {"metrix": "x"}}}, "unknown key(s) metrix"),
    ({}, {"detectr": {}}, "unknown key(s) detectr"),
    ({}, {"collector": "on"}, "`collector` must be a mapping"),
])
def test_bad_settings_name_what_is_wrong(env, doc, message):
    with pytest.raises(ValueError) as exc:
        apply(build_parser(), env, doc)
    assert message in str(exc.value)


def test_main_reads_the_config_file_from_the_environment(tmp_path, monkeypatch, capsys):
    f = tmp_path / "dynamiccl.yaml"
    f.write_text(f"stack:\n  status:\n    state-dir: {tmp_path / 'from-file'}\n")
    monkeypatch.setenv("DYNAMICCL_CONFIG_FILE", str(f))
    assert main(["stack", "status"]) == 3
    assert f"no stack recorded in {tmp_path / 'from-file'}" in capsys.readouterr().out
    monkeypatch.setenv("DYNAMICCL_STACK_STATUS_STATE_DIR", str(tmp_path / "from-env"))
    assert main(["stack", "status"]) == 3
    assert str(tmp_path / "from-env") in capsys.readouterr().out
    f.write_text("stack: [1, 2]\n")
    assert main(["stack", "status"]) == 2
    assert "must be a mapping" in capsys.readouterr().err


def test_log_format_json(capsys):
    from dynamiccl.logfmt import configure
    try:
        configure("INFO", "json")
        try:
            raise OSError("address in use")
        except OSError:
            logging.getLogger("dynamiccl.test").exception("cannot listen on %s", "0.0.0.0:9464")
        rec = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
        assert rec["level"] == "ERROR" and rec["logger"] == "dynamiccl.test"
        assert rec["msg"] == "cannot listen on 0.0.0.0:9464" and "OSError: address in use" in rec["exc"]
        assert rec["ts"].endswith("+00:00")
    finally:   # leave no handler bound to this test's captured stderr
        logging.basicConfig(handlers=[logging.NullHandler()], force=True)
