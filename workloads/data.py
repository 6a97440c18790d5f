"""Real data sets installed by packages (no downloads): Fashion-MNIST, scikit-learn's digits,
and a Python-source LM corpus.

Every arm must see the same examples in the same order, so splits, shards
and batch orders are pure functions of (seed, rank, world_size, step) and
never depend on process start order or the global RNG.
"""
from __future__ import annotations

import gzip
import hashlib
import os
import sysconfig
import zipfile
from dataclasses import dataclass

import numpy as np
import torch

#: Fraction of the digits kept for testing (stratified, fixed seed below).
DIGITS_TEST_FRACTION = 0.2
#: The split seed is fixed, not the run seed: the test set must be identical
#: across runs and arms so accuracies are comparable.
DIGITS_SPLIT_SEED = 1234


@dataclass
class ArrayDataset:
    """Inputs and targets as tensors; small enough to keep in memory."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return int(self.x.shape[0])


def load_digits_split() -> tuple[ArrayDataset, ArrayDataset]:
    """The 1,797 8x8 digits, scaled to [0, 1], split 80/20 stratified by class.

    scikit-learn makes the split once; it is kept as plain arrays in the user's
    cache (`digits_cache_path`) and read from there after. Why: importing
    scikit-learn (and SciPy with it) cost every worker 0.9 s of CPU, and a
    unit starts three workers and a server at once on two cores, so a smoke
    unit's workers began training 6 s after the unit began. The file's name
    carries scikit-learn's version and the split's fraction and seed: another
    version or split makes a file of its own. A cache that cannot be read or
    written is made again, or not kept.
    """
    path = digits_cache_path()
    try:
        with np.load(path) as z:
            x_tr, x_te, y_tr, y_te = (z[k] for k in _DIGITS_ARRAYS)
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile):
        x_tr, x_te, y_tr, y_te = _split_digits()
        _keep(path, dict(zip(_DIGITS_ARRAYS, (x_tr, x_te, y_tr, y_te), strict=True)))
    return (ArrayDataset(torch.from_numpy(x_tr), torch.from_numpy(y_tr)),
            ArrayDataset(torch.from_numpy(x_te), torch.from_numpy(y_te)))


_DIGITS_ARRAYS = ("x_tr", "x_te", "y_tr", "y_te")


def digits_cache_path() -> str:
    """Where the digits' split is kept: $XDG_CACHE_HOME (or ~/.cache)/dblp-testbed/."""
    from importlib.metadata import version
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    name = (f"digits-sklearn{version('scikit-learn')}-test{DIGITS_TEST_FRACTION}"
            f"-seed{DIGITS_SPLIT_SEED}.npz")
    return os.path.join(root, "dblp-testbed", name)


def _split_digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    x = (bunch.images.astype(np.float32) / 16.0)[:, None, :, :]
    y = bunch.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, y, test_size=DIGITS_TEST_FRACTION, random_state=DIGITS_SPLIT_SEED, stratify=y)
    return x_tr, x_te, y_tr, y_te


