"""The process that starts a launcher's ranks: it imports torch and the trainer once, then forks
each rank from itself.

Importing torch and the training engine costs several CPU seconds per process. A launcher
that started each rank as a fresh ``python -m tokenmill.train.worker`` paid that once per rank
and again on every restart; forked from this server, a rank starts with everything loaded. The
server imports nothing that starts a device (CUDA initialises in each rank, after the fork), and
it is started by the supervisor with the ranks' shared environment (``OMP_NUM_THREADS``,
``PYTHONSAFEPATH``, ...), so what libraries read at import is what each rank would have read.

Protocol, one line per message on two pipes whose descriptors are this module's arguments:

- supervisor -> server: first ``{"preload": [MODULE, ...]}``, what to import before any fork;
  then a JSON object ``{"command": [...], "env": {...}, "cwd": "..."}`` per rank; the server
  forks the rank and answers ``started PID``;
- server -> supervisor: ``exited PID STATUS`` when a rank ends (STATUS as
  `subprocess.Popen.returncode`: -N when signal N killed it).

A rank's command line (`ps`) is the server's; its name (``ps -o comm``, psutil's ``name()``)
is ``tokenmill:RANK``. Each rank runs in a session of its own (the supervisor signals its
whole group) and dies with the server (lifecycle.die_with_parent); the server dies with the
supervisor, and when the supervisor's pipe closes it kills whatever rank is left and exits.
"""

from __future__ import annotations

import atexit
import importlib
import json
import logging
import os
import runpy
import select
import signal
import subprocess
import sys
import warnings

from tokenmill.entry import print_traceback

# What every training rank imports before its first step; the rest it imports after the fork.
TRAINING_PRELOAD = (
    "torch",
    "torch.distributed",
    "tokenmill.entry",  # what tokenmill.train.worker imports (itself run as __main__ after the fork)
    "tokenmill.train.cli",
    "tokenmill.train.loop",
    "tokenmill.train.checkpoint",
)
POLL_S = 0.05


