"""A Wireshark Lua dissector generated from ``dblp.wire``'s declaration.

``python -m dblp.wireshark > dblp.lua`` writes it; ``tshark -X
lua_script:dblp.lua`` (or Wireshark with the file in its personal plugins
folder) then shows DBLP datagrams field by field instead of bare UDP.

Why generated: the header layout lives in one place (``wire.HEADER_FIELDS``,
``wire.TRAILER_FIELDS``, the ``MsgType``/``Flag`` enums), as for the packer
and the scapy layer. A dissector written by hand would drift from it the
first time a field moved; this one is rebuilt from it, and the tests decode
a real capture with it and with the scapy layer and compare every field.

What the payload holds per message type is said in prose in ``wire``'s
docstring; ``PAYLOADS`` below is its one declaration in code (a new message
type without an entry fails at import).

How traffic is found, three ways, all in the generated script:
- port-based: the ``udp.port`` table on ``dblp.server.DEFAULT_PORT``, moved
  with the preference ``dblp.udp_port`` (``-o dblp.udp_port:PORT``; 0 = none);
- "Decode As" (``-d udp.port==PORT,dblp``), for a job on another port;
- heuristic (``dblp_udp``, on by default): any UDP datagram whose size,
  magic, version, type and length field are those of a DBLP message, which
  is how sharded mode's rank-to-rank traffic between ephemeral ports is
  found. ``--disable-heuristic dblp_udp`` turns it off.

Chunks larger than one MTU (``chunk_bytes = 8192``, the prototype's) leave
as IP fragments; Wireshark reassembles them (``ip.defragment``, on by
default) before the UDP dissector, so the dissector sees, and accepts, the
whole DATA datagram, up to ``MAX_DATA_DATAGRAM``.

The MAC trailer is shown, not verified: the job's secret never travels, and
a dissector that asked for it would put it in a preferences file.
"""
from __future__ import annotations

import argparse
import sys
from typing import NamedTuple

from . import wire
from .server import DEFAULT_PORT

PROTO = "dblp"
#: The longest DATA datagram any job may send (``wire.MAX_CHUNK_BYTES`` of floats): jobs
#: with chunks larger than one MTU (``chunk_bytes``, the prototype's 8192) send DATA that
#: the kernel IP-fragments and Wireshark reassembles; every other message is at most
#: ``wire.MAX_DATAGRAM``.
MAX_DATA_DATAGRAM = wire.datagram_size(wire.MAX_CHUNK_BYTES)

# Lua's ftypes per struct code of the header declaration.
_FTYPES = {"B": "UINT8", "H": "UINT16", "I": "UINT32", "Q": "UINT64"}


class Bitmap(NamedTuple):
    """One chunk bitmap in a payload: ``ceil(count / 8)`` bytes, numpy ``packbits`` order."""

    name: str
    description: str


class Tail(NamedTuple):
    """A fixed-size field after a payload's bitmaps (network order)."""

    name: str
    ftype: str  # Lua ftypes name
    size: int
    description: str


class Payload(NamedTuple):
    """What a message type's ``length`` bytes of payload hold."""

    kind: str  # "empty", "floats" (little-endian float32), "bitmaps", "json"
    bitmaps: tuple[Bitmap, ...] = ()
    tail: tuple[Tail, ...] = ()


_HELD = Bitmap("held", "chunks the receiver holds (bit set = held)")
PAYLOADS: dict[wire.MsgType, Payload] = {
    wire.MsgType.DATA: Payload("floats"),
    wire.MsgType.PROBE: Payload("empty"),
    wire.MsgType.BITMAP: Payload("bitmaps", (_HELD,)),
    wire.MsgType.STOP: Payload("bitmaps", (_HELD,)),
    wire.MsgType.FINAL: Payload("bitmaps", (
        Bitmap("dropped", "chunks every replica zero-fills in this round's pull"),
        Bitmap("taken", "chunks of this member's push that the aggregate took")), (
        Tail("norm_sumsq", "DOUBLE", 8, "the part's kept elements' sum of squares, "
             "scaled back per delivered count (the detector's norm figures)"),
        Tail("norm_kept", "UINT32", 4, "elements of the part the norm figures kept"))),
    wire.MsgType.DONE: Payload("empty"),
    wire.MsgType.HELLO: Payload("json"),
    wire.MsgType.WELCOME: Payload("json"),
    wire.MsgType.CHALLENGE: Payload("json"),
}
assert set(PAYLOADS) == set(wire.MsgType), "every message type needs a PAYLOADS entry"
assert {p.kind for p in PAYLOADS.values()} <= {"empty", "floats", "bitmaps", "json"}
assert sum(t.size for t in PAYLOADS[wire.MsgType.FINAL].tail) == wire.FINAL_NORM.size


