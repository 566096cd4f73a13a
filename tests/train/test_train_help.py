"""`tokenmill train --help` says where a config comes from (option help: test_command_line)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_train_help_names_the_bundled_configs(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(Path(sys.executable).with_name("tokenmill")), "train", "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0
    assert "bundled one (tiny)" in " ".join(done.stdout.split())
