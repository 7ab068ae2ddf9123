"""Datasets of the built-in `train` program, as NumPy arrays (no torch here).

- `cifar10`: the standard python-pickle files (`cifar-10-batches-py/data_batch_1..5`,
  `test_batch`) under the data directory; 50,000 training and 10,000 validation
  images, 3x32x32, ten classes.
- `imdb`: the standard extracted folder (`aclImdb/{train,test}/{pos,neg}/*.txt`);
  25,000 reviews each, two classes. Reviews are split into words by a simple
  tokenizer and each word is hashed into the model's vocabulary, so no vocabulary
  file is needed. The hashed reviews are cached next to the folder.
- `digits`: the UCI handwritten digits bundled with HyperSack (1,797 8x8 images),
  the quick start's dataset.
- `synthetic`: random data of the model's own shapes with a learnable signal, for
  profiling and tests. It is used only when a study asks for it by name: a missing
  real dataset is an error that says where to put it.
"""

from __future__ import annotations

import gzip
import pickle
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hypersack.core.catalog import MODELS
from hypersack.core.errors import InvalidInput
from hypersack.core.train_options import ENV_DATA_DIR, TrainOptions, dataset_for

CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
IMDB_URL = "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz"
CIFAR_MEAN = np.array([0.4914, 0.4822, 0.4465], dtype=np.float32).reshape(1, 3, 1, 1)
CIFAR_STD = np.array([0.2470, 0.2435, 0.2616], dtype=np.float32).reshape(1, 3, 1, 1)
PAD, CLS, SEP = 0, 1, 2  # special token ids; words hash into the ids above them
SPECIAL = 3
_WORD = re.compile(r"[a-z0-9']+|[^\sa-z0-9']")
_SYNTHETIC_POOL = 2048  # distinct synthetic samples; larger splits repeat them


class DatasetMissing(InvalidInput):
    """A real dataset is not where the options say; the message says where to put it."""