class Field(NamedTuple):
    """One Wireshark field the dissector registers (``abbrev`` is what ``-e``/filters use)."""

    abbrev: str
    label: str
    ftype: str  # Lua ftypes name
    base: str  # Lua base.* name, or a bit width for booleans
    description: str
    mask: int | None = None


def _header_fields() -> list[Field]:
    out = []
    for name, code, desc in wire.HEADER_FIELDS:
        base = "HEX" if name in ("magic", "flags") else "DEC"
        out.append(Field(f"{PROTO}.{name}", name, _FTYPES[code], base, desc))
    return out


def _flag_fields() -> list[Field]:
    bits = _FTYPES[dict((n, c) for n, c, _ in wire.HEADER_FIELDS)["flags"]]
    width = {"UINT8": "8", "UINT16": "16", "UINT32": "32"}[bits]
    return [Field(f"{PROTO}.flags.{f.name.lower()}", str(f.name), "BOOLEAN", width,
                  f"flag bit 0x{int(f):02x}", int(f)) for f in wire.Flag if f.name]


def _bitmaps() -> list[Bitmap]:
    seen: dict[str, Bitmap] = {}
    for p in PAYLOADS.values():
        for b in p.bitmaps:
            seen.setdefault(b.name, b)
    return list(seen.values())


def _payload_fields() -> list[Field]:
    out = [Field(f"{PROTO}.payload", "payload", "BYTES", "NONE", "the length bytes after the header"),
           # A double, not Wireshark's FLOAT (printed to 6 digits): 15 digits
           # print every float32 exactly, so a decoded chunk can be compared.
           Field(f"{PROTO}.value", "value", "DOUBLE", "NONE",
                 "one float32 element of a DATA chunk (little-endian)")]
    for b in _bitmaps():
        out.append(Field(f"{PROTO}.{b.name}", b.name, "BYTES", "NONE", b.description))
        out.append(Field(f"{PROTO}.{b.name}.chunks", f"{b.name} chunks", "UINT32", "DEC",
                         f"chunks marked in the {b.name} bitmap (of count)"))
    for p in PAYLOADS.values():
        for t in p.tail:
            out.append(Field(f"{PROTO}.{t.name}", t.name, t.ftype, "NONE" if t.ftype == "DOUBLE"
                             else "DEC", t.description))
    out.append(Field(f"{PROTO}.json", "json", "STRING", "NONE", "HELLO/CHALLENGE/WELCOME: the JSON object"))
    return out


def _trailer_fields() -> list[Field]:
    return [Field(f"{PROTO}.{name}", name, "BYTES", "NONE", desc)
            for name, _size, desc in wire.TRAILER_FIELDS]


def fields() -> list[Field]:
    """Every field the generated dissector registers, in tree order."""
    return _header_fields() + _flag_fields() + _payload_fields() + _trailer_fields()


def _lua_str(s: str) -> str:
    """A Lua 5.2 string literal (non-ASCII as decimal byte escapes: 5.2 has no \\u)."""
    out = []
    for b in s.encode():
        c = chr(b)
        if c in '"\\':
            out.append("\\" + c)
        elif 32 <= b < 127:
            out.append(c)
        else:
            out.append(f"\\{b:03d}")
    return '"' + "".join(out) + '"'


def _var(f: Field) -> str:
    """The Lua table key of a field: its abbreviation without the protocol."""
    return _lua_str(f.abbrev[len(PROTO) + 1:])


def _protofield(f: Field) -> str:
    base = f.base if f.base.isdigit() else f"base.{f.base}"
    valuestring = "TYPES" if f.abbrev == f"{PROTO}.type" else "nil"
    mask = "nil" if f.mask is None else f"0x{f.mask:x}"
    return (f"F[{_var(f)}] = ProtoField.new({_lua_str(f.label)}, {_lua_str(f.abbrev)}, "
            f"ftypes.{f.ftype}, {valuestring}, {base}, {mask}, {_lua_str(f.description)})")


def _table(rows: list[str], indent: str = "    ") -> str:
    return "{\n" + "".join(f"{indent}{r},\n" for r in rows) + "}"


