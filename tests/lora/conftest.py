"""The server tests' fixture that keeps torch on one thread while a live server shares the cores."""

from tests.server.conftest import single_threaded_torch  # noqa: F401 - a fixture, used by name
