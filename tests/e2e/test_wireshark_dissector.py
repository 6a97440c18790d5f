"""The generated Wireshark dissector, run by Debian's tshark on a capture of a real job.

Two loopback jobs with a secret and packet loss (parameter-server mode, then
sharded mode, so every message type is on the wire) are captured with
tcpdump on ``lo``. Every datagram that carries a valid tag for one of the two
jobs' secrets is a DBLP message of this run (the oracle: other loopback UDP
traffic on the machine cannot forge it). Each is decoded twice: by tshark
with the dissector ``python -m dblp.wireshark`` wrote, and by the scapy layer;
every field of every message must agree, through each way the dissector
finds traffic (its port preference, "Decode As", its heuristic).

An e2e test, not emu: it needs root for tcpdump and Debian's tshark, which
`./setup.sh tshark` installs (`make test` runs `./setup.sh vagrant tshark`
before the suite, as for tests/e2e/test_vagrant_validate.py), but no Open
vSwitch and no fabric.
"""
import json
import pathlib
import re
import secrets
import signal
import struct
import subprocess
import sys
import time

import numpy as np
import pytest
from scapy.layers.inet import UDP
from scapy.packet import Raw
from scapy.utils import rdpcap

from dblp import wire, wireshark
from dblp.scapy_layer import DBLP
from dblp.testing import run_job

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIELDS = wireshark.fields()


@pytest.fixture(scope="module")
def tshark(optional_tool):
    """tshark, which `./setup.sh tshark` installed before the suite."""
    optional_tool("tshark", "tshark")
    return True


