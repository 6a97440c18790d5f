"""A task binds a model spec to its data: per-worker batches, the loss and the evaluation."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from . import data
from .models import ModelSpec


@dataclass
class Task:
    """What a worker needs to train one model on its shard and to evaluate it."""

    batches: object                 # ShardBatches | TokenWindows: .batch(step), .epoch_of(step)
    loss_fn: Callable
    evaluate: Callable              # model -> (accuracy, loss)
    #: What the data are: the SHA-256 a worker logs at its start. Fashion-MNIST's is the
    #: pinned digest of its files; the corpus's and the digits' the digest of the bytes
    #: read (`data.bytes_digest`), which depend on the machine's interpreter or library.
    data_sha256: str | None = None


def _classification_loss(out, y):
    return F.cross_entropy(out, y)


def _lm_loss(out, y):
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


@torch.no_grad()
def _eval_on(model, x, y, loss_fn, batch: int = 512):
    was_training = model.training
    model.eval()
    try:
        correct, loss_sum, n = 0, 0.0, 0
        for i in range(0, len(x), batch):
            out = model(x[i:i + batch])
            yy = y[i:i + batch]
            loss_sum += float(loss_fn(out, yy)) * yy.numel()
            correct += int((out.argmax(-1) == yy).sum())
            n += yy.numel()
        return correct / n, loss_sum / n
    finally:
        model.train(was_training)


# Loading the data once per process: the sweep builds many tasks.
_CACHE: dict[str, tuple] = {}
_DIGESTS: dict[str, str] = {}


def _digest(name: str, compute: Callable[[], str]) -> str:
    """A data set's digest, computed once per process like its data."""
    if name not in _DIGESTS:
        _DIGESTS[name] = compute()
    return _DIGESTS[name]


def make_task(spec: ModelSpec, rank: int, world_size: int, batch_size: int, seed: int) -> Task:
    if spec.task == "digits":
        if "digits" not in _CACHE:
            _CACHE["digits"] = data.load_digits_split()
        train, test = _CACHE["digits"]
        batches = data.ShardBatches(train, rank, world_size, batch_size, seed)
        return Task(batches, _classification_loss,
                    lambda m: _eval_on(m, test.x, test.y, _classification_loss),
                    data_sha256=_digest("digits", lambda: data.bytes_digest(
                        train.x.numpy(), train.y.numpy(), test.x.numpy(), test.y.numpy())))
    if spec.task == "fmnist":
        if "fmnist" not in _CACHE:
            _CACHE["fmnist"] = data.load_fmnist_split()
        train, test = _CACHE["fmnist"]
        batches = data.ShardBatches(train, rank, world_size, batch_size, seed)
        return Task(batches, _classification_loss,
                    lambda m: _eval_on(m, test.x, test.y, _classification_loss, batch=2000),
                    data_sha256=data.fmnist_digest())
    if spec.task == "lm":
        if "lm" not in _CACHE:
            _CACHE["lm"] = data.load_python_corpus()
        train, test = _CACHE["lm"]
        batches = data.TokenWindows(train, rank, world_size, batch_size, spec.seq_len, seed)
        tx, ty = data.lm_eval_windows(test, spec.seq_len)
        return Task(batches, _lm_loss, lambda m: _eval_on(m, tx, ty, _lm_loss, batch=64),
                    data_sha256=_digest("lm", lambda: data.bytes_digest(
                        train.numpy().astype(np.uint8), test.numpy().astype(np.uint8))))
    raise ValueError(f"unknown task {spec.task!r}")
