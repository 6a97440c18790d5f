"""Fashion-MNIST from Debian's package: pinned by SHA-256, refused by name when it differs,
a fixed class-balanced training subset, the whole test set, epochs the paper-regime preset
counts on."""
import gzip
import math
import pathlib
import shutil

import numpy as np
import pytest
import torch

from workloads import data
from workloads.models import build_model, get_spec, grad_bytes
from workloads.tasks import make_task

pytestmark = pytest.mark.unit


def test_the_split_is_fixed_class_balanced_scaled_and_the_whole_test_set():
    tr, te = data.load_fmnist_split()
    assert len(tr) == data.FMNIST_TRAIN_EXAMPLES == 6000 and len(te) == 10_000
    assert tr.x.shape[1:] == (1, 28, 28) and tr.x.dtype == torch.float32
    assert 0.0 <= float(tr.x.min()) and float(tr.x.max()) <= 1.0
    assert torch.bincount(tr.y, minlength=10).tolist() == [600] * 10
    again, _ = data.load_fmnist_split()
    assert torch.equal(again.x, tr.x) and torch.equal(again.y, tr.y)


def test_every_file_is_the_pinned_one_and_the_digest_names_them_all():
    for name, digest in data.FMNIST_FILES.items():
        assert data._sha256(str(pathlib.Path(data.FMNIST_DIR) / name)) == digest
    assert len(data.fmnist_digest()) == 64 and data.fmnist_digest() == data.fmnist_digest()


def _copy(tmp_path) -> pathlib.Path:
    root = tmp_path / "fmnist"
    shutil.copytree(data.FMNIST_DIR, root)
    return root


def test_other_bytes_or_a_missing_file_are_one_line_naming_the_fix(tmp_path):
    root = _copy(tmp_path)
    labels = root / "t10k-labels-idx1-ubyte.gz"
    raw = bytearray(gzip.decompress(labels.read_bytes()))
    raw[-1] = (raw[-1] + 1) % 10                       # one label changed
    labels.write_bytes(gzip.compress(bytes(raw)))
    with pytest.raises(data.DataError, match=r"t10k-labels-idx1-ubyte.gz: SHA-256 [0-9a-f]{64}, "
                                             r"not the pinned 8d3605d1"):
        data.load_fmnist_split(str(root))
    labels.unlink()
    with pytest.raises(data.DataError, match="not found: install Debian's dataset-fashion-mnist"):
        data.load_fmnist_split(str(root))


def test_the_task_logs_the_digest_and_its_epoch_is_the_presets():
    """Three workers, batches of 64: 31 rounds an epoch (testbed.config.presets:
    paper-regime's rounds_per_epoch); the perceptron's gradient is 290 chunks of 352 floats,
    so a 0.8 % bound may drop 2 of them."""
    spec = get_spec("fmnist_mlp")
    task = make_task(spec, 0, 3, 64, 1)
    assert task.data_sha256 == data.fmnist_digest() and task.batches.per_epoch == 31
    model = build_model("fmnist_mlp", 1)
    assert grad_bytes(model) == 4 * 101_770
    from dblp.wire import CHUNK_ELEMS
    chunks = math.ceil(101_770 / CHUNK_ELEMS)
    assert CHUNK_ELEMS == 352 and chunks == 290 and math.floor(0.008 * chunks) == 2
    acc, loss = task.evaluate(model)
    assert 0.0 <= acc <= 0.3 and loss > 1.5            # untrained: about chance
    # The digits (scikit-learn's bundled set) carry the digest of the bytes read, the same
    # for every rank, which is no digest of Fashion-MNIST's
    digits = [make_task(get_spec("digits_cnn"), r, 3, 32, 1).data_sha256 for r in (0, 2)]
    assert digits[0] == digits[1] and len(digits[0]) == 64 and digits[0] != task.data_sha256


def test_the_corpus_digest_is_of_the_bytes_read():
    """byte_lm's corpus is this interpreter's own sources: the digest is of what was read."""
    train, test = data.load_python_corpus()
    want = data.bytes_digest(train.numpy().astype(np.uint8), test.numpy().astype(np.uint8))
    assert make_task(get_spec("byte_lm"), 1, 3, 8, 1).data_sha256 == want
    assert data.bytes_digest(np.zeros(3, np.uint8)) != data.bytes_digest(np.zeros(4, np.uint8))


def test_per_class_draw_is_the_same_every_time():
    y = np.repeat(np.arange(10), 50)
    a = data._per_class(y, 100, 7)
    assert np.array_equal(a, data._per_class(y, 100, 7)) and len(a) == 100
    assert np.bincount(y[a]).tolist() == [10] * 10
