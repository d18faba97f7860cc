"""The suite's hosts: three network namespaces on a private bridge, or one host when namespaces cannot be made.

``Hosts.create(tag)`` makes the namespaces ``stc-<tag>-db``, ``-h2`` and ``-h3``, each with a veth
pair whose outer end joins the bridge ``stc<tag>br`` (in the root namespace, address .254, so the
runner reaches every host). Host addresses are ``10.<a>.<b>.1`` (db), ``.2`` (h2) and ``.3`` (h3)
in a /24 chosen from the tag. Nothing is routed beyond the bridge: traffic stays between the
namespaces this run made. ``close()`` deletes the namespaces and the bridge; a record in
``/tmp/stint-chaos-<tag>.json`` lets the next run remove what a killed run left behind.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

NAMES = ("db", "h2", "h3")
RECORD_DIR = Path("/tmp")  # noqa: S108 - records of our own namespaces, root-only machine


class HostsError(RuntimeError):
    """A namespace, link or qdisc could not be set up."""


def _run(argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)  # noqa: S603 - fixed tools
    if check and result.returncode != 0:
        raise HostsError(f"{' '.join(argv)}: {result.stderr.strip() or result.stdout.strip()}")
    return result


def namespaces_possible() -> tuple[bool, str]:
    """Return (True, "") when this process may make network namespaces, else (False, why)."""
    if os.geteuid() != 0:
        return False, "not root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"`{tool}` is missing"
    return True, ""


@dataclass(slots=True)
class Hosts:
    """Where each host's processes run and how to reach it; ``isolated`` False means one shared host."""

    tag: str
    isolated: bool
    addresses: dict[str, str]
    namespaces: dict[str, str] = field(default_factory=dict)
    bridge: str = ""
    bridge_address: str = ""  # the root namespace's address on the bridge (reachable from every host)
    outer: dict[str, str] = field(default_factory=dict)  # host -> the veth end on the bridge
    note: str = ""
    netem: bool = False  # the kernel has sch_netem (tc delay and loss)
    iptables: str = ""  # the iptables command that works here ("" when none)

    @classmethod
    def single(cls, tag: str, why: str) -> Hosts:
        """One host (loopback) for every role; ``why`` says why namespaces were not made."""
        return cls(tag=tag, isolated=False, addresses=dict.fromkeys(NAMES, "127.0.0.1"), note=why)

    @classmethod
    def create(cls, tag: str) -> Hosts:
        """Make the bridge and the three namespaces; raise HostsError (after cleaning up) on failure."""
        cleanup_stale()
        octet = int(tag, 16)
        subnet = f"10.{200 + octet // 256 % 50}.{octet % 256}"
        hosts = cls(
            tag=tag,
            isolated=True,
            addresses={name: f"{subnet}.{i}" for i, name in enumerate(NAMES, start=1)},
            namespaces={name: f"stc-{tag}-{name}" for name in NAMES},
            bridge=f"stc{tag}br",
            bridge_address=f"{subnet}.254",
            outer={name: f"stc{tag}{name}o" for name in NAMES},
        )
        (RECORD_DIR / f"stint-chaos-{tag}.json").write_text(json.dumps({"pid": os.getpid(), "tag": tag}))
        try:
            _run(["ip", "link", "add", hosts.bridge, "type", "bridge"])
            _run(["ip", "addr", "add", f"{subnet}.254/24", "dev", hosts.bridge])
            _run(["ip", "link", "set", hosts.bridge, "up"])
            for name in NAMES:
                ns, outer, inner = hosts.namespaces[name], hosts.outer[name], f"stc{tag}{name}i"
                _run(["ip", "netns", "add", ns])
                _run(["ip", "link", "add", outer, "type", "veth", "peer", "name", inner])
                _run(["ip", "link", "set", inner, "netns", ns])
                _run(["ip", "link", "set", outer, "master", hosts.bridge])
                _run(["ip", "link", "set", outer, "up"])
                _run(["ip", "-n", ns, "link", "set", inner, "name", "eth0"])
                _run(["ip", "-n", ns, "addr", "add", f"{hosts.addresses[name]}/24", "dev", "eth0"])
                _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
                _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        except HostsError:
            hosts.close()
            raise
        hosts.netem = (
            _run(
                hosts.prefix("h2") + ["tc", "qdisc", "replace", "dev", "eth0", "root", "netem", "delay", "0ms"],
                check=False,
            ).returncode
            == 0
        )
        _run(hosts.prefix("h2") + ["tc", "qdisc", "del", "dev", "eth0", "root"], check=False)
        for tool in ("iptables-legacy", "iptables"):
            if shutil.which(tool) and _run(hosts.prefix("h3") + [tool, "-L", "-n"], check=False).returncode == 0:
                hosts.iptables = tool
                break
        return hosts

    def prefix(self, host: str) -> list[str]:
        """The argv prefix that runs a command on ``host`` (empty on one host)."""
        return ["ip", "netns", "exec", self.namespaces[host]] if self.isolated else []

    def describe(self) -> str:
        """One line saying how the hosts were made."""
        if self.isolated:
            return "3 hosts (network namespaces): " + ", ".join(f"{n} {a}" for n, a in self.addresses.items())
        return f"ONE HOST (namespaces not made: {self.note}); partition and latency scenarios are not run"

    # -- faults on links ---------------------------------------------------------------------

    def _netem(self, host: str, spec: list[str]) -> None:
        """Apply ``tc netem <spec>`` to traffic leaving ``host`` and traffic entering it."""
        _run(
            [
                "ip",
                "netns",
                "exec",
                self.namespaces[host],
                "tc",
                "qdisc",
                "replace",
                "dev",
                "eth0",
                "root",
                "netem",
                *spec,
            ]
        )
        _run(["tc", "qdisc", "replace", "dev", self.outer[host], "root", "netem", *spec])

    def delay_all(self, ms: int) -> None:
        """Add ``ms`` of one-way delay on every host's egress (so host-to-host traffic waits ``ms`` each way)."""
        for host in NAMES:
            _run(
                ["ip", "netns", "exec", self.namespaces[host], "tc", "qdisc", "replace", "dev", "eth0", "root",
                 "netem", "delay", f"{ms}ms"]
            )  # fmt: skip

    def can_partition(self) -> str:
        """Empty when ``partition`` works here, else why not."""
        if not self.isolated:
            return "needs network namespaces (one-host run)"
        if not (self.iptables or self.netem):
            return "neither iptables nor sch_netem is available"
        return ""

    def can_delay(self) -> str:
        """Empty when links can be delayed here (``delay_all``, or the runner's link proxy), else why not."""
        if not self.isolated:
            return "needs network namespaces (one-host run)"
        return ""

    def partition(self, host: str) -> None:
        """Silently drop every packet between ``host`` and the db host (both directions); ``host`` keeps running.

        iptables DROP rules inside ``host``'s namespace when iptables works, else netem 100% loss.
        """
        if self.iptables:
            db = self.addresses["db"]
            _run([*self.prefix(host), self.iptables, "-A", "OUTPUT", "-d", db, "-j", "DROP"])
            _run([*self.prefix(host), self.iptables, "-A", "INPUT", "-s", db, "-j", "DROP"])
        else:
            self._netem(host, ["loss", "100%"])

    def heal(self) -> None:
        """Remove every qdisc and iptables rule this class added (idempotent)."""
        if not self.isolated:
            return
        for host in NAMES:
            if self.netem:
                _run([*self.prefix(host), "tc", "qdisc", "del", "dev", "eth0", "root"], check=False)
                _run(["tc", "qdisc", "del", "dev", self.outer[host], "root"], check=False)
            if self.iptables:
                _run([*self.prefix(host), self.iptables, "-F"], check=False)

    def close(self) -> None:
        """Delete the namespaces (their veths go with them) and the bridge; forget the record."""
        if self.isolated:
            for ns in self.namespaces.values():
                _kill_members(ns)
                _run(["ip", "netns", "del", ns], check=False)
            for outer in self.outer.values():
                _run(["ip", "link", "del", outer], check=False)
            if self.bridge:
                _run(["ip", "link", "del", self.bridge], check=False)
        with contextlib.suppress(OSError):
            (RECORD_DIR / f"stint-chaos-{self.tag}.json").unlink()


def _kill_members(namespace: str) -> None:
    """SIGKILL every process still running in ``namespace`` (``ip netns pids``)."""
    result = _run(["ip", "netns", "pids", namespace], check=False)
    for pid in result.stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def cleanup_stale() -> list[str]:
    """Remove the namespaces and bridges of earlier runs whose process is gone; return their tags."""
    removed = []
    for record in RECORD_DIR.glob("stint-chaos-*.json"):
        try:
            data = json.loads(record.read_text())
            pid, tag = int(data["pid"]), str(data["tag"])
        except (OSError, ValueError, KeyError):
            continue
        if pid == os.getpid() or Path(f"/proc/{pid}").exists():
            continue
        for name in NAMES:
            _kill_members(f"stc-{tag}-{name}")  # servers and Stint processes a killed run left running
            _run(["ip", "netns", "del", f"stc-{tag}-{name}"], check=False)
            _run(["ip", "link", "del", f"stc{tag}{name}o"], check=False)
        _run(["ip", "link", "del", f"stc{tag}br"], check=False)
        with contextlib.suppress(OSError):
            record.unlink()
        removed.append(tag)
    return removed