def _keep(path: str, arrays: dict) -> None:
    """Write ``arrays`` to ``path`` whole or not at all (workers that start together race)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


# --------------------------------------------------------------------------
# Fashion-MNIST: Debian's dataset-fashion-mnist package (setup.sh installs it).

#: Where Debian's package puts the four files (Zalando's IDX format, gzip'd).
FMNIST_DIR = "/usr/share/datasets/fashion-mnist"
#: Each file's SHA-256, as Debian's package 0.0~git20200523.55506a9-1 ships it (the same
#: bytes as Zalando's release): the data are fixed, and a machine whose files differ is
#: refused by name rather than trained on something else.
FMNIST_FILES = {
    "train-images-idx3-ubyte.gz": "b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7",
    "train-labels-idx1-ubyte.gz": "0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056",
    "t10k-images-idx3-ubyte.gz": "cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa",
    "t10k-labels-idx1-ubyte.gz": "8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05",
}
#: Training examples kept, 10 % of each class (a fixed draw, `FMNIST_SPLIT_SEED`). Why a
#: subset: the phase detector checks once per epoch, as the paper does, and the paper's
#: regime has DBLP relaxed for most of training, so a run must span tens of epochs on two
#: cores and an emulated network. 6,000 examples are 20 epochs of 100 rounds at three
#: workers of 32 (`testbed.config.presets`); the whole 10,000-example test set scores
#: every evaluation, one example 0.01 points.
FMNIST_TRAIN_EXAMPLES = 6000
FMNIST_SPLIT_SEED = 2605


class DataError(RuntimeError):
    """A data set is missing or not the one the project pins: one line naming the fix."""


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fmnist_digest() -> str:
    """One SHA-256 for the data set: of its four files' names and digests, in order.

    What a run records (`workloads.tasks.Task.data_sha256`), so a summary and
    `compare` can say which data made a figure.
    """
    text = "".join(f"{name} {digest}\n" for name, digest in sorted(FMNIST_FILES.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def bytes_digest(*arrays: np.ndarray) -> str:
    """SHA-256 of the arrays' bytes in order: the digest of data read, not of files pinned.

    The corpus and the digits are what this machine provides (its interpreter's
    sources, its scikit-learn's bundled set), so no digest can be pinned in
    advance; hashing what was read still lets a summary and `compare` say when
    two runs trained on different bytes (another Python version, another
    scikit-learn).
    """
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def _read_idx(path: str) -> np.ndarray:
    """An IDX file (big-endian magic: 0x0000, type 0x08 = uint8, ndim; then the dims)."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    if raw[:3] != b"\x00\x00\x08" or not 1 <= ndim <= 3:
        raise DataError(f"{path}: not an IDX file of unsigned bytes")
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_fmnist_split(root: str = FMNIST_DIR) -> tuple[ArrayDataset, ArrayDataset]:
    """Fashion-MNIST's fixed training subset and its whole test set, scaled to [0, 1].

    Every file is checked against `FMNIST_FILES` before it is read: a missing
    package or other bytes stop the worker with one line naming the fix.
    """
    for name, digest in FMNIST_FILES.items():
        path = os.path.join(root, name)
        if not os.path.isfile(path):
            raise DataError(f"{path} not found: install Debian's dataset-fashion-mnist "
                            "(./setup.sh does)")
        got = _sha256(path)
        if got != digest:
            raise DataError(f"{path}: SHA-256 {got}, not the pinned {digest} "
                            "(another release of dataset-fashion-mnist?)")
    x_tr = _read_idx(os.path.join(root, "train-images-idx3-ubyte.gz"))
    y_tr = _read_idx(os.path.join(root, "train-labels-idx1-ubyte.gz")).astype(np.int64)
    x_te = _read_idx(os.path.join(root, "t10k-images-idx3-ubyte.gz"))
    y_te = _read_idx(os.path.join(root, "t10k-labels-idx1-ubyte.gz")).astype(np.int64)
    keep = _per_class(y_tr, FMNIST_TRAIN_EXAMPLES, FMNIST_SPLIT_SEED)

    def images(x):
        return torch.from_numpy((x.astype(np.float32) / 255.0)[:, None, :, :])
    return (ArrayDataset(images(x_tr[keep]), torch.from_numpy(y_tr[keep])),
            ArrayDataset(images(x_te), torch.from_numpy(y_te)))


def _per_class(y: np.ndarray, n: int, seed: int) -> np.ndarray:
    """``n`` indices of ``y``, the same number of each class, drawn once with ``seed``, sorted."""
    classes = np.unique(y)
    rng = np.random.default_rng(seed)
    picks = [rng.choice(np.flatnonzero(y == c), n // len(classes), replace=False) for c in classes]
    return np.sort(np.concatenate(picks))


def shard_indices(n: int, rank: int, world_size: int, seed: int) -> np.ndarray:
    """Disjoint near-equal shard of ``range(n)`` for ``rank`` (seeded shuffle, then stride)."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    perm = np.random.default_rng(seed).permutation(n)
    return np.sort(perm[rank::world_size])


class ShardBatches:
    """Deterministic minibatches from one worker's shard, reshuffled every epoch.

    ``batch(step)`` is a pure function of the step, so a restarted or
    differently scheduled worker draws exactly the same examples.
    """

    def __init__(self, data: ArrayDataset, rank: int, world_size: int, batch_size: int, seed: int):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.data = data
        self.idx = shard_indices(len(data), rank, world_size, seed)
        if len(self.idx) < batch_size:
            raise ValueError(f"batch_size {batch_size} exceeds the shard size {len(self.idx)} "
                             f"(rank {rank} of {world_size})")
        self.batch_size = batch_size
        self.per_epoch = len(self.idx) // batch_size
        self.seed = seed
        self.rank = rank
        self._epoch = -1
        self._order = self.idx

    def epoch_of(self, step: int) -> int:
        return step // self.per_epoch

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        epoch = self.epoch_of(step)
        if epoch != self._epoch:
            rng = np.random.default_rng([self.seed, self.rank, epoch])
            self._order = self.idx[rng.permutation(len(self.idx))]
            self._epoch = epoch
        k = step % self.per_epoch
        sel = torch.from_numpy(self._order[k * self.batch_size:(k + 1) * self.batch_size])
        return self.data.x[sel], self.data.y[sel]


# --------------------------------------------------------------------------
# Language-modelling corpus: the Python standard library's own sources.

#: Bytes of stdlib source used; bounded so loading stays well under a second.
LM_CORPUS_BYTES = 2_000_000
LM_TEST_FRACTION = 0.1
#: Held-out bytes every LM evaluation scores (evenly spaced windows of the
#: test split): 20,480 bytes put one byte at 0.005 points of next-byte
#: accuracy, ten times finer than the half point the paper's accuracy claim
#: is stated to.
LM_EVAL_BYTES = 20_480


def stdlib_source_files() -> list[str]:
    """Sorted top-level .py files of this interpreter's standard library."""
    root = sysconfig.get_paths()["stdlib"]
    files = sorted(os.path.join(root, f) for f in os.listdir(root) if f.endswith(".py"))
    if not files:
        raise FileNotFoundError(f"no .py files in the standard library directory {root}")
    return files


def load_python_corpus(max_bytes: int = LM_CORPUS_BYTES) -> tuple[torch.Tensor, torch.Tensor]:
    """Byte-level token streams (vocabulary 256): train first 90 %, test last 10 %.

    Files are concatenated in sorted order, so the corpus is the same on
    every host of one machine (they share the interpreter).
    """
    if max_bytes < 10_000:
        raise ValueError(f"max_bytes must be >= 10000, got {max_bytes}")
    chunks, total = [], 0
    for path in stdlib_source_files():
        with open(path, "rb") as fh:
            blob = fh.read()
        chunks.append(blob)
        total += len(blob)
        if total >= max_bytes:
            break
    data = np.frombuffer(b"\n".join(chunks)[:max_bytes], dtype=np.uint8).astype(np.int64)
    cut = int(len(data) * (1 - LM_TEST_FRACTION))
    return torch.from_numpy(data[:cut].copy()), torch.from_numpy(data[cut:].copy())


class TokenWindows:
    """Random fixed-length windows from one worker's contiguous slice of a token stream."""

    def __init__(self, tokens: torch.Tensor, rank: int, world_size: int, batch_size: int,
                 seq_len: int, seed: int, steps_per_epoch: int = 100):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
        size = len(tokens) // world_size
        self.tokens = tokens[rank * size:(rank + 1) * size]
        if len(self.tokens) <= seq_len + 1:
            raise ValueError(f"seq_len {seq_len} too long for a shard of {len(self.tokens)} tokens")
        self.batch_size, self.seq_len, self.seed, self.rank = batch_size, seq_len, seed, rank
        self.per_epoch = steps_per_epoch

    def epoch_of(self, step: int) -> int:
        return step // self.per_epoch

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        rng = np.random.default_rng([self.seed, self.rank, step])
        starts = rng.integers(0, len(self.tokens) - self.seq_len - 1, size=self.batch_size)
        win = torch.stack([self.tokens[s:s + self.seq_len + 1] for s in starts.tolist()])
        return win[:, :-1], win[:, 1:]


def lm_eval_windows(tokens: torch.Tensor, seq_len: int,
                    n_windows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Evenly spaced, non-random test windows so every evaluation sees the same text.

    By default enough windows to score `LM_EVAL_BYTES` next-byte predictions.
    """
    if n_windows is None:
        n_windows = -(-LM_EVAL_BYTES // seq_len)
    step = max(1, (len(tokens) - seq_len - 1) // n_windows)
    starts = range(0, len(tokens) - seq_len - 1, step)
    win = torch.stack([tokens[s:s + seq_len + 1] for s in list(starts)[:n_windows]])
    return win[:, :-1], win[:, 1:]
