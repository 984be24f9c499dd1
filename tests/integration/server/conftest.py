"""Start `clef-agents serve` as a real process on a free loopback port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

API_KEY = "clef-test-key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    def __init__(self, model_dir: Path, *extra: str, key: bool = False) -> None:
        self.api_key = API_KEY if key else None
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        argv = [sys.executable, "-m", "clef_agents", "serve", "--model", str(model_dir)]
        argv += ["--port", str(self.port), *extra]
        if key:
            env["CLEF_TEST_KEY"] = API_KEY
            argv += ["--api-key-env", "CLEF_TEST_KEY"]
        self.log = model_dir.parent / f"server-{self.port}.log"
        self._log_file = self.log.open("wb")
        self.proc = subprocess.Popen(argv, env=env, stdout=self._log_file, stderr=subprocess.STDOUT)
        self._wait_ready()

    def _wait_ready(self, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server not ready after {timeout_s} s:\n{self.log.read_text()[-3000:]}")

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log_file.close()
        return int(self.proc.returncode)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from clef_engine.testing import write_tiny_bert

    return write_tiny_bert(tmp_path_factory.mktemp("tiny-server") / "model")


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(tiny_model_dir)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def keyed_server(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(tiny_model_dir, key=True)
    yield proc
    proc.stop()


@pytest.fixture()
def start_server(tiny_model_dir: Path) -> Iterator[Any]:
    started: list[ServerProcess] = []

    def start(*extra: str, key: bool = False) -> ServerProcess:
        proc = ServerProcess(tiny_model_dir, *extra, key=key)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()
