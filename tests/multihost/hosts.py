"""Several hosts on one machine: Linux network namespaces, each with its own address on a
private network (10.77.0.0/24) joined by a bridge in a namespace of its own, so that nothing
touches the machine's real interfaces. Needs root and iproute2; `hosts_or_skip` says why
where they are missing.

Host i (from 1) is the namespace ``{prefix}h{i}`` with address ``10.77.0.{i}`` on its
interface ``eth0``, whose other end is ``h{i}`` on the bridge; `cut` takes that end down, as a
pulled cable would. Its name is ``node{i}``: every host resolves every ``nodeN`` through its
own /etc/hosts (``/etc/netns/NAMESPACE/hosts``, which ``ip netns exec`` mounts over
/etc/hosts), and a daemon started by `start_node` also has that hostname. Every namespace is
deleted on `close`, with its /etc/netns directory, and the processes in it killed."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

SUBNET = "10.77.0"
INTERFACE = "eth0"  # each host's interface towards the others
IP = shutil.which("ip") or "/usr/sbin/ip"
NETNS_ETC = Path("/etc/netns")


def _ip(*argv: str) -> None:
    result = subprocess.run([IP, *argv], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(argv)}: {result.stderr.strip()}")


class Hosts:
    """``count`` hosts on one bridge; `exec_argv` runs a command on one of them."""

    made = 0  # sets of hosts made by this process, for their unique names

    def __init__(self, count: int, prefix: str | None = None) -> None:
        # Unique per test process: several test runs on one machine make hosts of their own.
        Hosts.made += 1
        self.prefix = prefix or f"tm{os.getpid()}n{Hosts.made}"
        self.switch = f"{self.prefix}sw"
        self.names = [f"{self.prefix}h{i}" for i in range(1, count + 1)]
        self.processes: list[subprocess.Popen] = []
        self._made: list[str] = []
        try:
            self._make()
        except BaseException:
            self.close()
            raise

    def _make(self) -> None:
        for name in (self.switch, *self.names):
            _ip("netns", "add", name)
            self._made.append(name)
            _ip("-n", name, "link", "set", "lo", "up")
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, name in enumerate(self.names, start=1):
            port = f"h{i}"
            _ip("link", "add", INTERFACE, "netns", name, "type", "veth", "peer", "name", port, "netns", self.switch)
            _ip("-n", self.switch, "link", "set", port, "master", "br0")
            _ip("-n", self.switch, "link", "set", port, "up")
            _ip("-n", name, "addr", "add", f"{self.address(i)}/24", "dev", INTERFACE)
            _ip("-n", name, "link", "set", INTERFACE, "up")
        names = "".join(f"{self.address(i)} {self.hostname(i)}\n" for i in range(1, len(self.names) + 1))
        for name in self.names:
            (NETNS_ETC / name).mkdir(parents=True, exist_ok=True)
            (NETNS_ETC / name / "hosts").write_text(f"127.0.0.1 localhost\n{names}")

    def address(self, host: int) -> str:
        return f"{SUBNET}.{host}"

    def hostname(self, host: int) -> str:
        return f"node{host}"

    def exec_argv(self, host: int, argv: list[str]) -> list[str]:
        return [IP, "netns", "exec", self.names[host - 1], *argv]

    def start(self, host: int, argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start ``argv`` on ``host`` in a session of its own, its output in ``log``."""
        with open(log, "w") as handle:
            process = subprocess.Popen(
                self.exec_argv(host, argv),
                stdout=handle,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self.processes.append(process)
        return process

    def start_node(self, host: int, argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
        """Start a daemon on ``host`` as on a machine of its own: in the host's network, named
        ``node{host}`` (a UTS namespace), with the host's /etc/hosts. Unlike ``ip netns exec``,
        which mounts a fresh /sys, the machine's /sys (its cgroups, which slurmd needs) stays."""
        name = self.names[host - 1]
        script = 'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"'
        wrapped = ["nsenter", f"--net=/run/netns/{name}", "unshare", "--mount", "--uts", "--propagation", "private"]
        wrapped += ["sh", "-c", script, "sh", self.hostname(host), str(NETNS_ETC / name / "hosts"), *argv]
        with open(log, "w") as handle:
            process = subprocess.Popen(
                wrapped, stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        self.processes.append(process)
        return process

    def run(self, host: int, argv: list[str], timeout: float, env: dict[str, str] | None = None):
        """Run ``argv`` on ``host`` to its end (killed after ``timeout`` s)."""
        return subprocess.run(self.exec_argv(host, argv), capture_output=True, text=True, timeout=timeout, env=env)

    def cut(self, host: int) -> None:
        """Take ``host``'s link to the bridge down: its packets go nowhere, its connections hang."""
        _ip("-n", self.switch, "link", "set", f"h{host}", "down")

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for name in self._made:
            # Anything still running in the namespace was started by this test.
            pids = subprocess.run([IP, "netns", "pids", name], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for process in self.processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
        for name in reversed(self._made):
            subprocess.run([IP, "netns", "delete", name], capture_output=True)
            shutil.rmtree(NETNS_ETC / name, ignore_errors=True)
        self._made.clear()


def hosts_or_skip(count: int) -> Hosts:
    """``count`` hosts, or a skip that says why they cannot be made here."""
    if not Path(IP).exists():
        pytest.skip("several hosts need iproute2's `ip` (not installed)")
    if os.geteuid() != 0:
        pytest.skip("several hosts need root (`ip netns add`)")
    probe = f"tm{os.getpid()}probe"
    result = subprocess.run([IP, "netns", "add", probe], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"`ip netns add` is refused here: {result.stderr.strip()}")
    subprocess.run([IP, "netns", "delete", probe], capture_output=True)
    return Hosts(count)


def wait_listening(hosts: Hosts, source: int, target: int, port: int, timeout: float = 60.0) -> None:
    """Wait until ``target`` accepts connections on ``port`` from ``source`` (Python's sockets:
    there is no ping here)."""
    code = (
        "import socket,sys,time\n"
        f"end=time.time()+{timeout}\n"
        "while time.time()<end:\n"
        "    try:\n"
        f"        socket.create_connection(({hosts.address(target)!r},{port}),timeout=2).close(); sys.exit(0)\n"
        "    except OSError: time.sleep(0.1)\n"
        "sys.exit(1)\n"
    )
    if hosts.run(source, ["python3", "-c", code], timeout=timeout + 10).returncode != 0:
        raise RuntimeError(f"nothing listens at {hosts.address(target)}:{port} after {timeout} s")


def listening_sockets(hosts: Hosts, host: int, pids: list[int] | None = None) -> set[tuple[str, int]]:
    """The (address, port) of each TCP socket listening in ``host`` (those of ``pids`` alone,
    when given); ``*`` is every interface."""
    table = hosts.run(host, ["ss", "-ltnpH"], timeout=30).stdout
    sockets = set()
    for line in table.splitlines():
        if pids is None or any(f"pid={pid}," in line for pid in pids):
            address, port = line.split()[3].rsplit(":", 1)
            sockets.add((address, int(port)))
    return sockets


def listening_addresses(hosts: Hosts, host: int, pids: list[int] | None = None) -> set[str]:
    """The addresses TCP sockets listen on in ``host`` (those of ``pids`` alone, when given)."""
    return {address for address, _ in listening_sockets(hosts, host, pids)}
