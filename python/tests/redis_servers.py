# SPDX-License-Identifier: Apache-2.0
"""Real Redis servers for the remote tier's Python tests: Debian's redis-server on free loopback
ports in a temporary folder, a cluster made by `redis-cli --cluster create` or one server. Each
server dies with the test process (PR_SET_PDEATHSIG) and `stop()` kills and reaps them; a machine
without redis-server fails, it does not skip."""
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import time


def _die_with_parent():
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


class redis_servers:
    def __init__(self, folder, count=6, cluster=True, replicas=1):
        server = shutil.which("redis-server") or "/usr/bin/redis-server"
        cli = shutil.which("redis-cli") or "/usr/bin/redis-cli"
        if not os.access(server, os.X_OK) or not os.access(cli, os.X_OK):
            raise RuntimeError("redis-server / redis-cli not found (Debian: apt-get install redis-server)")
        self.folder = str(folder)
        base = 30000 + (os.getpid() % 1000) * 10
        while not all(_free(base + i) and _free(base + i + 10000) for i in range(count)):
            base = 30000 + (base - 30000 + 10) % 20000
        self.ports = [base + i for i in range(count)]
        self.procs = []
        try:
            for p in self.ports:
                args = [server, "--port", str(p), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                        "--dir", self.folder]
                if cluster:
                    args += ["--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{p}.conf",
                             "--cluster-node-timeout", "2000"]
                log = open(os.path.join(self.folder, f"server-{p}.log"), "w")
                self.procs.append(subprocess.Popen(args, stdout=log, stderr=log, preexec_fn=_die_with_parent))
            for p in self.ports:
                self._wait(lambda: self.cli(p, "PING") == "PONG", "a server did not start")
            if cluster:
                subprocess.run([cli, "--cluster", "create", *self.addresses(), "--cluster-replicas", str(replicas),
                                "--cluster-yes"], check=True, capture_output=True, timeout=60)
                for p in self.ports:
                    self._wait(lambda: "cluster_state:ok" in self.cli(p, "CLUSTER", "INFO"), "cluster not ok")
        except BaseException:
            self.stop()
            raise

    def addresses(self):
        return [f"127.0.0.1:{p}" for p in self.ports]

    def cli(self, port, *args):
        r = subprocess.run([shutil.which("redis-cli") or "/usr/bin/redis-cli", "-p", str(port), *args],
                           capture_output=True, text=True, timeout=10)
        return r.stdout.strip()

    def _wait(self, ok, what, limit=30.0):
        end = time.monotonic() + limit
        while time.monotonic() < end:
            try:
                if ok():
                    return
            except subprocess.SubprocessError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"redis_servers: {what}")

    def stop(self):
        for p in self.procs:
            p.kill()
            p.wait()
        self.procs = []
