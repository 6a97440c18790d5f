"""The spec's ``[cluster] servers``: each name checked, the placement checked, one line per error."""
import tomllib

import pytest
from click.testing import CliRunner

from testbed.cli import main
from testbed.config.spec import SpecError, load
from testbed.emulation.cluster import LOCAL, Server, ServerError, parse_server, parse_servers

BAD = [
    ("not-a-list", '[cluster]\nservers = "local"', "cluster.servers"),
    ("empty", '[cluster]\nservers = []', "cluster.servers"),
    ("local-not-first", '[cluster]\nservers = ["root@lab2", "local"]', "cluster.servers[0]"),
    ("local-twice", '[cluster]\nservers = ["local", "local"]', "cluster.servers"),
    ("option-injection", '[cluster]\nservers = ["local", "-oProxyCommand=sh"]', "cluster.servers[1]"),
    ("shell-in-host", '[cluster]\nservers = ["local", "root@lab2;reboot"]', "cluster.servers[1]"),
    ("shell-in-user", '[cluster]\nservers = ["local", "$(id)@lab2"]', "cluster.servers[1]"),
    ("bad-port", '[cluster]\nservers = ["local", "lab2:99999"]', "cluster.servers[1]"),
    ("not-a-string", '[cluster]\nservers = ["local", 7]', "cluster.servers[1]"),
    ("same-machine-twice", '[cluster]\nservers = ["local", "root@lab2", "alice@lab2:22"]',
     "cluster.servers[2]"),
    ("more-servers-than-pods", '[topology]\nk = 4\n[cluster]\nservers = '
     '["local", "a", "b", "c", "d"]', "cluster.servers"),
    ("star-has-one-pod", '[topology]\nkind = "star"\n[cluster]\nservers = ["local", "lab2"]',
     "cluster.servers"),
    ("unknown-field", '[cluster]\nmachines = ["local"]', "cluster.machines"),
]


@pytest.mark.unit
@pytest.mark.parametrize("text,field", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_bad_cluster_section_is_one_line_exit_2(tmp_path, text, field):
    spec = tmp_path / "bad.toml"
    spec.write_text(text + "\n")
    res = CliRunner().invoke(main, ["run", str(spec), "--out", str(tmp_path / "run")])
    assert res.exit_code == 2, res.output
    [line] = res.stderr.strip().splitlines()
    assert f"'{field}'" in line and ";" in line, line
    assert not (tmp_path / "run").exists()


@pytest.mark.unit
def test_the_default_is_this_machine_alone_and_round_trips(tmp_path):
    spec = load(None)
    assert spec["cluster"]["servers"] == [LOCAL]
    assert tomllib.loads(spec.to_toml())["cluster"] == {"servers": [LOCAL], "ssh_options": []}


@pytest.mark.unit
def test_a_placeable_list_of_servers_loads_with_its_ssh_options(tmp_path):
    spec = tmp_path / "two.toml"
    spec.write_text('[topology]\nk = 4\n[cluster]\nservers = ["local", "root@lab2:2222"]\n'
                    'ssh_options = ["-i", "/root/.ssh/lab"]\n')
    loaded = load(str(spec))
    assert loaded["cluster"] == {"servers": ["local", "root@lab2:2222"],
                                 "ssh_options": ["-i", "/root/.ssh/lab"]}


@pytest.mark.unit
def test_bursts_on_another_servers_ports_are_taken(tmp_path):
    """Pods 2-3 and cores dtc02-03 are lab2's: the controller reaches their ports there."""
    spec = tmp_path / "two.toml"
    body = ('[topology]\nk = 4\n[cluster]\nservers = ["local", "root@lab2"]\n'
            '[[bursts]]\nat_round = 2\nrounds = 1\nkind = "{}"\ntarget = "dtc02:dta01"\n')
    for kind in ("loss", "congest", "police"):
        spec.write_text(body.format(kind))
        assert load(str(spec))["bursts"][0]["kind"] == kind


@pytest.mark.unit
def test_ssh_options_must_be_strings(tmp_path):
    spec = tmp_path / "two.toml"
    spec.write_text('[cluster]\nssh_options = ["-i", 3]\n')
    with pytest.raises(SpecError) as err:
        load(str(spec))
    assert err.value.field == "cluster.ssh_options"


@pytest.mark.unit
def test_server_names_parse_to_ssh_destinations():
    assert parse_server("local") == Server("local")
    s = parse_server("root@lab2.example.org:2222", 1)
    assert (s.user, s.host, s.port, s.destination) == ("root", "lab2.example.org", 2222,
                                                       "root@lab2.example.org")
    assert parse_server("10.0.0.7").destination == "10.0.0.7" and parse_server("10.0.0.7").port == 22
    # The destination always follows "--": nothing in it is read as an ssh option.
    argv = s.ssh_argv(2)
    assert argv[0] == "ssh" and argv[-2:] == ["--", "root@lab2.example.org"]
    assert "BatchMode=yes" in argv and "ConnectTimeout=2" in argv and argv[argv.index("-p") + 1] == "2222"


@pytest.mark.unit
@pytest.mark.parametrize("names,index", [
    (["local", "999.1.1.1"], 1),        # all digits: neither a name nor an address
    (["local", "lab2:"], 1),
    (["local", "a@b@c"], 1),
    (["local", "lab_2"], 1),            # '_' is no host-name character
    (["local", "lab2", "lab2"], 2),
])
def test_names_ssh_would_misread_are_refused_naming_their_place(names, index):
    with pytest.raises(ServerError) as err:
        parse_servers(names)
    assert err.value.index == index
