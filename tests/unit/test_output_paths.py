"""Where a command may write, and what it says when it may not: one sentence about the
user's path, before any work, never an errno string naming a temporary file."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from swarmrl.files import (
    check_input_file,
    check_output_dir,
    check_output_path,
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
        ("missing/out.jsonl", "the folder {tmp}/missing does not exist"),
        ("file/out.jsonl", "{tmp}/file is not a folder"),
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


def test_a_failed_atomic_write_names_the_users_path_not_the_temporary_one(tmp_path):
    target = tmp_path / "missing" / "out.bin"
    with pytest.raises(OSError, match=f"^cannot write {target}: no such file or directory$"):
        write_atomically(target, b"data")
    folder = tmp_path / "folder"
    folder.mkdir()
    with pytest.raises(OSError, match=f"^cannot write {folder}: is a directory$"):
        write_atomically(folder, b"data")
    assert list(tmp_path.iterdir()) == [folder]  # no temporary file left


def test_an_error_about_another_file_keeps_its_own_name(tmp_path):
    other = tmp_path / "other.txt"
    with pytest.raises(FileNotFoundError) as refused, replacing(tmp_path / "out.txt") as tmp:
        tmp.write_text(other.read_text())
    assert refused.value.filename == str(other)
    assert list(tmp_path.iterdir()) == []
