"""The arguments a phase of scripts/gpu_run.sh passes to its bench script, for tests that
check the phases name only options the scripts take (a typo there costs a device call)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def gpu_run_args(phase: str, script: str, env: dict[str, str] | None = None) -> list[str]:
    """The arguments that scripts/gpu_run.sh passes to `script` in `phase`, with each
    ${VAR:-default} or ${VAR-default} at `env`'s value or its default, each ${VAR:+words}
    at the words (with $VAR expanded) where `env` sets VAR and at nothing elsewhere, and
    $OUT at a placeholder."""
    env = env or {}
    text = (ROOT / "scripts" / "gpu_run.sh").read_text()
    [line] = [ln for ln in text.splitlines() if ln.strip().startswith(f"{phase})")]
    command = line.split(script, 1)[1].split("2>&1")[0]

    def alternate(m: re.Match) -> str:
        name, words = m.group(1), m.group(2)
        return words.replace(f"${name}", env[name]) if name in env else ""

    command = re.sub(r"\$\{(\w+):\+([^}]*)\}", alternate, command)

    def default(m: re.Match) -> str:
        name, colon, value = m.groups()
        # as bash: ${VAR:-default} takes the default where VAR is empty, ${VAR-default} not
        return value if name not in env or (colon and not env[name]) else env[name]

    command = re.sub(r"\$\{(\w+)(:?)-([^}]*)\}", default, command)
    return shlex.split(command.replace("$OUT", "/tmp/out"))
