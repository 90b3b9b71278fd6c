"""`paths.write_atomically`: every file another process may read while it is written (results.json,
index.html, the plan's probes, the hardware table, tokenizers, exported configs) is whole or absent."""

from __future__ import annotations

import pytest

from spirelib.paths import write_atomically


def test_a_write_replaces_the_file_whole_and_a_failed_one_leaves_it_as_it_was(tmp_path):
    path = tmp_path / "results.json"
    path.write_text("old")
    assert write_atomically(path, lambda tmp: tmp.write_text("new")) == path and path.read_text() == "new"

    def fails(tmp):
        tmp.write_text("half")
        raise RuntimeError("disk full")
    with pytest.raises(RuntimeError, match="disk full"):
        write_atomically(path, fails)
    assert path.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["results.json"]
