"""The README's settings table and limits match the C plugin's defaults."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "dynamiccl" / "nccl_tuner_plugin" / "README.md").read_text()
INTERNAL = (REPO / "dynamiccl" / "nccl_tuner_plugin" / "src" / "internal.h").read_text()
CONTROL = "".join((REPO / "dynamiccl" / "nccl_tuner_plugin" / "src" / f).read_text() for f in ("control.c", "reload.c"))


def _define(name: str) -> str:
    m = re.search(rf"^#define {name} (.+?)(?:\s*/\*.*)?$", INTERNAL, re.M)
    assert m, name
    return m.group(1).strip()


def _row(var: str) -> list[str]:
    line = next(ln for ln in README.splitlines() if ln.startswith(f"| `{var}`"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_settings_table_matches_the_code():
    assert _row("DYNAMICCL_TUNER_CONFIG")[1] == "`$XDG_RUNTIME_DIR/dynamiccl/tuner[-JOB].conf`"
    assert 'dynamiccl_default_path(dct_g.path, sizeof dct_g.path, "tuner", "conf")' in CONTROL
    assert _row("DYNAMICCL_TUNER_POLL_MS")[1] == f"`{_define('DCT_DEFAULT_POLL_MS')}`"
    assert _row("DYNAMICCL_TUNER_APPLY")[1] == "`agree`" and ".mode = DCT_MODE_AGREE" in CONTROL
    for mode in ("agree", "epoch", "immediate"):
        assert f'"{mode}"' in CONTROL and f"`{mode}`" in _row("DYNAMICCL_TUNER_APPLY")[2]


def test_limits_and_slots():
    assert f"Limits: {_define('DCT_MAX_RULES')} rules per version, {_define('DCT_MAX_VERSIONS')} versions" in README
    assert _define("DCT_NSLOTS") == "(3 * DCT_MAX_VERSIONS + 2)" and "26 preallocated slots" in README
    assert "50 ms" in README and _define("DCT_RACY_NS") == "50000000ull"


def test_readme_names_the_hook_and_the_exports():
    for s in ("dynamiccl.nccl_tuner_plugin.sync.agree()", "ncclTunerPlugin_v6", "`_v5`", "`_v4`", "dynamiccl plugins --tuner",
              "version 42 at T"):
        assert s in README, s
