"""The README's configuration table states the same defaults as the C source (no drift)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

PLUGIN_DIR = Path(__file__).resolve().parents[2] / "dynamiccl" / "nccl_profiler_plugin"
NO_C_DEFAULT = {"DYNAMICCL_JOB_ID", "DYNAMICCL_HOST",  # fallback chains, documented in words
                "DYNAMICCL_TOKEN_FILE", "DYNAMICCL_TOKEN",  # secrets: no default
                "DYNAMICCL_PROFILER_CHAIN",  # a path: no default
                "DYNAMICCL_COLLECTOR",  # the per-user socket, computed at init (dynamiccl_paths.h)
                "DYNAMICCL_CLOCK"}  # unset: the clock chosen at init from the host's TSC (clock.h)


def readme_defaults() -> dict[str, str]:
    text = (PLUGIN_DIR / "README.md").read_text()
    section = text.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(DYNAMICCL_[A-Z_]+)` \| ([^|]+) \|", section, flags=re.M)
    return {name: cell.strip().strip("`") for name, cell in rows}


def c_defaults(tmp_path, names) -> dict[str, str]:
    src = tmp_path / "defaults.c"
    lines = ['#define _GNU_SOURCE', '#include <stdio.h>', '#include "internal.h"', "int main(void) {"]
    for n in names:
        macro = "DCCL_DEFAULT_" + n.removeprefix("DYNAMICCL_")
        fmt = "%s" if n == "DYNAMICCL_COLLECTOR" else "%llu"
        cast = "" if n == "DYNAMICCL_COLLECTOR" else "(unsigned long long)"
        lines.append(f'  printf("{n}={fmt}\\n", {cast}{macro});')
    lines += ["  return 0;", "}"]
    src.write_text("\n".join(lines))
    exe = tmp_path / "defaults"
    subprocess.run(["cc", "-std=c11", "-I", str(PLUGIN_DIR / "include"), "-I", str(PLUGIN_DIR / "src"), str(src),
                    "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines())


def test_readme_env_table_matches_c_defaults(tmp_path):
    documented = readme_defaults()
    source = "".join(f.read_text() for f in sorted((PLUGIN_DIR / "src").glob("*.c")))
    read_by_plugin = set(re.findall(r'"(DYNAMICCL_[A-Z_]+)"', source))
    assert read_by_plugin | NO_C_DEFAULT == set(documented), "README table and config.c disagree on variables"
    compiled = c_defaults(tmp_path, sorted(read_by_plugin - NO_C_DEFAULT))
    for name, value in compiled.items():
        assert documented[name] == value, (name, documented[name], value)
