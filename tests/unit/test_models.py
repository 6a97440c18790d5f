"""Model registry: every model runs forward/backward, init is seed-determined, sizes are as documented."""
import pytest
import torch

from workloads.models import MODELS, build_model, get_spec, grad_bytes, make_optimizer
from workloads.tasks import make_task


@pytest.mark.unit
@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_trains_one_step_and_init_is_seeded(name):
    spec = get_spec(name)
    a, b, c = build_model(name, 3), build_model(name, 3), build_model(name, 4)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)
    assert any(not torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters(), strict=True))
    task = make_task(spec, 0, 3, 8, seed=0)
    opt = make_optimizer(spec, a.parameters())
    x, y = task.batches.batch(0)
    loss0 = task.loss_fn(a(x), y)
    assert torch.isfinite(loss0)
    for _ in range(5):
        opt.zero_grad()
        loss = task.loss_fn(a(x), y)
        loss.backward()
        opt.step()
    assert task.loss_fn(a(x), y).item() < loss0.item()   # it learns the batch
    acc, tloss = task.evaluate(a)
    assert 0.0 <= acc <= 1.0 and tloss > 0


@pytest.mark.unit
def test_default_digits_cnn_gradient_is_100_to_400_kb():
    assert 100_000 <= grad_bytes(build_model("digits_cnn", 0)) <= 400_000


@pytest.mark.unit
def test_unknown_model_and_bad_lr_name_the_knob():
    with pytest.raises(ValueError, match="--model"):
        get_spec("vgg")
    with pytest.raises(ValueError, match="--lr"):
        make_optimizer(get_spec("digits_cnn"), build_model("digits_cnn", 0).parameters(), lr=-1)


@pytest.mark.unit
def test_cosine_schedule_anneals_to_zero_and_constant_keeps_the_rate():
    from testbed.config import spec as spec_mod
    from workloads.models import LR_SCHEDULES, make_scheduler

    assert spec_mod.LR_SCHEDULES == LR_SCHEDULES   # the spec validates without importing torch
    params = build_model("digits_cnn", 0).parameters()
    opt = make_optimizer(get_spec("digits_cnn"), params, lr=0.05)
    assert make_scheduler(opt, "constant", 10) is None
    sched = make_scheduler(opt, "cosine", 10)
    rates = []
    for _ in range(10):
        opt.step()
        sched.step()
        rates.append(opt.param_groups[0]["lr"])
    assert rates == sorted(rates, reverse=True) and rates[4] == pytest.approx(0.025)
    assert rates[-1] == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="--lr-schedule"):
        make_scheduler(opt, "step", 10)
