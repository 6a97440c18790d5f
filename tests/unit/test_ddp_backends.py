"""DDP over any torch.distributed backend: the spec's ``[ddp.NAME]`` section and its arm.

The section registers an arm (transport ``c10d``) whose backend and module
the registry holds and the launcher hands the workers; a bad section stops
the spec with one line naming the field. The arm's training on loopback:
tests/unit/test_workload_ddp.py.
"""
import pytest

from testbed.config import spec as specmod
from testbed.config.arms import ARMS, C10D, Arm
from testbed.config.presets import PRESETS

pytestmark = pytest.mark.unit

SECTION = '[ddp.mine]\nbackend = "extgloo"\nmodule = "ext_c10d_backend"\n'


@pytest.fixture(autouse=True)
def _forget_spec_arms():
    """A spec's arms live in the process's registry: each test starts without them."""
    yield
    for name in [n for n, a in ARMS.items() if a.transport == C10D or a.command is not None]:
        del ARMS[name]


def load(tmp_path, text: str):
    path = tmp_path / "spec.toml"
    path.write_text(text)
    return specmod.load(str(path), PRESETS["smoke"])


def test_a_ddp_section_registers_an_arm_beside_ddp_and_ddp_gloo(tmp_path):
    spec = load(tmp_path, 'arms = ["ddp", "ddp-gloo", "dblp-sharded", "mine"]\n' + SECTION)
    assert spec.arms == ["ddp", "ddp-gloo", "dblp-sharded", "mine"]
    assert spec.ddp_backends == {"mine": {"backend": "extgloo", "module": "ext_c10d_backend"}}
    assert ARMS["mine"] == Arm("mine", C10D, integration="ddp", backend="extgloo",
                               backend_module="ext_c10d_backend")
    mine = ARMS["mine"]
    assert mine.serverless and not mine.uses_dblp and not mine.bounded
    assert mine.gloo_peer() is ARMS["ddp-gloo"]          # judged like ddp: against DDP over gloo
    # The resolved spec keeps the section, and reads back to the same spec.
    again = tmp_path / "again"
    again.mkdir()
    assert load(again, spec.to_toml()).data == spec.data
    # Without a module: a backend torch knows.
    spec = load(tmp_path, 'arms = ["theirs"]\n[ddp.theirs]\nbackend = "mpi"\n')
    assert ARMS["theirs"].worker_args == ["--integration", "ddp", "--backend", "mpi"]


def test_each_ddp_arm_hands_its_workers_its_backend_from_the_registry(tmp_path):
    from testbed.run.runner import ArmRun

    class Fab:
        control_socket = "/nonexistent.sock"
        controller = None

        def ip(self, host):
            return "10.0.0." + str(len(host))

        def intf(self, host):
            return host + "-eth0"

    spec = load(tmp_path, 'arms = ["ddp", "ddp-gloo", "mine"]\n' + SECTION)
    flags = {}
    for arm in spec.arms:
        run = ArmRun(spec, arm, Fab(), tmp_path, "h000", ["h100", "h200", "h300"], None)
        flags[arm] = run.launcher.integration_args()
        assert run.unit.serverless and run.unit.env(0)["MASTER_ADDR"] == Fab().ip("h100")
        if arm != "ddp":   # no transport settings file: torch.distributed's own arms
            assert run.launcher.transport_args("worker") == []
    assert flags == {"ddp": ["--integration", "ddp", "--backend", "dblp"],
                     "ddp-gloo": ["--integration", "ddp", "--backend", "gloo"],
                     "mine": ["--integration", "ddp", "--backend", "extgloo",
                              "--backend-module", "ext_c10d_backend"]}


@pytest.mark.parametrize("text,field,says", [
    ("ddp = 3\n", "ddp", "expected a table of DDP arms"),
    ("[ddp]\nmine = 3\n", "ddp.mine", "expected a table"),
    ('[ddp.mine]\nmodule = "m"\n', "ddp.mine.backend", "missing"),
    ('[ddp.mine]\nbackend = "b"\nport = 3\n', "ddp.mine.port", "unknown field"),
    ("[ddp.mine]\nbackend = 3\n", "ddp.mine.backend", "expected string"),
    ('[ddp.mine]\nbackend = "my backend"\n', "ddp.mine.backend", "is not a backend name"),
    ('[ddp.mine]\nbackend = "b"\nmodule = "my-pkg.c10d"\n', "ddp.mine.module",
     "is not a module name"),
    ('[ddp.mine]\nbackend = "gloo"\n', "ddp.mine.backend", "built-in arm 'ddp-gloo'"),
    ('[ddp.mine]\nbackend = "dblp"\n', "ddp.mine.backend", "built-in arm 'ddp'"),
    ('[ddp.ddp-gloo]\nbackend = "b"\n', "ddp.ddp-gloo", "is a built-in arm"),
    ('[ddp."a b"]\nbackend = "b"\n', "ddp.a b", "is not a plain name"),
    ('[commands.mine]\nworker = ["true"]\n[ddp.mine]\nbackend = "b"\n', "ddp.mine",
     "is a command arm"),
])
def test_a_bad_ddp_section_is_one_line_naming_the_field(tmp_path, text, field, says):
    with pytest.raises(specmod.SpecError) as err:
        load(tmp_path, 'arms = ["gloo"]\n' + text)
    msg = str(err.value)
    assert err.value.field == field and says in msg and "\n" not in msg, msg


def test_a_spec_owns_its_ddp_arms_and_may_redefine_them(tmp_path):
    load(tmp_path, 'arms = ["mine"]\n' + SECTION)
    load(tmp_path, 'arms = ["mine"]\n[ddp.mine]\nbackend = "mpi"\n')
    assert (ARMS["mine"].backend, ARMS["mine"].backend_module) == ("mpi", None)
    ARMS.pop("mine")       # a spec without the section: the arm is not there
    with pytest.raises(specmod.SpecError, match="unknown arm 'mine'"):
        load(tmp_path, 'arms = ["mine"]\n')
