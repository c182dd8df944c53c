"""The import graph keeps the layers apart (an ``ast`` walk over the source; no module is imported).

Layers, in data-flow order (a module may import its own layer and the ones listed for it, nothing else):

* ``dynamiccl.contracts`` — what the stages agree on; imports nothing first-party.
* the plugins' Python side (``dynamiccl.nccl_profiler_plugin``, ``dynamiccl.nccl_tuner_plugin``: library paths, the tuner file
  format, the agreement hook) and ``dynamiccl.nccl_model`` (NCCL's topology and cost model) — libraries every
  stage may use; they import only the contracts.
* ``dynamiccl.loop`` (window → detector → retuner in one order; duck-typed) — used by the retuner service, the
  views, the harness and the CLI; it imports only the contracts.
* the stages: ``dynamiccl.collector`` → ``.detector`` → ``.retuner`` → the views (``.report``, ``.dashboards``); a stage imports
  the ones before it, never one after it.
* the harness (``dynamiccl.harness``: the simulator, the test bed, the evaluations, simulated feeds and test helpers) may import every product layer; no product module imports it.
* the CLI (``dynamiccl.cli`` and the role modules it registers) may import everything; nothing imports
  ``dynamiccl.cli`` (``python -m dynamiccl`` excepted) and no product or harness module imports a CLI module.

Every import counts, including the lazy ones inside functions: a lazy import still makes the importing
package need the imported one installed and still ties their releases together.
"""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("dynamiccl",)

# module-name prefixes -> layer; the longest matching prefix wins
LAYER_OF = {
    "dynamiccl.contracts": "contracts",
    "dynamiccl.nccl_profiler_plugin": "plugins", "dynamiccl.nccl_tuner_plugin": "plugins",
    "dynamiccl.nccl_model": "nccl_model",
    "dynamiccl": "meta",                    # dynamiccl/__init__.py: the version
    "dynamiccl.collector": "collector", "dynamiccl.detector": "detector", "dynamiccl.retuner": "retuner",
    "dynamiccl.report": "views", "dynamiccl.dashboards": "views",
    "dynamiccl.harness": "harness",
    # node partials and the bus sit between collector and detector; the central merger runs the detector
    "dynamiccl.scaleout": "scaleout", "dynamiccl.scaleout.central": "scaleout_central", "dynamiccl.scaleout.combiner": "scaleout_central",
    "dynamiccl.scaleout.change_bus": "scaleout_central", "dynamiccl.scaleout.retuner_feed": "scaleout_central",
    "dynamiccl.scaleout.cli": "cli", "dynamiccl.scaleout.retuning": "cli",   # a retuner per job on the central tier
    "dynamiccl.loop": "loop",               # window -> detector -> retuner; duck-typed, imports no stage
    "dynamiccl.retuner.learned.train": "harness",   # trains in the simulator; inference stays product
    "dynamiccl.retuner.learned.cli": "cli",
    "dynamiccl.validate": "harness",        # validate-nccl drives a real NCCL job and checks the product
    "dynamiccl.cli": "cli", "dynamiccl.__main__": "cli", "dynamiccl.demo": "cli", "dynamiccl.stack": "cli",
    "dynamiccl.stack_config": "cli", "dynamiccl.stack_services": "cli",
    "dynamiccl.plugins": "cli", "dynamiccl.stack_cli": "cli", "dynamiccl.settings": "cli",
    "dynamiccl.logfmt": "cli", "dynamiccl.rules": "cli", "dynamiccl.kube": "cli", "dynamiccl.webhook": "cli",
    **{f"dynamiccl.{p}.cli": "cli" for p in ("collector", "detector", "retuner", "report", "dashboards",
                                             "nccl_profiler_plugin", "nccl_tuner_plugin", "harness.testbed",
                                             "harness.simulator")},
}
PRODUCT = ("contracts", "plugins", "nccl_model", "meta", "loop", "collector", "scaleout", "detector", "scaleout_central",
           "retuner", "views")