def lua_dissector() -> str:
    """The whole Lua script (Wireshark 3.x/4.x, Lua 5.2)."""
    flags = _flag_fields()
    header_rows = []
    for name, _code, _desc in wire.HEADER_FIELDS:
        off, size = wire.FIELD_OFFSETS[name]
        bits = "{" + ", ".join(f"F[{_var(f)}]" for f in flags) + "}" if name == "flags" else "nil"
        header_rows.append(f"{{F[{_lua_str(name)}], {off}, {size}, {bits}}}")
    off = 0
    trailer_rows = []
    for name, size, _desc in wire.TRAILER_FIELDS:
        trailer_rows.append(f"{{F[{_lua_str(name)}], {off}, {size}}}")
        off += size
    payload_rows = []
    for t, p in sorted(PAYLOADS.items()):
        bitmaps = ", ".join(f"{{F[{_lua_str(b.name)}], F[{_lua_str(b.name + '.chunks')}]}}"
                            for b in p.bitmaps)
        tail = ", ".join(f"{{F[{_lua_str(x.name)}], {x.size}}}" for x in p.tail)
        payload_rows.append(f"[{int(t)}] = {{kind = {_lua_str(p.kind)}, bitmaps = {{{bitmaps}}}, "
                            f"tail = {{{tail}}}}}")
    consts = {
        "HEADER_SIZE": wire.HEADER_SIZE, "TAG_SIZE": wire.TAG_SIZE,
        "MAX_DATAGRAM": wire.MAX_DATAGRAM, "MAX_DATA_DATAGRAM": MAX_DATA_DATAGRAM,
        "DATA": int(wire.MsgType.DATA), "MAGIC": f"0x{wire.MAGIC:04X}",
        "VERSION": wire.VERSION, "DEFAULT_PORT": DEFAULT_PORT,
    }
    # Lua's TvbRange:uint() reads at most 4 bytes: the 64-bit session is only shown.
    offsets = {name: wire.FIELD_OFFSETS[name] for name, code, _ in wire.HEADER_FIELDS if code != "Q"}
    flag_names = ", ".join(f"{{0x{int(f):02x}, {_lua_str(str(f.name))}}}" for f in wire.Flag if f.name)
    return _TEMPLATE.format(
        version=wire.VERSION,
        proto=_lua_str(PROTO),
        consts="\n".join(f"local {k} = {v}" for k, v in consts.items()),
        offsets=_table([f"{n} = {{{o}, {s}}}" for n, (o, s) in offsets.items()]),
        types=_table([f"[{int(t)}] = {_lua_str(str(t.name))}" for t in wire.MsgType]),
        flag_names="{" + flag_names + "}",
        fields="\n".join(_protofield(f) for f in fields()),
        field_list=_table([f"F[{_var(f)}]" for f in fields()]),
        header=_table(header_rows),
        trailer=_table(trailer_rows),
        payloads=_table(payload_rows),
    )


