"""The generated Lua dissector's text against dblp.wire's declaration (no tshark needed).

Offsets and sizes are recomputed here from the struct codes, independently of
``wire.FIELD_OFFSETS``; tshark decodes a real capture with the script in
tests/e2e/test_wireshark_dissector.py.
"""
import re
import struct

import pytest

from dblp import wire, wireshark
from dblp.server import DEFAULT_PORT

pytestmark = pytest.mark.unit

PROTOFIELD = re.compile(r'^F\["([^"]+)"\] = ProtoField\.new\("([^"]*)", "([^"]+)", ftypes\.(\w+), '
                        r'(\w+), (base\.\w+|\d+), (\w+), "((?:[^"\\]|\\.)*)"\)$', re.M)


@pytest.fixture(scope="module")
def lua():
    return wireshark.lua_dissector()


def _protofields(text):
    return {m[0]: m[1:] for m in PROTOFIELD.findall(text)}


def _lua_table(text, name):
    m = re.search(rf"^local {name} = \{{\n(.*?)\n\}}$", text, re.M | re.S)
    assert m, name
    return [line.strip().rstrip(",") for line in m.group(1).splitlines()]


def test_every_header_field_is_registered_with_its_declared_type(lua):
    pf = _protofields(lua)
    for name, code, desc in wire.HEADER_FIELDS:
        label, abbrev, ftype, valuestring, base, mask, blurb = pf[name]
        assert abbrev == f"dblp.{name}" and label == name and blurb == desc
        assert ftype == f"UINT{8 * struct.calcsize('!' + code)}", name
        assert valuestring == ("TYPES" if name == "type" else "nil")
        assert mask == "nil"
    assert pf["magic"][4] == "base.HEX"


def test_header_offsets_and_sizes_are_the_declared_ones(lua):
    rows = _lua_table(lua, "HEADER")
    assert len(rows) == len(wire.HEADER_FIELDS)
    off = 0
    for row, (name, code, _desc) in zip(rows, wire.HEADER_FIELDS, strict=True):
        size = struct.calcsize("!" + code)
        bits = "{" + ", ".join(f'F["flags.{f.name.lower()}"]' for f in wire.Flag) + "}"
        assert row == f'{{F["{name}"], {off}, {size}, {bits if name == "flags" else "nil"}}}'
        off += size
    assert off == wire.HEADER_SIZE
    assert f"local HEADER_SIZE = {off}\n" in lua


def test_trailer_follows_the_payload_as_declared(lua):
    pf = _protofields(lua)
    rows = _lua_table(lua, "TRAILER")
    off = 0
    for row, (name, size, desc) in zip(rows, wire.TRAILER_FIELDS, strict=True):
        assert row == f'{{F["{name}"], {off}, {size}}}'
        assert pf[name][1:3] == (f"dblp.{name}", "BYTES") and pf[name][-1] == desc
        off += size
    assert f"local TAG_SIZE = {off}\n" in lua


def test_message_types_flags_and_constants(lua):
    assert _lua_table(lua, "TYPES") == [f'[{int(t)}] = "{t.name}"' for t in wire.MsgType]
    pf = _protofields(lua)
    for flag in wire.Flag:
        label, abbrev, ftype, _vs, width, mask, _blurb = pf[f"flags.{flag.name.lower()}"]
        assert (label, abbrev, ftype) == (flag.name, f"dblp.flags.{flag.name.lower()}", "BOOLEAN")
        assert int(mask, 16) == int(flag) and width == "8"
    for const, value in {"MAGIC": f"0x{wire.MAGIC:04X}", "VERSION": wire.VERSION,
                         "MAX_DATAGRAM": wire.MAX_DATAGRAM, "DEFAULT_PORT": DEFAULT_PORT}.items():
        assert f"local {const} = {value}\n" in lua
    assert "udp_port:add(DEFAULT_PORT, dblp)" in lua  # port-based on the transport's port
    assert 'dblp:register_heuristic("udp"' in lua  # and heuristic


def test_every_message_type_has_its_payload_and_every_field_is_registered(lua):
    rows = _lua_table(lua, "PAYLOADS")
    assert [int(r.split("]")[0][1:]) for r in rows] == sorted(int(t) for t in wire.MsgType)
    kinds = {int(t): p.kind for t, p in wireshark.PAYLOADS.items()}
    assert kinds[wire.MsgType.DATA] == "floats" and kinds[wire.MsgType.HELLO] == "json"
    assert 'F["dropped"], F["dropped.chunks"]}, {F["taken"], F["taken.chunks"]' in lua
    defined = list(_protofields(lua))
    registered = re.search(r"^dblp\.fields = \{\n(.*?)\n\}$", lua, re.M | re.S).group(1)
    assert re.findall(r'F\["([^"]+)"\]', registered) == defined
    assert [f.abbrev for f in wireshark.fields()] == [_protofields(lua)[k][1] for k in defined]


def test_a_new_trailer_field_reaches_the_lua(monkeypatch):
    """Generated, not copied: a field added to the declaration appears in the script."""
    monkeypatch.setattr(wire, "TRAILER_FIELDS", wire.TRAILER_FIELDS + (("nonce", 8, "a nonce"),))
    text = wireshark.lua_dissector()
    assert _protofields(text)["nonce"][1] == "dblp.nonce"
    assert _lua_table(text, "TRAILER")[-1] == f'{{F["nonce"], {wire.TAG_SIZE}, 8}}'


def test_lua_strings_are_escaped():
    assert wireshark._lua_str('a "b" \\ c\n') == '"a \\"b\\" \\\\ c\\010"'
    assert wireshark._lua_str("é") == '"\\195\\169"'


def test_main_writes_the_script(tmp_path, capsys):
    assert wireshark.main(["--out", str(tmp_path / "d.lua")]) == 0
    assert (tmp_path / "d.lua").read_text() == wireshark.lua_dissector()
    assert wireshark.main([]) == 0
    assert capsys.readouterr().out == wireshark.lua_dissector()
