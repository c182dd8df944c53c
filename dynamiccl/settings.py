"""Every flag of every ``dynamiccl`` command also from the environment and from a config file.

One precedence, highest first: **command line > environment > config file > built-in default**.

* Environment: ``DYNAMICCL_<COMMAND>[_<SUBCOMMAND>]_<FLAG>``, upper case, ``-`` as ``_``:
  ``dynamiccl detector run --metrics`` is ``DYNAMICCL_DETECTOR_RUN_METRICS``; the top-level
  ``--log-level`` is ``DYNAMICCL_LOG_LEVEL``. Repeatable flags take a comma-separated list; on/off flags
  take ``1/true/yes/on`` or ``0/false/no/off``.
* Config file: ``--config-file PATH`` or ``DYNAMICCL_CONFIG_FILE``: YAML, commands and subcommands as
  nested mappings, flags by their long name (dashes or underscores); a repeatable KEY=VALUE flag
  (``--set``) also takes a nested mapping, read as dotted keys::

      log-format: json
      collector: {metrics: "0.0.0.0:9464", listen: ["unix:/run/dynamiccl/collector.sock"]}
      detector: {run: {features: "tcp:collector:9465", set: {baseline: {warmup: 30}}}}

A value that does not parse, a flag or command the file names that does not exist, or a choice that is
not allowed is an error naming the variable or key. Values are converted by the flag's own type.

>>> import argparse
>>> p = argparse.ArgumentParser(prog="x"); s = p.add_subparsers(dest="command")
>>> q = s.add_parser("detector").add_subparsers(dest="sub").add_parser("run")
>>> _ = q.add_argument("--metrics", default="127.0.0.1:9466"); _ = q.add_argument("--warmup", type=int)
>>> _ = q.add_argument("--listen", action="append")
>>> apply(p, {"DYNAMICCL_DETECTOR_RUN_WARMUP": "30"}, {"detector": {"run": {"metrics": "0.0.0.0:9466"}}})
>>> ns = finish(p.parse_args(["detector", "run", "--metrics", "0.0.0.0:1"])); (ns.metrics, ns.warmup)
('0.0.0.0:1', 30)
>>> apply(p, {"DYNAMICCL_DETECTOR_RUN_WARMUP": "soon"}, {})
Traceback (most recent call last):
...
ValueError: DYNAMICCL_DETECTOR_RUN_WARMUP='soon': invalid int value
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, Mapping


__all__ = ["apply", "finish", "load_file", "env_name", "CONFIG_ENV"]

CONFIG_ENV = "DYNAMICCL_CONFIG_FILE"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
_SKIP = {"help", "version", "config_file"}


class _FromSettings(list):
    """A repeatable flag's list that came from the environment or the file: argparse appends command-line
    values to a copy of it, and :func:`finish` keeps only those (the command line wins, it does not add)."""

    def __init__(self, items, n: int):
        super().__init__(items)
        self.n = n


def env_name(path: tuple[str, ...], flag: str) -> str:
    return "DYNAMICCL_" + "_".join((*path, flag)).upper().replace("-", "_")


def load_file(path: str | os.PathLike) -> dict:
    # yaml only when a config file is given: the base install (a training node) has no third-party package
    try:
        import yaml
    except ImportError:
        raise ValueError(f"config file {path}: reading it needs pyyaml (pip install 'dynamiccl[services]')") from None
    try:
        doc = yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"config file {path}: not YAML ({exc})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"config file {path}: expected a mapping of commands, got {type(doc).__name__}")
    return doc


def _long(action: argparse.Action) -> str | None:
    names = [o for o in action.option_strings if o.startswith("--")]
    return names[0][2:] if names else None


def _convert(action: argparse.Action, raw: Any, where: str) -> Any:
    if isinstance(action, (argparse._StoreConstAction, argparse._StoreTrueAction, argparse._StoreFalseAction)):
        text = str(raw).strip().lower()
        if text not in _TRUE + _FALSE:
            raise ValueError(f"{where}={raw!r}: expected one of {'/'.join(_TRUE + _FALSE)}")
        return action.const if text in _TRUE else action.default
    if isinstance(action, argparse._AppendAction):
        if isinstance(raw, dict):
            raw = list(_dotted(raw))
        items = raw if isinstance(raw, list) else [x for x in str(raw).split(",") if x.strip()]
        conv = [_one(action, x, where) for x in items]
        return _FromSettings(conv, len(conv))
    return _one(action, raw, where)


def _dotted(mapping: dict, prefix: str = ""):
    """A nested mapping given to a repeatable KEY=VALUE flag (``set: {baseline: {warmup: 30}}``) as
    ``baseline.warmup=30`` items; lists join with commas, booleans as true/false."""
    for k, v in mapping.items():
        if isinstance(v, dict):
            yield from _dotted(v, f"{prefix}{k}.")
        else:
            text = ",".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v).lower() if isinstance(v, bool) else v
            yield f"{prefix}{k}={text}"


def _one(action: argparse.Action, raw: Any, where: str) -> Any:
    value = raw
    if action.type is not None and callable(action.type):
        try:
            value = action.type(str(raw).strip())
        except (TypeError, ValueError, argparse.ArgumentTypeError):
            name = getattr(action.type, "__name__", "value")
            raise ValueError(f"{where}={raw!r}: invalid {name} value") from None
    elif not isinstance(raw, str):
        value = str(raw)
    if action.choices is not None and value not in action.choices:
        raise ValueError(f"{where}={raw!r}: expected one of {', '.join(map(str, action.choices))}")
    return value


def apply(parser: argparse.ArgumentParser, env: Mapping[str, str] | None = None, doc: dict | None = None,
          path: tuple[str, ...] = ()) -> None:
    """Set every flag's default from ``env`` (default ``os.environ``) or ``doc`` (a loaded config file)."""
    env = os.environ if env is None else env
    doc = doc or {}
    known: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                known.add(name)
                section = doc.get(name, {})
                if not isinstance(section, dict):
                    raise ValueError(f"config file: `{'.'.join((*path, name))}` must be a mapping of flags")
                apply(sub, env, section, (*path, name))
            continue
        flag = _long(action)
        if flag is None or action.dest in _SKIP:
            continue
        keys = (flag, flag.replace("-", "_"))
        known.update(keys)
        var = env_name(path, flag)
        if var in env:
            action.default = _convert(action, env[var], var)
        elif any(k in doc for k in keys):
            k = next(k for k in keys if k in doc)
            action.default = _convert(action, doc[k], f"config file `{'.'.join((*path, k))}`")
    unknown = set(doc) - known
    if unknown:
        where = ".".join(path) or "top level"
        raise ValueError(f"config file ({where}): unknown key(s) {', '.join(sorted(map(str, unknown)))}")


def finish(ns: argparse.Namespace) -> argparse.Namespace:
    """After parsing: a repeatable flag given on the command line replaces the settings' list."""
    for k, v in vars(ns).items():
        if isinstance(v, _FromSettings):
            setattr(ns, k, list(v[v.n:]) if len(v) > v.n else list(v))
    return ns
