"""The arguments a phase of scripts/gpu_run.sh passes to its bench script, for tests that
check the phases name only options the scripts take (a typo there costs a device call)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def gpu_run_args(phase: str, script: str) -> list[str]:
    """The arguments that scripts/gpu_run.sh passes to `script` in `phase`, with each
    ${VAR:-default} at its default and $OUT at a placeholder."""
    text = (ROOT / "scripts" / "gpu_run.sh").read_text()
    [line] = [ln for ln in text.splitlines() if ln.strip().startswith(f"{phase})")]
    command = line.split(script, 1)[1].split("2>&1")[0]
    command = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", command).replace("$OUT", "/tmp/out")
    return shlex.split(command)
