"""The fork server of the code sandbox: one clean interpreter that forks a process per run, so that
a completion costs forks, not interpreter starts (about 5 programs/s became 40+ on 2 cores).

Two sides in one file, both standard library only:
  - `ForkServer` (imported by grpokit, in the process that scores): starts the server once
    (`python -I -B [-S] _zygote.py`, the environment emptied as for the sandbox), sends it one
    request per run over a Unix socket with two pipes attached (job, result), writes the job into
    the one and reads the JSON result from the other within a deadline, and has the run killed
    (its whole process group) when the deadline passes.
  - the server (this file as a script): loads `_plain.py`, `parent.py`, `_harness.py` and
    `_driver.py` by path, never reads a job itself, and forks one child per request. The child
    starts its sandbox first (the harness is forked from it, so the sandbox holds nothing but the
    server's clean memory and the request's limits), then reads its job: as "driver" the code and
    the tests (`_driver.main`), as "stdio" the code and the stdin (`sandbox.run_stdio`).
The server dies when the socket closes (the scoring process ended or forked away from it), killing
the runs still going; a server that died is started again on the next run. One server per scoring
process and per `site_packages` setting; a forked child (the reward runner's workers) starts its own.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
_MAX_REQUEST = 1 << 16


class ForkServer:
    """The scoring process's handle on one fork server (thread-safe)."""

    def __init__(self, site_packages: bool):
        self.site_packages = site_packages
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen | None = None

    def _start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-I",
                    "-B",
                    *([] if self.site_packages else ["-S"]),
                    __file__,
                    str(theirs.fileno()),
                ],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env={"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"},
                cwd="/",
                start_new_session=True,
            )
        finally:
            theirs.close()
        self._sock = ours

    def _request(self, message: dict, fds: list[int]) -> dict:
        """One request and its answer; starts (or restarts, once) the server."""
        data = json.dumps(message).encode()
        with self._lock:
            for attempt in (0, 1):
                if self._sock is None:
                    self._start()
                try:
                    socket.send_fds(self._sock, [data], fds)
                    answer = self._sock.recv(_MAX_REQUEST)
                    if answer:
                        return json.loads(answer)
                except OSError:
                    if attempt:
                        raise
                self._stop()
        raise RuntimeError("code sandbox: the fork server did not answer")

    def _stop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def run(self, role: str, header: dict, body: bytes, timeout_s: float) -> dict | None:
        """Fork a `role` run ("driver" or "stdio") with `header`, give it `body`, and return its JSON
        result, or None when it is not there within `timeout_s` (the run is then killed)."""
        job_r, job_w = os.pipe()
        res_r, res_w = os.pipe()
        try:
            pid = self._request({"op": "run", "role": role, "header": header}, [job_r, res_w])["pid"]
        finally:
            os.close(job_r)
            os.close(res_w)
        deadline = time.monotonic() + timeout_s
        feeder = threading.Thread(target=_feed, args=(job_w, body), daemon=True)
        feeder.start()
        out = bytearray()
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([res_r], [], [], left)[0]:
                    self._request({"op": "kill", "pid": pid}, [])
                    return None
                chunk = os.read(res_r, 1 << 20)
                if not chunk:
                    break
                out += chunk
        finally:
            os.close(res_r)
        try:
            return json.loads(out)
        except ValueError:
            return None  # the run died (killed for CPU or memory): no result


def _feed(fd: int, data: bytes) -> None:
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except OSError:
        pass  # the run died: its missing result says so
    finally:
        os.close(fd)


_SERVERS: dict[bool, ForkServer] = {}
_SERVERS_LOCK = threading.Lock()


def fork_server(site_packages: bool) -> ForkServer:
    with _SERVERS_LOCK:
        if site_packages not in _SERVERS:
            _SERVERS[site_packages] = ForkServer(site_packages)
        return _SERVERS[site_packages]


def _forget_in_child() -> None:
    """A forked child (a reward worker) starts servers of its own; the parent's socket is closed here so
    that the parent's server still sees end of file when the parent goes."""
    global _SERVERS_LOCK
    for server in _SERVERS.values():
        if server._sock is not None:
            server._sock.close()
    _SERVERS.clear()
    _SERVERS_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)


# --- the server -----------------------------------------------------------------------------------
def _serve(sock: socket.socket) -> None:
    from importlib.util import module_from_spec, spec_from_file_location

    def load(name: str, filename: str):
        spec = spec_from_file_location(name, os.path.join(HERE, filename))
        module = module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up here
        spec.loader.exec_module(module)
        return module

    driver = load("_grpokit_driver", "_driver.py")  # loads _plain.py and parent.py
    sandbox = driver.sandbox
    sandbox._harness()
    children: set[int] = set()
    while True:
        ready, _, _ = select.select([sock], [], [], 1.0)
        for pid in list(children):
            try:
                if os.waitpid(pid, os.WNOHANG)[0]:
                    children.discard(pid)
            except ChildProcessError:
                children.discard(pid)
        if not ready:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, _MAX_REQUEST, 4)
        except OSError:
            data, fds = b"", []
        if not data:  # the scoring process is gone: so are its runs
            for pid in children:
                _kill(pid)
            os._exit(0)
        request = json.loads(data)
        if request["op"] == "kill":
            if request["pid"] in children:
                _kill(request["pid"])
            sock.send(b"{}")
            continue
        pid = os.fork()
        if pid == 0:
            status = 0
            try:
                sock.close()
                os.setpgid(0, 0)
                job_fd, result_fd = fds
                if request["role"] == "driver":
                    result = driver.main(request["header"], job_fd, result_fd)
                else:
                    result = sandbox.run_stdio(request["header"], job_fd)
                with os.fdopen(result_fd, "wb") as f:
                    f.write(json.dumps(result).encode())
            except BaseException:  # noqa: BLE001 - no result: the caller scores the run 0
                status = 1
            finally:
                os._exit(status)
        for fd in fds:
            os.close(fd)
        children.add(pid)
        sock.send(json.dumps({"pid": pid}).encode())


def _kill(pid: int) -> None:
    for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            target()
        except OSError:
            pass


if __name__ == "__main__":
    _serve(socket.socket(fileno=int(sys.argv[1])))
