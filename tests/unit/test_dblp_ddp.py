"""The DDP communication hook: gradients of a real model averaged through DBLP."""
import threading

import pytest

import dblp
from dblp.testing import free_port

pytestmark = pytest.mark.unit


def test_ddp_comm_hook_averages_gradients():
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    srv = dblp.ParameterServer("127.0.0.1", 0, 1, "reliable")
    th = threading.Thread(target=srv.serve, args=(2,))
    th.start()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(20, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
        ref = [p.detach().clone() for p in model.parameters()]
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=64)
        with dblp.TransportGroup(0, 1, "127.0.0.1", srv.port) as group:
            ddp.register_comm_hook(group, dblp.ddp_comm_hook)
            x, y = torch.randn(32, 20), torch.randint(0, 3, (32,))
            for _ in range(2):
                ddp.zero_grad()
                torch.nn.functional.cross_entropy(ddp(x), y).backward()
            assert group.round == 1  # one DBLP round per backward (single bucket)
            # one worker: the average is the gradient itself
            ref_model = torch.nn.Sequential(torch.nn.Linear(20, 16), torch.nn.ReLU(),
                                            torch.nn.Linear(16, 3))
            with torch.no_grad():
                for p, r in zip(ref_model.parameters(), ref, strict=True):
                    p.copy_(r)
            torch.nn.functional.cross_entropy(ref_model(x), y).backward()
            for p, q in zip(model.parameters(), ref_model.parameters(), strict=True):
                assert torch.allclose(p.grad, q.grad, atol=1e-6)
    finally:
        dist.destroy_process_group()
        th.join(20)
        srv.close()