ALLOWED = {
    "contracts": {"contracts"},
    "plugins": {"contracts", "plugins"},
    "nccl_model": {"contracts", "nccl_model"},
    "meta": {"meta", "contracts"},
    "loop": {"contracts", "loop"},
    "collector": {"contracts", "plugins", "collector"},
    "scaleout": {"contracts", "plugins", "collector", "scaleout"},
    "detector": {"contracts", "plugins", "collector", "detector"},
    "scaleout_central": {"contracts", "plugins", "loop", "collector", "scaleout", "detector", "scaleout_central"},
    "retuner": {"contracts", "plugins", "nccl_model", "loop", "collector", "detector", "retuner"},
    "views": {"contracts", "plugins", "nccl_model", "loop", "collector", "detector", "retuner", "views"},
    "harness": set(PRODUCT) | {"harness"},
    "cli": set(PRODUCT) | {"harness", "cli"},
}



def layer(module: str) -> str | None:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        hit = LAYER_OF.get(".".join(parts[:n]))
        if hit is not None:
            return hit
    return None


def modules(root: Path = REPO) -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (root / pkg).rglob("*.py"):
            rel = path.relative_to(root).with_suffix("")
            if "test" in rel.parts or "tests" in rel.parts or rel.name == "conftest":
                continue
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            out[".".join(parts)] = path
    return out


def imports(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """First-party modules ``module`` imports, resolved to the deepest module that exists."""
    is_pkg = path.name == "__init__.py"
    package = module if is_pkg else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            names.update(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names)
    out = set()
    for name in names:
        if name.split(".")[0] not in PACKAGES:
            continue
        while name not in known and "." in name:
            name = name.rpartition(".")[0]
        out.add(name)
    return out


def violations(root: Path = REPO) -> set[tuple[str, str]]:
    known = modules(root)
    bad = set()
    for mod, path in known.items():
        src = layer(mod)
        assert src is not None, f"{mod}: no layer (add it to LAYER_OF)"
        for dep in imports(mod, path, known):
            dst = layer(dep)
            if dst not in ALLOWED[src] or (dep == "dynamiccl.cli" and mod != "dynamiccl.__main__"):
                bad.add((mod, dep))
    return bad


def test_the_walker_sees_imports_lazy_and_relative():
    known = modules()
    deps = imports("dynamiccl.retuner.agent", known["dynamiccl.retuner.agent"], known)
    assert "dynamiccl.detector.events" in deps            # a lazy import inside a method
    state = imports("dynamiccl.retuner.state", known["dynamiccl.retuner.state"], known)
    assert "dynamiccl.contracts.collectives" in state and "dynamiccl.nccl_tuner_plugin.config" in state
    assert layer("dynamiccl.harness.retuner_eval.runner") == "harness" and layer("dynamiccl.retuner.agent") == "retuner"
    assert layer("dynamiccl.collector.cli") == "cli" and layer("dynamiccl.contracts.lines") == "contracts"


def test_contracts_import_nothing_first_party_but_themselves():
    known = modules()
    for mod, path in known.items():
        if layer(mod) == "contracts":
            assert {layer(d) for d in imports(mod, path, known)} <= {"contracts"}, mod


def test_no_stage_imports_downstream_the_harness_or_the_cli():
    bad = sorted(violations())
    assert not bad, "layering violations (inject the dependency from the CLI or the harness instead):\n" + "\n".join(
        f"  {a} imports {b} ({layer(a)} -> {layer(b)})" for a, b in bad)


def test_the_two_violations_fixed_here_would_be_caught(tmp_path):
    """A stage reaching into the views (the detector's Grafana push) and a CLI-layer module importing the CLI
    (the stack probing the parser) both fail the walk; so does a product module importing the harness."""
    files = {
        "dynamiccl/__init__.py": "",
        "dynamiccl/cli.py": "",
        "dynamiccl/stack.py": "def f():\n    from dynamiccl.cli import build_parser\n",
        "dynamiccl/detector/__init__.py": "",
        "dynamiccl/detector/runner.py": "from ..dashboards.grafana_push import connect\n",
        "dynamiccl/dashboards/__init__.py": "",
        "dynamiccl/dashboards/grafana_push.py": "",
        "dynamiccl/collector/__init__.py": "import dynamiccl.harness.simulator\n",
        "dynamiccl/harness/__init__.py": "",
        "dynamiccl/harness/simulator/__init__.py": "import dynamiccl.collector\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert violations(tmp_path) == {("dynamiccl.stack", "dynamiccl.cli"),
                                    ("dynamiccl.detector.runner", "dynamiccl.dashboards.grafana_push"),
                                    ("dynamiccl.collector", "dynamiccl.harness.simulator")}
