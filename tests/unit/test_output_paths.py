"""Where a command may write, and what it says when it may not: one sentence about the
user's path, before any work, never an errno string naming a temporary file."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from swarmrl.files import (
    check_data_dir,
    check_input_file,
    check_output_dir,
    check_output_path,
    claim_data_dir,
    data_dir_role,
    replacing,
    write_atomically,
)

# Not writable even by root: a pseudo-file system that takes no new files.
UNWRITABLE = Path("/proc")


def test_a_writable_file_name_passes_and_leaves_nothing_behind(tmp_path):
    check_output_path(tmp_path / "out.jsonl")
    (tmp_path / "old.jsonl").write_text("x")
    check_output_path(tmp_path / "old.jsonl")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.jsonl"]


@pytest.mark.parametrize(
    ("name", "says"),
    [
        (".", "is a directory; give a file name to write"),
        ("file/out.jsonl", "{tmp}/file is not a folder"),
        ("file/missing/out.jsonl", "{tmp}/file is not a folder"),
    ],
)
def test_an_output_file_that_cannot_be_written_is_one_sentence(tmp_path, name, says):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=re.escape(says.format(tmp=tmp_path))) as refused:
        check_output_path(tmp_path / name)
    assert "\n" not in str(refused.value)


def test_an_unwritable_folder_and_a_device_are_refused():
    with pytest.raises(ValueError, match=r"^cannot write /proc/out.jsonl: the folder /proc is not"):
        check_output_path(UNWRITABLE / "out.jsonl")
    # Replacing a device node would destroy it.
    with pytest.raises(ValueError, match="/dev/null: it exists and is not a regular file"):
        check_output_path(Path("/dev/null"))


def test_an_output_folder_may_be_new_but_its_nearest_folder_must_take_entries(tmp_path):
    check_output_dir(tmp_path / "a" / "b")
    check_output_dir(tmp_path)
    assert not (tmp_path / "a").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="file exists and is not a folder"):
        check_output_dir(tmp_path / "file")
    with pytest.raises(ValueError, match=f"cannot create .*: {tmp_path}/file is not a folder"):
        check_output_dir(tmp_path / "file" / "sub" / "model")
    with pytest.raises(ValueError, match="the folder /proc is not writable"):
        check_output_dir(UNWRITABLE / "new" / "model")


def test_an_input_file_must_exist_and_not_be_a_folder(tmp_path):
    with pytest.raises(ValueError, match=r"nope.jsonl does not exist$"):
        check_input_file(tmp_path / "nope.jsonl")
    with pytest.raises(ValueError, match=r"is a directory; give a file$"):
        check_input_file(tmp_path)
    with pytest.raises(ValueError, match=r"^/dev/zero is not a regular file$"):
        check_input_file(Path("/dev/zero"))
    (tmp_path / "ok.jsonl").write_text("")
    check_input_file(tmp_path / "ok.jsonl")
    os.mkfifo(tmp_path / "pipe")
    check_input_file(tmp_path / "pipe")


def test_an_output_file_in_missing_folders_is_written_with_its_folders(tmp_path):
    """`tasks generate --out ~/.local/share/swarmrl/orchestrator/tasks.jsonl` on a fresh
    home: the folders are made when the file is written, not when it is checked."""
    target = tmp_path / "share" / "swarmrl" / "out.jsonl"
    check_output_path(target)
    assert list(tmp_path.iterdir()) == []  # a check makes nothing
    write_atomically(target, b"data")
    assert target.read_bytes() == b"data"


def test_a_failed_write_removes_the_folders_it_made_and_only_those(tmp_path):
    (tmp_path / "kept").mkdir()
    target = tmp_path / "kept" / "new" / "deeper" / "out.bin"

    def fail_while_writing() -> None:
        with replacing(target) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("the work failed")

    with pytest.raises(RuntimeError, match="the work failed"):
        fail_while_writing()
    assert [p.name for p in tmp_path.iterdir()] == ["kept"]
    assert list((tmp_path / "kept").iterdir()) == []


def test_a_failed_atomic_write_names_the_users_path_not_the_temporary_one(tmp_path):
    (tmp_path / "file").write_text("x")
    target = tmp_path / "file" / "out.bin"
    with pytest.raises(OSError, match=f"^cannot write {target}: not a directory$"):
        write_atomically(target, b"data")
    folder = tmp_path / "folder"
    folder.mkdir()
    with pytest.raises(OSError, match=f"^cannot write {folder}: is a directory$"):
        write_atomically(folder, b"data")
    assert sorted(tmp_path.iterdir()) == [tmp_path / "file", folder]  # no temporary file left


def test_an_error_about_another_file_keeps_its_own_name(tmp_path):
    other = tmp_path / "other.txt"
    with pytest.raises(FileNotFoundError) as refused, replacing(tmp_path / "out.txt") as tmp:
        tmp.write_text(other.read_text())
    assert refused.value.filename == str(other)
    assert list(tmp_path.iterdir()) == []


def test_a_daemons_data_folder_is_its_own(tmp_path):
    """A node in an orchestrator's folder would share its weight store and logs."""
    orchestrator = tmp_path / "state" / "orchestrator"
    claim_data_dir(orchestrator, "orchestrator")
    claim_data_dir(orchestrator, "orchestrator")  # again: still its own
    assert data_dir_role(orchestrator) == "orchestrator"
    assert data_dir_role(tmp_path / "state") is None
    with pytest.raises(ValueError, match=r"data folder") as refused:
        check_data_dir(orchestrator, "node")
    assert str(refused.value) == (
        f"{orchestrator} is an orchestrator's data folder; give the node a folder of its own"
    )
    with pytest.raises(ValueError, match=r"is an orchestrator's data folder"):
        claim_data_dir(orchestrator, "node")
    assert data_dir_role(orchestrator) == "orchestrator"


def test_a_data_folder_that_is_a_file_is_one_sentence_not_an_errno(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("mine")
    with pytest.raises(ValueError, match=f"^{a_file} exists and is not a folder$"):
        claim_data_dir(a_file, "node")
    with pytest.raises(ValueError, match=f"^cannot create {a_file}/node: {a_file} is not a"):
        claim_data_dir(a_file / "node", "node")
    assert a_file.read_text() == "mine"
