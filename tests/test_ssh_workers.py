"""The suite runs on ssh workers, as the README's ``--tx 2*ssh=...`` line says.

A real OpenSSH server is started on 127.0.0.1 on a free port, with a host
key and a client key made on the spot in a temporary directory, and the
narrow chaos selection of ``test_process_nodes`` runs under
``--dist load --tx 2*ssh=USER@HOST//ssh_config=FILE//python=...//chdir=...``.
Each worker is a remote session with its own toxiproxy server, ports and
node processes; the report must show both workers' verdicts.

Nothing may be left behind on either side: sshd sets a marker variable and
a private ``TMPDIR`` in every session it starts, the controlling pytest
carries a marker of its own, and after the run no process may carry
either marker and the sessions' ``TMPDIR`` must be empty.

Opt-in: it runs when ``ZMQC_SSH_WORKERS=1`` (``.ci/run`` sets it after
installing Debian's openssh-server) and is skipped, with the reason,
otherwise or when no ``sshd`` binary is found. As root it needs
``/run/sshd`` (sshd's privilege separation directory), which it makes when
missing and removes again.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

ENV_OPT_IN = "ZMQC_SSH_WORKERS"
REPO_ROOT = Path(__file__).resolve().parent.parent
_SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd")
_PRIVSEP_DIR = Path("/run/sshd")
_START_TIMEOUT_S = 10.0
_HOST_ALIAS = "zmqc-ssh-worker"

pytestmark = pytest.mark.skipif(
    os.environ.get(ENV_OPT_IN) != "1", reason=f"ssh workers are opt-in: set {ENV_OPT_IN}=1"
)


def _sshd_binary() -> str | None:
    for candidate in _SSHD_CANDIDATES:
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("sshd")


def _keygen(path: Path) -> str:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "zmqc-ci", "-f", str(path)],
        check=True, capture_output=True,
    )
    return path.with_suffix(".pub").read_text(encoding="ascii").strip()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class SshServer:
    """A running sshd and the client side's config for it."""

    port: int
    user: str
    client_config: Path
    mark: str
    remote_tmp: Path
    log: Path

    @property
    def address(self) -> str:
        return f"{self.user}@{_HOST_ALIAS}"


def _write_configs(root: Path, port: int, mark: str, remote_tmp: Path) -> tuple[Path, Path]:
    host_pub = _keygen(root / "host_ed25519")
    client_pub = _keygen(root / "client_ed25519")
    (root / "authorized_keys").write_text(client_pub + "\n", encoding="ascii")
    (root / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub}\n", encoding="ascii")
    server_config = root / "sshd_config"
    server_config.write_text(
        "\n".join([
            f"Port {port}",
            "ListenAddress 127.0.0.1",
            f"HostKey {root / 'host_ed25519'}",
            f"AuthorizedKeysFile {root / 'authorized_keys'}",
            f"PidFile {root / 'sshd.pid'}",
            "StrictModes no",  # the temporary directory is not a home directory
            "UsePAM no",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes",
            "PermitRootLogin prohibit-password",
            f"SetEnv ZMQC_SSH_MARK={mark} TMPDIR={remote_tmp}",
            "LogLevel VERBOSE",
            "",
        ]),
        encoding="ascii",
    )
    client_config = root / "ssh_config"
    client_config.write_text(
        "\n".join([
            f"Host {_HOST_ALIAS}",
            "  HostName 127.0.0.1",
            f"  Port {port}",
            f"  IdentityFile {root / 'client_ed25519'}",
            "  IdentitiesOnly yes",
            f"  UserKnownHostsFile {root / 'known_hosts'}",
            "  StrictHostKeyChecking yes",
            "  BatchMode yes",
            "",
        ]),
        encoding="ascii",
    )
    return server_config, client_config