@dataclass(frozen=True)
class Split:
    x: np.ndarray  # images uint8 (N,3,32,32), vectors float32 (N,64), token ids int64 (N,L)
    y: np.ndarray  # labels int64 (N,)
    size: int  # samples in the split; synthetic splits repeat a smaller pool

    def batch(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pool = idx % len(self.y)
        return self.x[pool], self.y[pool]


@dataclass(frozen=True)
class Data:
    name: str
    kind: str  # image, text or vector
    classes: int
    train: Split
    val: Split


def load(model: str, opts: TrainOptions, vocab: int = 0) -> Data:
    """The model's dataset as the options ask (`vocab`: token ids for text models)."""
    info = MODELS[model]
    name = dataset_for(model, opts)
    if name == "synthetic":
        return synthetic(info.dataset, info.samples_per_epoch, opts, vocab)
    if name == "cifar10":
        data = cifar10(opts.data_path())
    elif name == "imdb":
        data = imdb(opts.data_path(), opts.seq_len, vocab)
    else:
        data = digits()
    return cap(data, opts)


def cap(data: Data, opts: TrainOptions) -> Data:
    """The first `train_samples` / `val_samples` of each split after a seeded shuffle
    (files list one class after another, so a plain prefix would hold one class)."""

    def take(s: Split, n: int | None, salt: int) -> Split:
        if n is None or n >= s.size:
            return s
        order = np.random.default_rng(opts.seed + salt).permutation(s.size)[:n]
        return Split(s.x[order], s.y[order], n)

    return Data(data.name, data.kind, data.classes, take(data.train, opts.train_samples, 1),
                take(data.val, opts.val_samples, 2))


def _missing(what: str, root: Path, layout: str, url: str) -> DatasetMissing:
    return DatasetMissing(
        f"{what} not found: expected {layout} under {root}. Download {url} and extract it "
        f"there, or point program.options.data_dir (or ${ENV_DATA_DIR} on the node) at "
        "the directory that holds it. To train on random data of the same shape instead, "
        "set program.options.dataset: synthetic.")


def cifar10(root: Path) -> Data:
    base = root / "cifar-10-batches-py"
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    if not all((base / n).is_file() for n in names):
        raise _missing("CIFAR-10", root, "cifar-10-batches-py/data_batch_1..5 and test_batch",
                       CIFAR_URL)

    def read(name: str) -> tuple[np.ndarray, np.ndarray]:
        with open(base / name, "rb") as f:
            # CIFAR-10 ships as pickles; this reads the files the operator put there.
            d = pickle.load(f, encoding="bytes")  # noqa: S301
        x = np.asarray(d[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
        return x, np.asarray(d[b"labels"], dtype=np.int64)

    parts = [read(n) for n in names[:5]]
    train = Split(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                  sum(len(p[1]) for p in parts))
    vx, vy = read("test_batch")
    return Data("cifar10", "image", 10, train, Split(vx, vy, len(vy)))


def words(text: str) -> list[str]:
    """The simple tokenizer: lower case, HTML line breaks dropped, words and punctuation."""
    return _WORD.findall(text.lower().replace("<br />", " "))


def hash_ids(hashes: np.ndarray, vocab: int) -> np.ndarray:
    """Word hashes (0 = padding) to token ids in [SPECIAL, vocab)."""
    ids = SPECIAL + (hashes.astype(np.int64) % (vocab - SPECIAL))
    return np.where(hashes == 0, PAD, ids)


def _hash(word: str) -> int:
    return zlib.crc32(word.encode()) or 1


def imdb(root: Path, seq_len: int, vocab: int) -> Data:
    base = root / "aclImdb"
    dirs = [base / s / c for s in ("train", "test") for c in ("pos", "neg")]
    if not all(d.is_dir() for d in dirs):
        raise _missing("IMDB", root, "aclImdb/train/{pos,neg} and aclImdb/test/{pos,neg}",
                       IMDB_URL)
    splits = []
    for split in ("train", "test"):
        cache = base / f".hypersack-{split}-{seq_len}.npz"
        if cache.is_file():
            with np.load(cache) as z:
                hashes, labels = z["hashes"], z["labels"]
        else:
            rows, labels_l = [], []
            for label, cls in ((1, "pos"), (0, "neg")):
                for path in sorted((base / split / cls).glob("*.txt")):
                    row = [_hash(w) for w in words(path.read_text(errors="replace"))]
                    rows.append(row[:seq_len - 2])  # room for [CLS] and [SEP]
                    labels_l.append(label)
            hashes = np.zeros((len(rows), seq_len - 2), dtype=np.uint32)
            for i, row in enumerate(rows):
                hashes[i, :len(row)] = row
            labels = np.asarray(labels_l, dtype=np.int64)
            try:
                tmp = cache.with_suffix(".tmp.npz")
                np.savez(tmp, hashes=hashes, labels=labels)
                tmp.replace(cache)
            except OSError:
                pass  # a read-only data directory: tokenize again next time
        splits.append(Split(_framed(hash_ids(hashes, vocab)), labels, len(labels)))
    return Data("imdb", "text", 2, splits[0], splits[1])


def _framed(ids: np.ndarray) -> np.ndarray:
    """[CLS] words [SEP] then padding, as int64 token ids."""
    n, width = ids.shape
    out = np.zeros((n, width + 2), dtype=np.int64)
    out[:, 0] = CLS
    out[:, 1:-1] = ids
    lengths = (ids != PAD).sum(axis=1)
    out[np.arange(n), lengths + 1] = SEP
    return out


def digits() -> Data:
    path = Path(__file__).parent / "data" / "digits.csv.gz"
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    x, y = table[:, :64] / 16.0, table[:, 64].astype(np.int64)
    order = np.random.default_rng(0).permutation(len(y))  # a fixed split for every trial
    train, val = order[:1437], order[1437:]
    return Data("digits", "vector", 10, Split(x[train], y[train], len(train)),
                Split(x[val], y[val], len(val)))


def synthetic(like: str, full: int, opts: TrainOptions, vocab: int) -> Data:
    """Random samples of `like`'s shapes; the label is a function of the input, so a
    model can learn it. Sizes are the real dataset's (`full` training samples) unless
    the options cap them."""
    rng = np.random.default_rng(opts.seed + 12345)
    n_train = opts.train_samples or full
    n_val = opts.val_samples or max(1, n_train // 5)
    x: np.ndarray
    if like == "cifar10":
        classes = 10
        y = rng.integers(0, classes, _SYNTHETIC_POOL)
        means = rng.integers(40, 216, (classes, 3, 1, 1))
        noise = rng.normal(0, 50, (_SYNTHETIC_POOL, 3, 32, 32))
        x = np.clip(means[y] + noise, 0, 255).astype(np.uint8)
        kind = "image"
    elif like == "imdb":
        classes = 2
        if vocab <= SPECIAL + 2:
            raise InvalidInput("synthetic text needs the model's vocabulary size")
        y = rng.integers(0, classes, _SYNTHETIC_POOL)
        x = rng.integers(SPECIAL, vocab, (_SYNTHETIC_POOL, opts.seq_len))
        lengths = rng.integers(opts.seq_len // 4, opts.seq_len - 1, _SYNTHETIC_POOL)
        marker = np.where(y == 1, SPECIAL, SPECIAL + 1)  # one marker word per class
        for i in range(_SYNTHETIC_POOL):
            x[i, rng.integers(1, lengths[i], 8)] = marker[i]
            x[i, lengths[i]:] = PAD
            x[i, lengths[i]] = SEP
        x[:, 0] = CLS
        x = x.astype(np.int64)
        kind = "text"
    else:
        raise InvalidInput(f"no synthetic version of {like}")
    half = _SYNTHETIC_POOL // 2  # disjoint pools: validation is not training data
    return Data(f"synthetic-{like}", kind, classes,
                Split(x[:half], y[:half].astype(np.int64), n_train),
                Split(x[half:], y[half:].astype(np.int64), n_val))
