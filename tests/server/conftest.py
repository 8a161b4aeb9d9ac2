"""Server fixtures: a tiny chat model with a tokenizer, and real servers started through the
CLI (`server_process.start_server`) in a subprocess on free 127.0.0.1 ports, shared by the
whole session and stopped at its end."""

from __future__ import annotations

from pathlib import Path

import pytest
from chat_model import TOOLS_CHATML, write_chat_model
from server_process import start_server, stop_server


@pytest.fixture(scope="session")
def chat_model_dir(tmp_path_factory) -> Path:
    # the tools-aware ChatML renders plain chats exactly as ChatML does
    return write_chat_model(tmp_path_factory.mktemp("tiny_chat"), chat_template=TOOLS_CHATML)


@pytest.fixture(scope="session")
def server(chat_model_dir, tmp_path_factory):
    """The main server: chat page on port + 1, no key, 16+ sequences per batch."""
    log = tmp_path_factory.mktemp("logs") / "server.log"
    s = start_server(
        chat_model_dir, log, "--ui-server", "--max-model-len", "1024", "--max-num-seqs", "32"
    )
    yield s
    stop_server(s)
    assert s.process.returncode == 0, log.read_text()


@pytest.fixture(scope="session")
def limited_server(chat_model_dir, tmp_path_factory):
    """A server with an API key, one sequence per batch and a waiting queue of two."""
    log = tmp_path_factory.mktemp("logs") / "limited.log"
    extra = ("--max-model-len", "512", "--max-num-seqs", "1", "--max-waiting", "2")
    s = start_server(chat_model_dir, log, *extra, api_key="sk-test-key")
    yield s
    stop_server(s)