def run_rank(request: dict, server_pid: int) -> int:
    """In the forked child: become the rank ``request`` describes (``command``: a Python command
    line, ``[python, -m MODULE | -c CODE | SCRIPT, ARGS...]``) and run it as the interpreter
    would; its exit status."""
    from tokenmill.train.lifecycle import die_with_parent, name_process

    die_with_parent(expected_parent=server_pid)
    name_process(f"tokenmill:{request['env'].get('RANK', '?')}")  # `ps` shows the server's command line
    for sig in (signal.SIGTERM, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    _, first, *rest = request["command"]
    try:
        if first == "-m":
            sys.argv = rest  # runpy puts the module's path first, as `python -m` does
            runpy.run_module(rest[0], run_name="__main__", alter_sys=True)
        elif first == "-c":
            sys.argv = ["-c", *rest[1:]]
            exec(compile(rest[0], "<string>", "exec"), {"__name__": "__main__"})
        else:
            sys.argv = [first, *rest]
            runpy.run_path(first, run_name="__main__")
    except SystemExit as exit_:
        if exit_.code is None or isinstance(exit_.code, int):
            return exit_.code or 0
        print(exit_.code, file=sys.stderr)
        return 1
    return 0


def fork_rank(request: dict, pipes: tuple[int, int]) -> int:
    """Fork one rank; its pid."""
    server_pid = os.getpid()
    in_session, in_session_write = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12 warns of any fork beside a second thread; the server's only other thread
        # is its parent watch (lifecycle.die_with_parent), which sleeps and holds no lock a
        # rank could inherit, so the warning would only reach the user's terminal.
        warnings.filterwarnings(
            "ignore", message=r".*use of fork\(\) may lead to deadlocks", category=DeprecationWarning
        )
        pid = os.fork()
    if pid:
        os.close(in_session_write)
        os.read(in_session, 1)  # the supervisor signals the rank's group: it must exist first
        os.close(in_session)
        return pid
    status = 1
    try:
        for fd in (*pipes, in_session):  # the supervisor's pipes are the server's alone
            os.close(fd)
        os.setsid()
        os.write(in_session_write, b".")
        os.close(in_session_write)
        status = run_rank(request, server_pid)
    except BaseException:  # what `python -m` would print for an uncaught exception, redacted
        print_traceback()
    finally:
        try:  # what the interpreter does at exit, then leave without running the server's code
            atexit._run_exitfuncs()
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(status)
    raise AssertionError("unreachable")


def reap(children: set[int], events: int) -> None:
    """Report every rank that has ended."""
    while children:
        try:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        os.write(events, f"exited {pid} {os.waitstatus_to_exitcode(wait_status)}\n".encode())


def kill_all(children: set[int]) -> None:
    for pid in children:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in list(children):
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def serve(commands: int, events: int, supervisor_pid: int) -> None:
    from tokenmill.train.lifecycle import die_with_parent

    die_with_parent(expected_parent=supervisor_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the supervisor's to handle
    children: set[int] = set()
    pending = b""
    preloaded = False
    try:
        while True:
            ready, _, _ = select.select([commands], [], [], POLL_S)
            if ready:
                chunk = os.read(commands, 1 << 16)
                if not chunk:  # the supervisor is done, or gone
                    return
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if not preloaded:  # the first line: what to import before any fork
                        for module in json.loads(line)["preload"]:
                            importlib.import_module(module)
                        preloaded = True
                        continue
                    pid = fork_rank(json.loads(line), (commands, events))
                    children.add(pid)
                    os.write(events, f"started {pid}\n".encode())
            reap(children, events)
    finally:
        kill_all(children)


class RankProcess:
    """A rank forked by the server, seen from the supervisor as a `subprocess.Popen`."""

    def __init__(self, server: RankServer, pid: int) -> None:
        self.server = server
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.server.collect()
            self.server.killed_with_server(self.pid)
            self.returncode = self.server.exits.get(self.pid)
        return self.returncode


class RankServer:
    """The supervisor's side: starts the server, asks it for ranks, learns how they end."""

    def __init__(self, env: dict[str, str], preload: tuple[str, ...] = ()) -> None:
        commands_read, self._commands = os.pipe()
        self._events, events_write = os.pipe()
        os.set_blocking(self._events, False)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", __name__, str(commands_read), str(events_write), str(os.getpid())],
                env=env,
                pass_fds=(commands_read, events_write),
                start_new_session=True,  # Ctrl-C at the terminal reaches the supervisor alone
            )
        finally:
            os.close(commands_read)
            os.close(events_write)
        os.write(self._commands, (json.dumps({"preload": list(preload)}) + "\n").encode())
        self.exits: dict[int, int] = {}  # pid -> status
        self._started: list[int] = []
        self._closed = False
        self._pending = b""

    def start(self, command: list[str], env: dict[str, str]) -> RankProcess:
        """Fork one rank running ``command`` (``[python, -m MODULE | -c CODE | SCRIPT, ARGS...]``)
        with ``env``; waits while the server imports its preload (the first rank) and forks."""
        if len(command) < 2 or command[0] != sys.executable:
            raise ValueError(f"not a command of this Python: {command}")
        request = {"command": command, "env": env, "cwd": os.getcwd()}
        os.write(self._commands, (json.dumps(request) + "\n").encode())
        while not self._started:
            select.select([self._events], [], [], POLL_S)
            if not self.collect():
                raise OSError(f"the rank server ended (exit status {self.process.wait()})")
        return RankProcess(self, self._started.pop(0))

    def collect(self) -> bool:
        """Read what the server has said; False once it has closed its pipe."""
        while not self._closed:
            try:
                chunk = os.read(self._events, 1 << 16)
            except BlockingIOError:
                return True
            if not chunk:  # the server is gone, and its ranks with it (die_with_parent)
                self._closed = True
                break
            self._pending += chunk
            *lines, self._pending = self._pending.split(b"\n")
            for line in lines:
                word, pid, *status = line.decode().split()
                if word == "started":
                    self._started.append(int(pid))
                else:
                    self.exits[int(pid)] = int(status[0])
        return False

    def killed_with_server(self, pid: int) -> None:
        """A rank whose server died before saying how it ended died of SIGKILL with it."""
        if self._closed:
            self.exits.setdefault(pid, -signal.SIGKILL)

    def close(self) -> None:
        """End the server (and any rank still running: it kills them on its way out)."""
        os.close(self._commands)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.collect()  # to the end of what it said: every rank's end is known from here on
        self._closed = True
        os.close(self._events)


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
