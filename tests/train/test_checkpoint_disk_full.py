"""A checkpoint written to a full disk (a real tmpfs), synchronously or in the background: one
line naming the checkpoint and the last complete one, which stays what `latest` names."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tokenmill.errors import DiskFullError
from tokenmill.train.checkpoint import AsyncCheckpointer, save_checkpoint
from tokenmill.train.checkpoint_files import list_checkpoints, read_meta

STATE_FLOATS = 256 * 1024  # 1 MiB of float32


def state() -> dict:
    return {"weight": torch.arange(STATE_FLOATS, dtype=torch.float32)}


@pytest.mark.parametrize("background", [False, True], ids=["sync", "async"])
def test_a_checkpoint_on_a_full_disk_names_the_last_complete_one(small_disk: Path, fill_disk, background: bool) -> None:
    run = small_disk / "run"
    save_checkpoint(run, 2, state(), {"note": "complete"})
    filler = fill_disk(small_disk, leave=256 * 1024)  # a quarter of a checkpoint
    with pytest.raises(DiskFullError) as raised:
        if background:
            writer = AsyncCheckpointer()
            try:
                writer.save(run, 4, state(), {})
                writer.wait()
            finally:
                writer.close()
        else:
            save_checkpoint(run, 4, state(), {})
    assert str(raised.value) == (
        f"checkpoint step_4: no space left on the device for {run / 'checkpoints'};"
        f" the last complete checkpoint {run / 'checkpoints' / 'step_2'} is kept; free space and rerun with --resume"
    )
    assert list_checkpoints(run) == [run / "checkpoints" / "step_2"]
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_2"
    assert read_meta(run / "checkpoints" / "step_2")["note"] == "complete"  # its files check out

    filler.unlink()
    save_checkpoint(run, 4, state(), {})  # with space again, the same save goes through
    assert [p.name for p in list_checkpoints(run)] == ["step_2", "step_4"]