# The control flow is written here once; every name, offset, size, value
# string and constant in it is filled in from the declaration above.
_TEMPLATE = """\
-- DBLP dissector, generated by `python -m dblp.wireshark` from dblp/wire.py
-- (wire version {version}). Do not edit: regenerate after changing the wire format.
-- Finds DBLP on UDP by port (preference dblp.udp_port), "Decode As", and a
-- heuristic (dblp_udp) that checks size, magic, version, type and length.
local dblp = Proto({proto}, "DBLP bounded-loss gradient transport")

{consts}

-- {{offset, size}} of the header fields the dissector reads itself.
local OFF = {offsets}

local TYPES = {types}
local FLAG_NAMES = {flag_names}

local F = {{}}
{fields}
dblp.fields = {field_list}

-- {{field, offset, size, flag bits}} for every header field, in wire order.
local HEADER = {header}
-- {{field, offset from the end of the payload, size}} for every trailer field.
local TRAILER = {trailer}
-- What each message type's payload holds.
local PAYLOADS = {payloads}

local malformed = ProtoExpert.new("dblp.malformed", "Malformed DBLP message",
                                  expert.group.MALFORMED, expert.severity.ERROR)
local truncated = ProtoExpert.new("dblp.truncated", "DBLP message cut by the snap length",
                                  expert.group.UNDECODED, expert.severity.NOTE)
dblp.experts = {{malformed, truncated}}

local json = Dissector.get("json")

local function read(tvb, name)
    return tvb(OFF[name][1], OFF[name][2]):uint()
end

-- Whether tvb is a DBLP message of this wire version. Only the header must be
-- captured: the harness records runs with a short snap length (headers only).
-- DATA may be longer than one MTU (a job's chunk_bytes, e.g. the prototype's 8 KB):
-- Wireshark reassembles its IP fragments before the UDP dissector, which hands
-- over the whole datagram. Every other message fits one unfragmented datagram.
local function looks_like_dblp(tvb)
    local n = tvb:reported_len()
    if tvb:len() < HEADER_SIZE or n < HEADER_SIZE + TAG_SIZE or n > MAX_DATA_DATAGRAM then
        return false
    end
    if n > MAX_DATAGRAM and read(tvb, "type") ~= DATA then
        return false
    end
    return read(tvb, "magic") == MAGIC and read(tvb, "version") == VERSION
        and TYPES[read(tvb, "type")] ~= nil
        and read(tvb, "length") == n - HEADER_SIZE - TAG_SIZE
end

local function set_bits(range, nbits)
    local total = 0
    for i = 0, range:len() - 1 do
        local byte = range(i, 1):uint()
        for bit = 7, 0, -1 do
            local idx = i * 8 + (7 - bit)
            if idx < nbits and math.floor(byte / 2 ^ bit) % 2 == 1 then
                total = total + 1
            end
        end
    end
    return total
end

local function dissect_payload(tvb, pinfo, tree, mtype, length)
    if length == 0 then
        return
    end
    local body = tvb(HEADER_SIZE, length)
    local item = tree:add(F["payload"], body)
    local kind = PAYLOADS[mtype]
    if kind.kind == "floats" then
        for i = 0, math.floor(length / 4) - 1 do
            local v = body(i * 4, 4)
            item:add(F["value"], v, v:le_float())
        end
    elseif kind.kind == "bitmaps" then
        local count = read(tvb, "count")
        local size = math.floor((count + 7) / 8)
        for i, bitmap in ipairs(kind.bitmaps) do
            local off = (i - 1) * size
            if off + size > length then
                item:add_proto_expert_info(malformed, "payload shorter than its bitmaps")
                return
            end
            if size > 0 then
                local range = body(off, size)
                local b = item:add(bitmap[1], range)
                b:add(bitmap[2], range, set_bits(range, count))
            end
        end
        local off = #kind.bitmaps * size
        for _, field in ipairs(kind.tail) do
            if off + field[2] > length then
                item:add_proto_expert_info(malformed, "payload shorter than its fields")
                return
            end
            item:add(field[1], body(off, field[2]))
            off = off + field[2]
        end
    elseif kind.kind == "json" then
        item:add(F["json"], body)
        if json ~= nil then
            json:call(body:tvb(), pinfo, tree)
        end
    end
end

local function info(tvb, mtype)
    local flags = read(tvb, "flags")
    local names = {{}}
    for _, f in ipairs(FLAG_NAMES) do
        if math.floor(flags / f[1]) % 2 == 1 then
            names[#names + 1] = f[2]
        end
    end
    local s = string.format("%s src=%d part=%d round=%d index=%d/%d",
        TYPES[mtype], read(tvb, "src"), read(tvb, "part"), read(tvb, "round"),
        read(tvb, "index"), read(tvb, "count"))
    if #names > 0 then
        s = s .. " [" .. table.concat(names, ",") .. "]"
    end
    return s
end

local function dissect(tvb, pinfo, tree)
    local n = tvb:reported_len()
    local root = tree:add(dblp, tvb())
    if not looks_like_dblp(tvb) then
        root:add_proto_expert_info(malformed, "not a whole DBLP version " .. VERSION .. " message")
        pinfo.cols.protocol = "DBLP"
        return n
    end
    for _, h in ipairs(HEADER) do
        local item = root:add(h[1], tvb(h[2], h[3]))
        if h[4] ~= nil then
            for _, bit in ipairs(h[4]) do
                item:add(bit, tvb(h[2], h[3]))
            end
        end
    end
    local mtype = read(tvb, "type")
    local length = read(tvb, "length")
    if tvb:len() < n then
        root:add_proto_expert_info(truncated, string.format(
            "capture holds %d of %d bytes (snap length): payload and trailer not shown",
            tvb:len(), n))
    else
        dissect_payload(tvb, pinfo, root, mtype, length)
        for _, t in ipairs(TRAILER) do
            root:add(t[1], tvb(HEADER_SIZE + length + t[2], t[3]))
        end
    end
    root:append_text(", " .. TYPES[mtype])
    pinfo.cols.protocol = "DBLP"
    pinfo.cols.info = info(tvb, mtype)
    return n
end

function dblp.dissector(tvb, pinfo, tree)
    return dissect(tvb, pinfo, tree)
end

dblp:register_heuristic("udp", function(tvb, pinfo, tree)
    if not looks_like_dblp(tvb) then
        return false
    end
    dissect(tvb, pinfo, tree)
    return true
end)

local udp_port = DissectorTable.get("udp.port")
dblp.prefs.udp_port = Pref.uint("UDP port", DEFAULT_PORT,
    "UDP port of a DBLP job (0: none; \\"Decode As\\" and the heuristic still apply)")
local registered = DEFAULT_PORT
udp_port:add(DEFAULT_PORT, dblp)

function dblp.prefs_changed()
    if registered ~= 0 then
        udp_port:remove(registered, dblp)
    end
    registered = dblp.prefs.udp_port
    if registered ~= 0 then
        udp_port:add(registered, dblp)
    end
end
"""


def main(argv: list[str] | None = None) -> int:
    """``python -m dblp.wireshark [-o FILE]``: write the dissector (stdout by default)."""
    ap = argparse.ArgumentParser(prog="python -m dblp.wireshark", description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--out", help="write the Lua script here instead of stdout")
    args = ap.parse_args(argv)
    text = lua_dissector()
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
