"""The `isolated` network: guests reach neither each other, nor the host, nor the LAN.

Three layers, each enough for its own part:
- libvirt's network has no `<forward>`, so nothing is routed off the bridge (libvirt adds REJECT
  rules for forwarding from and to it);
- every port of the bridge is isolated (`<port isolated='yes'/>`, on the network and on each
  interface; the kernel's bridge `isolated` port flag): an isolated port cannot talk to another
  isolated port, so two guests cannot reach each other even at layer 2;
- an nftables table of ours (`inet gh_isolated`) drops everything a guest sends to the host
  except DHCP (the guest's address comes from the lease; WinRM finds the guest by it) and the
  replies to connections the host opened; and of what the host opens towards guests it lets out
  only WinRM (5985/5986), DHCP answers and ICMP (neighbour discovery, errors). libvirt itself
  accepts DNS and DHCP from the bridge; a drop in any base chain is final, so ours wins.

`nft` comes from Debian's `nftables` package (scripts/setup.sh installs it); without it an
isolated machine is not started, rather than started open.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from providers.qemu.overlays import run_cmd

ISOLATED_NETWORK = "gh-isolated"
BRIDGE = "gh-iso0"
NFT_TABLE = "gh_isolated"
NFT = "nft"
NFT_TIMEOUT_S = 30.0


def network_xml() -> str:
    return (
        f"<network><name>{ISOLATED_NETWORK}</name>"
        f"<bridge name='{BRIDGE}' stp='on' delay='0'/><port isolated='yes'/><dns enable='no'/>"
        "<ip address='192.168.239.1' netmask='255.255.255.0'>"
        "<dhcp><range start='192.168.239.10' end='192.168.239.250'/></dhcp></ip>"
        "</network>"
    )


def is_port_isolated(xml: str) -> bool:
    """Whether a network definition isolates its ports (an older runner defined it without)."""
    try:
        root = ET.fromstring(xml)
    except ET.ParseError:
        return False
    port = root.find("port")
    return port is not None and port.get("isolated") == "yes"


def nft_ruleset(bridge: str = BRIDGE) -> str:
    """The host firewall for the bridge, replaced as a whole in one nft transaction."""
    return f"""table inet {NFT_TABLE}
delete table inet {NFT_TABLE}
table inet {NFT_TABLE} {{
    chain input {{
        type filter hook input priority -50; policy accept;
        iifname "{bridge}" ct state established,related accept
        iifname "{bridge}" udp dport 67 accept
        iifname "{bridge}" counter drop
    }}
    chain output {{
        type filter hook output priority -50; policy accept;
        oifname "{bridge}" ct state established,related accept
        oifname "{bridge}" udp sport 67 udp dport 68 accept
        oifname "{bridge}" tcp dport {{ 5985, 5986 }} accept
        oifname "{bridge}" meta l4proto {{ icmp, ipv6-icmp }} accept
        oifname "{bridge}" counter drop
    }}
    chain forward {{
        type filter hook forward priority -50; policy accept;
        iifname "{bridge}" counter drop
        oifname "{bridge}" counter drop
    }}
}}
"""


async def apply_host_firewall(bridge: str = BRIDGE) -> None:
    """Install (or replace) the nftables table that keeps guests on `bridge` off the host.

    Raises:
        ProviderError: nft is missing, refused the rules, or did not finish in time.
    """
    await run_cmd([NFT, "-f", "-"], timeout=NFT_TIMEOUT_S, what="isolated network: the host firewall",
                  stdin=nft_ruleset(bridge).encode(),
                  missing="nft is not installed (apt-get install nftables); an isolated machine is not started "
                          "without its host firewall")
