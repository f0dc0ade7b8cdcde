#!/usr/bin/env python3
"""Bootstrap and run streamscribe with nothing but python3.

    python3 tasks.py serve [server args...]   start the service on the embedded default model
    python3 tasks.py test [pytest args...]    run the test suite

The first call creates .venv and installs the project with its test extra (about two minutes);
later calls reinstall only when pyproject.toml changed.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PY = VENV / "bin" / "python"


def ensure_env() -> None:
    stamp = VENV / ".installed"
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text() == digest and PY.exists():
        return
    if not PY.exists():
        print("creating .venv ...", file=sys.stderr)
        venv.EnvBuilder(with_pip=True).create(VENV)
    print("installing streamscribe and its test extra into .venv ...", file=sys.stderr)
    subprocess.check_call([str(PY), "-m", "pip", "install", "-q", "--upgrade", "pip"])
    subprocess.check_call([str(PY), "-m", "pip", "install", "-q", "-e", f"{ROOT}[test]"])
    stamp.write_text(digest)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("serve", "test"):
        print(__doc__, file=sys.stderr)
        return 2
    ensure_env()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if argv[0] == "test":
        cmd = [str(PY), "-m", "pytest", *argv[1:]]
    else:
        cmd = [str(PY), "-m", "stream_server", "--model", "default", *argv[1:]]
    return subprocess.call(cmd, cwd=ROOT, env=env)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
