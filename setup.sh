#!/usr/bin/env bash
# Prepare this machine for dblp-testbed: Debian packages, Open vSwitch running,
# and the project's virtual environment. Idempotent: a second run installs
# nothing and only (re)starts OVS if it is not running. Used by `make run`,
# `make test`, CI and the Vagrant VM alike, so they cannot drift apart.
set -euo pipefail

cd "$(dirname "$0")"
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
# dataset-fashion-mnist: the paper-regime workload's images, pinned by SHA-256 (workloads/data.py).
# gcc, libc6-dev and python3-dev build the transport's one C file (dblp/_fastpath.c);
# libssl-dev gives it libcrypto, with which it tags and checks keyed jobs' datagrams.
DEB_PACKAGES=(python3-venv mininet openvswitch-switch tcpdump iperf3 ethtool nftables iproute2 iputils-ping procps
              gcc libc6-dev python3-dev libssl-dev
              dataset-fashion-mnist)
# On x86-64, Intel's Multi-Buffer Crypto library computes those tags four times faster
# (AES-GMAC with VAES/AVX-512 where the CPU has them; docs/transport.md, Authentication).
if [ "$(dpkg --print-architecture 2>/dev/null)" = amd64 ]; then
    DEB_PACKAGES+=(libipsec-mb-dev)
fi
# Optional groups, installed only by what uses them: `./setup.sh vagrant tshark`
# before the test suite (`make test`: the Vagrantfile check, Vagrant being a
# Ruby stack nothing else needs, and the Wireshark dissector's), never during it.
# `./setup.sh cluster`: what a machine of a fabric across machines needs (sshd to
# be reached, ssh to reach the others). `./setup.sh rehearsal`: what makes such
# machines on this one for the rehearsal (Docker's engine, debootstrap for its
# image; docs/cluster.md).
declare -A OPTIONAL_PACKAGES=([vagrant]="vagrant" [tshark]="tshark"
                              [cluster]="openssh-server openssh-client"
                              [rehearsal]="docker.io debootstrap openssh-client")
# Every Python package's exact version (torch included): CI, the VM and every
# machine install the same set. Regenerate with `make lock`.
CONSTRAINTS=constraints.txt
# torch's version is the lock's; which build of it (PyTorch's CPU build where
# its index is reachable, else the public one) testbed/install.py decides.
TORCH_VERSION=${TORCH_VERSION:-$(sed -n 's/^torch==\([^+]*\).*/\1/p' "$CONSTRAINTS")}

say() { printf 'setup: %s\n' "$*" >&2; }

need_root() {
    if [ "$(id -u)" != 0 ]; then
        say "must run as root to install Debian packages and start OVS (try: sudo make ...)"
        exit 1
    fi
}

install_debian_packages() {
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ ${#missing[@]} -eq 0 ]; then
        say "Debian packages present"
        return
    fi
    need_root
    say "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # --no-install-recommends keeps the VM/CI image small; mininet would
    # otherwise pull in a desktop's worth of X11 helpers.
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

start_ovs() {
    if ovs-vsctl --timeout=5 show >/dev/null 2>&1; then
        say "Open vSwitch running"
        return
    fi
    need_root
    # OVS 3.1's userspace datapath transmits through one shared packet socket;
    # its default send buffer overflows under a 100-packet queue. The socket
    # takes the default at creation time, so raise it before OVS starts.
    sysctl -qw net.core.wmem_default=4194304 net.core.wmem_max=16777216 \
               net.core.rmem_default=4194304 net.core.rmem_max=16777216 || true
    say "starting Open vSwitch"
    local log
    # Its output only when it fails: in a container without the module (no
    # modprobe) or without CAP_NET_ADMIN, what ovs-ctl says is the diagnosis.
    if ! log=$(/usr/share/openvswitch/scripts/ovs-ctl start --system-id=random 2>&1) \
            || ! ovs-vsctl --timeout=10 show >/dev/null 2>&1; then
        printf '%s\n' "$log" >&2
        say "Open vSwitch did not start (ovs-ctl's output above); in a container, run it with --privileged"
        exit 1
    fi
}

make_venv() {
    local stamp="$VENV/.dblp-setup-stamp" want
    # setup.py and the C core it builds (dblp/_fastpath.c): a change rebuilds it.
    want=$(cat pyproject.toml setup.py dblp/_fastpath.c setup.sh "$CONSTRAINTS" | sha256sum | cut -d' ' -f1)
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$VENV/bin/dblp-testbed" ]; then
        say "virtual environment up to date ($VENV)"
        return
    fi
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip >/dev/null
    install_torch
    say "installing the project into $VENV (first time: a few minutes)"
    "$VENV/bin/pip" install -q -c "$CONSTRAINTS" -e '.[test]'
    link_debian_mininet
    echo "$want" > "$stamp"
}

# torch $TORCH_VERSION: the CPU build from PyTorch's CPU index where that index is
# reachable and has one for this machine, the public build otherwise; says which.
install_torch() {
    local choice why
    choice=$("$VENV/bin/python" testbed/install.py --version "$TORCH_VERSION") || exit 2
    why=$(printf '%s' "$choice" | "$VENV/bin/python" -c 'import json, sys; print(json.load(sys.stdin)["why"])')
    mapfile -t args < <(printf '%s' "$choice" | "$VENV/bin/python" -c \
        'import json, sys; print("\n".join(json.load(sys.stdin)["pip_args"]))')
    say "torch: $why"
    "$VENV/bin/pip" install -q -c "$CONSTRAINTS" "${args[@]}"
    local got want
    # Its recorded version, not `import torch` (numpy, which torch warns about, comes later).
    got=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))')
    want=${args[0]#torch==}
    if [ "$got" = "$want" ]; then
        say "torch installed: $got"
    else
        say "torch installed: $got (pip preferred it from its own configured sources over $want)"
    fi
}

# Mininet's Python code must match the `mnexec` it drives: both come from
# Debian's mininet package. The venv sees only that one module (not the rest
# of Debian's dist-packages) through a .pth entry.
link_debian_mininet() {
    local src=/usr/lib/python3/dist-packages/mininet dir="$VENV/debian-mininet" site
    [ -d "$src" ] || { say "Debian's mininet package is missing ($src)"; exit 1; }
    "$VENV/bin/pip" uninstall -q -y mininet >/dev/null 2>&1 || true
    mkdir -p "$dir"
    ln -sfn "$src" "$dir/mininet"
    site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$(cd "$dir" && pwd)" > "$site/debian-mininet.pth"
}

# --no-ovs: leave Open vSwitch alone (`make unit`, `make lint`: what needs no root and no
# fabric); the Debian packages are still checked, and installed only by root.
extra=() ovs=1
for group in "$@"; do
    if [ "$group" = --no-ovs ]; then
        ovs=0
        continue
    fi
    [ -n "${OPTIONAL_PACKAGES[$group]:-}" ] || { say "unknown group '$group' (known: --no-ovs ${!OPTIONAL_PACKAGES[*]})"; exit 2; }
    extra+=(${OPTIONAL_PACKAGES[$group]})
done
install_debian_packages "${DEB_PACKAGES[@]}" "${extra[@]}"
[ "$ovs" = 0 ] || start_ovs
make_venv
say "ready"
