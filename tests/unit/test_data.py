"""The bundled loaders: real data, deterministic splits, disjoint shards, reproducible batches."""
import numpy as np
import pytest
import torch

from workloads import data


@pytest.mark.unit
def test_digits_split_is_fixed_stratified_and_scaled():
    tr, te = data.load_digits_split()
    tr2, te2 = data.load_digits_split()
    assert len(tr) + len(te) == 1797 and len(te) == 360
    assert torch.equal(te.x, te2.x) and torch.equal(tr.y, tr2.y)
    assert tr.x.shape[1:] == (1, 8, 8) and 0.0 <= float(tr.x.min()) and float(tr.x.max()) <= 1.0
    # every class is present in the test set in roughly its share
    counts = torch.bincount(te.y, minlength=10)
    assert int(counts.min()) >= 30


@pytest.mark.unit
def test_the_kept_split_is_the_one_scikit_learn_makes_and_a_broken_file_is_made_again(
        tmp_path, monkeypatch):
    """Workers read the split from the cache instead of importing scikit-learn; what they
    read is the very split, and a file cut short (a crash mid-write, a full disk) is remade."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = data.digits_cache_path()
    assert path.startswith(str(tmp_path / "dblp-testbed")) and "sklearn" in path
    made = data.load_digits_split()          # no file yet: scikit-learn splits, the file is kept
    kept = data.load_digits_split()          # from the file
    want = data._split_digits()
    for got in (made, kept):
        (tr, te) = got
        for a, b in zip((tr.x, te.x, tr.y, te.y), want, strict=True):
            assert np.array_equal(a.numpy(), b) and a.numpy().dtype == b.dtype
    with open(path, "r+b") as f:
        f.truncate(100)
    again = data.load_digits_split()
    assert torch.equal(again[1].x, made[1].x) and torch.equal(again[0].y, made[0].y)
    assert np.load(path)["x_te"].shape == (360, 1, 8, 8)  # and the file is whole again
    assert not list((tmp_path / "dblp-testbed").glob("*.tmp"))


@pytest.mark.unit
def test_shards_are_disjoint_and_cover_the_training_set():
    n = 1437
    shards = [data.shard_indices(n, r, 3, seed=5) for r in range(3)]
    allidx = np.concatenate(shards)
    assert len(allidx) == n and len(np.unique(allidx)) == n
    assert max(len(s) for s in shards) - min(len(s) for s in shards) <= 1
    assert not np.array_equal(shards[0], data.shard_indices(n, 0, 3, seed=6))
    with pytest.raises(ValueError, match="rank"):
        data.shard_indices(n, 3, 3, seed=0)


@pytest.mark.unit
def test_batch_order_depends_only_on_seed_rank_and_step():
    tr, _ = data.load_digits_split()
    a = data.ShardBatches(tr, 1, 3, 32, seed=0)
    b = data.ShardBatches(tr, 1, 3, 32, seed=0)
    xa, ya = a.batch(57)          # a jumps straight to a later epoch
    for s in range(58):
        xb, yb = b.batch(s)
    assert torch.equal(xa, xb) and torch.equal(ya, yb)
    # one epoch visits every shard example once
    seen = torch.cat([a.batch(s)[1] for s in range(a.per_epoch)])
    assert len(seen) == a.per_epoch * 32
    assert a.epoch_of(a.per_epoch) == 1
    with pytest.raises(ValueError, match="batch_size"):
        data.ShardBatches(tr, 0, 3, 10_000, seed=0)


@pytest.mark.unit
def test_python_corpus_is_real_stdlib_source():
    train, test = data.load_python_corpus()
    text = bytes(train[:200_000].to(torch.uint8).tolist()).decode("utf-8", "replace")
    assert "def " in text and "import " in text and "return" in text
    assert len(test) == pytest.approx(0.1 * (len(train) + len(test)), rel=0.01)
    assert int(train.max()) < 256
    w = data.TokenWindows(train, 2, 3, batch_size=4, seq_len=32, seed=0)
    x, y = w.batch(7)
    assert x.shape == y.shape == (4, 32)
    assert torch.equal(x[:, 1:], y[:, :-1])          # targets are next tokens
    assert torch.equal(w.batch(7)[0], x)
    ex, ey = data.lm_eval_windows(test, 32, n_windows=8)
    assert ex.shape == (8, 32)
