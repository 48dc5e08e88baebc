"""Progress bars: LLM.generate's (vLLM's `use_tqdm`) and weight loading's, on stderr when asked or when stderr
is a terminal, and silent otherwise (pipes, logs, tests)."""

from __future__ import annotations

from pathlib import Path

from diffuserve.llm import LLM
from diffuserve.model.loader import iter_checkpoint
from diffuserve.sampling_params import SamplingParams


def test_generate_progress_bar(tiny_model_dir: Path, capsys):
    llm = LLM(str(tiny_model_dir), device="cpu", num_pages=32, max_model_len=64)
    capsys.readouterr()
    params = SamplingParams(max_tokens=4)
    llm.generate(["a", "b", "c"], params, use_tqdm=True)
    err = capsys.readouterr().err
    assert "Processed prompts" in err and "3/3" in err
    llm.generate(["a", "b"], params)  # the default: stderr here is no terminal
    llm.generate(["a"], params, use_tqdm=False)
    assert capsys.readouterr().err == ""


def test_weight_loading_progress_bar(tiny_model_dir: Path, capsys):
    names = [name for name, _ in iter_checkpoint(tiny_model_dir, progress=True)]
    err = capsys.readouterr().err
    assert names and "Loading safetensors shards" in err and "1/1" in err
    list(iter_checkpoint(tiny_model_dir))
    assert capsys.readouterr().err == ""


def test_default_follows_the_terminal(tiny_model_dir: Path, monkeypatch):
    class Terminal:
        def __init__(self) -> None:
            self.text = ""

        def isatty(self) -> bool:
            return True

        def write(self, text: str) -> None:
            self.text += text

        def flush(self) -> None:
            pass

    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    llm = LLM(str(tiny_model_dir), device="cpu", num_pages=32, max_model_len=64)
    llm.generate(["a", "b"], SamplingParams(max_tokens=4))
    assert "Processed prompts" in terminal.text and "2/2" in terminal.text
