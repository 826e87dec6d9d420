"""Fixtures: a real `kiln serve` on the default model (CPU), started once per session, and
helpers to start extra servers with other flags."""
import os
import pathlib
import re
import signal
import subprocess
import time

import openai
import pytest
import requests

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = "smollm2"


def kiln_binary():
    return pathlib.Path(os.environ.get("KILN_BIN", ROOT / "build" / "tools" / "kiln"))


class KilnServer:
    """`kiln serve --port 0 ...`; the bound port is read from its log."""

    def __init__(self, *args, log_name="serve"):
        if not kiln_binary().exists():
            pytest.fail(f"{kiln_binary()} not found: build kiln first (scripts/build.sh)")
        if not MODEL.exists():
            pytest.fail(f"{MODEL} not found: run scripts/fetch_model.sh")
        self.log_path = pathlib.Path(os.environ.get("KILN_SERVER_LOG_DIR", "/tmp")) / f"kiln-{log_name}-{os.getpid()}.log"
        self.log = open(self.log_path, "wb")
        cmd = [str(kiln_binary()), "serve", "-m", str(MODEL), "--device", "cpu", "--port", "0",
               "--served-model-name", NAME, *args]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.port = None
        deadline = time.time() + 60
        while time.time() < deadline:
            text = self.log_path.read_text(errors="replace")
            m = re.search(r"listening on http://[^:]+:(\d+)", text)
            if m:
                self.port = int(m.group(1))
            if self.port and "ready:" in text:
                break
            if self.proc.poll() is not None:
                pytest.fail(f"kiln serve exited with {self.proc.returncode}:\n{text}")
            time.sleep(0.05)
        else:
            self.stop()
            pytest.fail("kiln serve did not become ready in 60 s:\n" + self.log_path.read_text(errors="replace"))
        self.url = f"http://127.0.0.1:{self.port}"
        assert requests.get(self.url + "/health", timeout=5).status_code == 200

    def metrics(self):
        text = requests.get(self.url + "/metrics", timeout=5).text
        out = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name, value = line.rsplit(" ", 1)
            out[re.sub(r"\{.*\}", "", name) if "_bucket" not in name else name] = float(value)
        return out

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode

    def log_text(self):
        return self.log_path.read_text(errors="replace")


@pytest.fixture(scope="session")
def server():
    s = KilnServer(log_name="main")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