def _wait_listening(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited with {proc.returncode}: {log.read_text()}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"sshd did not listen on 127.0.0.1:{port}: {log.read_text()}")


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[SshServer]:
    binary = _sshd_binary()
    if binary is None:
        pytest.skip("no sshd binary (Debian: apt-get install openssh-server)")
    made_privsep = False
    if os.geteuid() == 0 and not _PRIVSEP_DIR.exists():
        _PRIVSEP_DIR.mkdir(mode=0o755)
        made_privsep = True
    root = tmp_path / "ssh"
    root.mkdir()
    remote_tmp = tmp_path / "remote-tmp"
    remote_tmp.mkdir()
    mark = secrets.token_hex(8)
    log = root / "sshd.log"
    proc: subprocess.Popen[bytes] | None = None
    try:
        port = _free_port()
        server_config, client_config = _write_configs(root, port, mark, remote_tmp)
        proc = subprocess.Popen(
            [binary, "-D", "-f", str(server_config), "-E", str(log)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        _wait_listening(proc, port, log)
        yield SshServer(port, getpass.getuser(), client_config, mark, remote_tmp, log)
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if made_privsep:
            with contextlib.suppress(OSError):
                _PRIVSEP_DIR.rmdir()


def _marked(marks: dict[str, str]) -> list[str]:
    """Processes whose environment carries one of ``marks`` (pid and command line)."""
    found: list[str] = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            env = proc.environ()
            if any(env.get(key) == value for key, value in marks.items()):
                found.append(f"{proc.info['pid']}: {' '.join(proc.info['cmdline'] or [])}")
    return found


def _leftovers(marks: dict[str, str], wait_s: float = 10.0) -> list[str]:
    """Marked processes still alive after ``wait_s`` (sessions take a moment to end)."""
    deadline = time.monotonic() + wait_s
    while True:
        left = _marked(marks)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def test_suite_runs_on_two_ssh_workers_and_leaves_nothing_behind(
    sshd: SshServer, tmp_path: Path
) -> None:
    """The README's ssh line, run for real: both workers report, nothing outlives the run."""
    report = tmp_path / "r.json"
    controller_mark = secrets.token_hex(8)
    # The remote working directory is a scratch one: xdist copies its own pytest
    # there (pytest/, _pytest/) for every ssh gateway, and the remote then imports
    # that copy; a checkout or an install directory there would be shadowed.
    work = tmp_path / "remote-work"
    work.mkdir()
    tx = (
        f"2*ssh={sshd.address}//ssh_config={sshd.client_config}"
        f"//python={sys.executable}//chdir={work}"
    )
    env = dict(os.environ, ZMQC_SSH_CONTROLLER=controller_mark)
    marks = {"ZMQC_SSH_MARK": sshd.mark, "ZMQC_SSH_CONTROLLER": controller_mark}
    argv = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v",
        "--zmq-conformance-only", "--zmq-chaos", "--zmq-nodes", "process",
        "--dist", "load", "--tx", tx,
        "-k", "test_hb1_ or test_hb4_ or test_proc1_paused or test_connect_returns_live",
        "--zmq-report-json", str(report),
    ]
    seen_remote: set[str] = set()
    with subprocess.Popen(
        argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=env,
    ) as proc:
        # The marks are what the leftover check looks for: see them on the live
        # remote sessions first, so that check cannot pass by finding nothing.
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            seen_remote.update(_marked({"ZMQC_SSH_MARK": sshd.mark}))
            time.sleep(0.5)
        if proc.poll() is None:
            proc.kill()
        stdout, _ = proc.communicate()
    result = subprocess.CompletedProcess(argv, proc.returncode, stdout, "")
    assert any("python" in line for line in seen_remote), seen_remote
    out = result.stdout + result.stderr
    assert result.returncode == 0, f"{out}\nsshd log:\n{sshd.log.read_text()}"
    assert "5 passed" in out, out
    assert re.search(r"\[gw0\].*PASSED", out) and re.search(r"\[gw1\].*PASSED", out), out
    sessions = len(re.findall(r"Accepted publickey", sshd.log.read_text()))
    assert sessions >= 2, f"expected one ssh session per worker:\n{sshd.log.read_text()}"
    clauses = json.loads(report.read_text())["clauses"]
    for clause in ("CONN-1", "HB-1", "HB-4", "PROC-1"):
        assert clauses[clause]["verdict"] == "passed", clauses[clause]
    assert _leftovers(marks) == []
    assert sorted(p.name for p in sshd.remote_tmp.iterdir()) == []
    # In the working directory: xdist's copy of pytest and Hypothesis's example
    # database, as in any directory pytest runs in; nothing of the suite's own.
    assert {p.name for p in work.iterdir()} <= {"_pytest", "pytest", ".hypothesis"}