@pytest.fixture(scope="module")
def dissector(tmp_path_factory):
    """The Lua file exactly as docs/transport.md makes it."""
    path = tmp_path_factory.mktemp("lua") / "dblp.lua"
    out = subprocess.run([sys.executable, "-m", "dblp.wireshark", "--out", str(path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return path


@pytest.fixture(scope="module")
def capture(tshark, tmp_path_factory):
    """(pcap, {mode: key}): a PS job and a sharded job on loopback, with loss, captured."""
    pcap = tmp_path_factory.mktemp("capture") / "run.pcap"
    keys = {mode: secrets.token_hex(32) for mode in ("ps", "sharded")}
    dump = subprocess.Popen(["tcpdump", "-i", "lo", "-U", "-s", "0", "-n", "-w", str(pcap), "udp"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        seen = []  # "listening on lo, ..." once packets are being taken (warnings may come first)
        while not (seen and "listening on" in seen[-1]):
            seen.append(dump.stderr.readline())
            assert seen[-1], f"tcpdump did not start: {''.join(seen)}"
        # dblp with a phase check every round: the CRITICAL bit and FINAL's next
        # bound change, and its drop-corrected norm's figures ride in FINAL; static: a
        # non-zero bound in every header.
        run_job(n_workers=3, mode="ps", policy="dblp", rounds=4, numel=20_000, fault=0.1,
                knobs={"check_every": 1, "signal": "rescaled"}, secret=keys["ps"])
        run_job(n_workers=3, mode="sharded", policy="static", rounds=3, numel=20_000, fault=0.1,
                secret=keys["sharded"])
        time.sleep(0.5)
    finally:
        dump.send_signal(signal.SIGINT)
        dump.wait(timeout=30)
    return pcap, {mode: bytes.fromhex(k) for mode, k in keys.items()}


def _job_messages(pcap, keys) -> dict[int, tuple[str, object, bytes, tuple[int, int]]]:
    """{frame number: (mode, scapy DBLP, raw message, (sport, dport))} of the two jobs."""
    sealers = {mode: wire.Sealer(key) for mode, key in keys.items()}
    out = {}
    for number, pkt in enumerate(rdpcap(str(pcap)), start=1):
        if UDP not in pkt:
            continue
        udp = pkt[UDP]
        raw = bytes(udp)[8:udp.len]
        for mode, sealer in sealers.items():
            # The tag covers the destination rank (not on the wire): any rank of the jobs.
            if len(raw) >= wire.HEADER_SIZE + wire.TAG_SIZE and any(
                    sealer.verify(raw, len(raw), dst) for dst in range(4)):
                out[number] = (mode, DBLP(raw), raw, (udp.sport, udp.dport))
    return out


@pytest.fixture(scope="module")
def messages(capture):
    return _job_messages(*capture)


def _server_port(messages) -> int:
    """The PS job's server port: the one port every datagram of that job has."""
    ports = None
    for mode, _d, _raw, pair in messages.values():
        if mode == "ps":
            ports = set(pair) if ports is None else ports & set(pair)
    assert ports is not None and len(ports) == 1, ports
    return ports.pop()


def _expected(d) -> dict:
    """What every dissector field must show for one message, from the scapy layer.

    The payload's meaning is spelled out here from wire.py's docstring (not
    from the generator's PAYLOADS), so the test is an independent oracle.
    """
    exp: dict = {f"dblp.{name}": int(getattr(d, name)) for name in wire.FIELD_NAMES}
    for flag in wire.Flag:
        exp[f"dblp.flags.{str(flag.name).lower()}"] = bool(int(d.flags) & int(flag))
    payload = bytes(d.payload.load) if type(d.payload) is Raw else b""
    assert len(payload) == d.length
    if payload:
        exp["dblp.payload"] = payload
    t, count = wire.MsgType(d.type), int(d.count)
    size = (count + 7) // 8
    if t == wire.MsgType.DATA:
        exp["dblp.value"] = np.frombuffer(payload, "<f4")
    bitmaps = {wire.MsgType.BITMAP: ["held"], wire.MsgType.STOP: ["held"],
               wire.MsgType.FINAL: ["dropped", "taken"]}.get(t, [])
    for i, name in enumerate(bitmaps):
        bm = payload[i * size:(i + 1) * size]
        exp[f"dblp.{name}"] = bm
        exp[f"dblp.{name}.chunks"] = int(np.unpackbits(np.frombuffer(bm, np.uint8))[:count].sum())
    if t == wire.MsgType.FINAL:
        # after the bitmaps: the part's norm figures, a network-order double and uint32
        sumsq, kept = struct.unpack_from("!dI", payload, 2 * size)
        exp["dblp.norm_sumsq"] = pytest.approx(sumsq, rel=1e-14, abs=0)
        exp["dblp.norm_kept"] = kept
    if t in (wire.MsgType.HELLO, wire.MsgType.WELCOME, wire.MsgType.CHALLENGE):
        exp["dblp.json"] = payload.decode()
        json.loads(exp["dblp.json"])
    for name, value in d.trailer.items():
        exp[f"dblp.{name}"] = value
    return exp


def _parse(field: wireshark.Field, text: str):
    if field.ftype == "BYTES":
        return bytes.fromhex(text.replace(":", ""))
    if field.ftype == "BOOLEAN":
        return {"1": True, "0": False, "True": True, "False": False}[text]
    if field.abbrev == "dblp.value":
        return np.array([float(v) for v in text.split(",")], dtype="<f4")
    if field.ftype == "DOUBLE":
        return float(text)
    if field.ftype == "STRING":
        return text
    return int(text, 0)


def _tshark(dissector, pcap, *args) -> dict[int, dict]:
    """{frame number: {field: value}} of every frame tshark decodes as DBLP (+ its Info)."""
    argv = ["tshark", "-X", f"lua_script:{dissector}", "-r", str(pcap), "-Y", "dblp", *args,
            "-T", "fields", "-E", "separator=/t", "-E", "occurrence=a", "-E", "aggregator=,",
            "-e", "frame.number", "-e", "_ws.col.Info", *[a for f in FIELDS for a in ("-e", f.abbrev)]]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "Lua" not in out.stderr, out.stderr  # a script error is only printed, never fatal
    frames = {}
    for line in out.stdout.splitlines():
        number, info, *values = line.split("\t")
        assert len(values) == len(FIELDS), line[:200]
        decoded = {f.abbrev: _parse(f, v) for f, v in zip(FIELDS, values, strict=True) if v != ""}
        decoded["info"] = info
        frames[int(number)] = decoded
    return frames


def _assert_same(decoded: dict, messages: dict, frames) -> None:
    missing = sorted(set(frames) - set(decoded))
    assert not missing, f"frames tshark did not decode as DBLP: {missing[:20]}"
    for number in frames:
        d = messages[number][1]
        got = dict(decoded[number])
        info = got.pop("info")
        assert info.startswith(wire.MsgType(d.type).name + " "), (number, info)
        exp = _expected(d)
        assert set(got) == set(exp), (number, sorted(set(got) ^ set(exp)))
        for key, value in exp.items():
            if isinstance(value, np.ndarray):
                assert np.array_equal(got[key].view(np.uint32), value.view(np.uint32)), (number, key)
            else:
                assert got[key] == value, (number, key, got[key], value)


def _claimed_udp_ports(dissector) -> set[int]:
    """UDP ports other Wireshark dissectors own: of a datagram's two ports, UDP tries the
    lower one first, so a worker whose ephemeral port is one of these is theirs, by design."""
    out = subprocess.run(["tshark", "-X", f"lua_script:{dissector}", "-G", "decodes"],
                         capture_output=True, text=True, timeout=120)
    return {int(p) for table, p, proto, *_ in (line.split("\t") for line in out.stdout.splitlines())
            if table == "udp.port" and p.isdigit() and proto != "dblp"}


def test_capture_holds_every_message_type(messages):
    headers = [d for _m, d, _r, _p in messages.values()]
    assert {wire.MsgType(d.type) for d in headers} == set(wire.MsgType)
    assert {m for m, *_ in messages.values()} == {"ps", "sharded"}
    # Both values of the bits and fields a policy sets (TCP is declared but no sender sets it).
    for flag in (wire.Flag.PULL, wire.Flag.CRITICAL):
        assert {bool(int(d.flags) & flag) for d in headers} == {True, False}, flag
    assert {d.bound > 0 for d in headers} == {True, False}
    assert any(d.aux > 0 for d in headers if d.type == wire.MsgType.FINAL)
    # the detector's norm figures travel in FINAL (the PS job's rescaled signal)
    assert any(struct.unpack_from("!I", bytes(d.payload.load), d.length - 4)[0] > 0
               for d in headers if d.type == wire.MsgType.FINAL)


@pytest.mark.parametrize("how", ["preference", "decode-as"])
def test_port_based_decoding_equals_the_scapy_layer(dissector, capture, messages, how):
    port = _server_port(messages)
    args = ["--disable-heuristic", "dblp_udp"]
    args += (["-o", f"dblp.udp_port:{port}"] if how == "preference"
             else ["-o", "dblp.udp_port:0", "-d", f"udp.port=={port},dblp"])
    claimed = _claimed_udp_ports(dissector)
    frames = [n for n, (mode, _d, _r, pair) in messages.items()
              if mode == "ps" and not (min(pair) != port and min(pair) in claimed)]
    assert len(frames) > 100
    decoded = _tshark(dissector, capture[0], *args)
    _assert_same(decoded, messages, frames)
    # Nothing else is DBLP with the heuristic off: the sharded job's datagrams stay UDP.
    assert not [n for n in decoded if messages.get(n, ("other",))[0] == "sharded"]


def test_heuristic_decoding_equals_the_scapy_layer(dissector, capture, messages):
    """Sharded mode's rank-to-rank datagrams between ephemeral ports are found by content."""
    decoded = _tshark(dissector, capture[0], "-o", "dblp.udp_port:0",
                      "-o", "udp.try_heuristic_first:TRUE")
    _assert_same(decoded, messages, sorted(messages))


def test_readme_tshark_command_prints_dblp_fields(dissector, capture, messages):
    page = ROOT / "docs" / "transport.md"  # where the README's link to the transport leads
    line = next(c for c in (ln.strip() for ln in page.read_text().splitlines())
                if c.startswith("tshark -X lua_script:dblp.lua"))
    argv = line.replace("dblp.lua", str(dissector), 1).split()
    argv[argv.index("-r") + 1] = str(capture[0])
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    shown = set(re.findall(r"\bDBLP \d+ ([A-Z]+) src=", out.stdout))
    assert shown == {t.name for t in wire.MsgType}, out.stdout[-2000:]


def test_a_misplaced_field_fails_the_comparison(dissector, capture, messages, tmp_path):
    """The comparison can fail: the same script with ``round`` read one byte late."""
    off, size = wire.FIELD_OFFSETS["round"]
    text = dissector.read_text()
    good = f'{{F["round"], {off}, {size}, nil}}'
    assert good in text
    broken = tmp_path / "dblp.lua"
    broken.write_text(text.replace(good, f'{{F["round"], {off + 1}, {size}, nil}}'))
    decoded = _tshark(broken, capture[0], "-o", "udp.try_heuristic_first:TRUE")
    with pytest.raises(AssertionError, match="dblp.round"):
        _assert_same(decoded, messages, sorted(messages))


def test_a_run_capture_cut_by_the_snap_length_still_decodes_every_header(dissector, capture,
                                                                         messages, tmp_path):
    """The harness captures runs with a 96-byte snap length: every header field must
    still decode, and the message is marked cut, not malformed."""
    cut = tmp_path / "cut.pcap"
    subprocess.run(["editcap", "-s", "96", str(capture[0]), str(cut)], check=True, timeout=120)
    decoded = _tshark(dissector, cut, "-o", "udp.try_heuristic_first:TRUE")
    assert set(messages) <= set(decoded)
    for number, (_mode, d, _raw, _pair) in messages.items():
        got = decoded[number]
        for name in wire.FIELD_NAMES:
            assert got[f"dblp.{name}"] == int(getattr(d, name)), (number, name)
        assert "dblp.tag" not in got and "dblp.payload" not in got
    out = subprocess.run(["tshark", "-X", f"lua_script:{dissector}", "-r", str(cut), "-Y",
                          "dblp.malformed", "-o", "udp.try_heuristic_first:TRUE"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "", out.stdout[:500]
