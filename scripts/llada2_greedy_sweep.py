"""The LLaDA2 greedy sweep: `LLM.generate` on tiny random LLaDA2 checkpoints against LLaDA2's published `generate`,
run as it is (its own model class, loop and sampler; CPU, fp32), token for token.

Two references, both the released code (nothing of it is copied into this repository; the script reads it from
a checkout you give it and imports it from a temporary directory):

- `released`: the Hugging Face release's temperature-0 branch of `_sample_with_temperature_topk_topp`
  (token = the logits' argmax, confidence = its probability under the softmax of the whole vocabulary, the mask
  token included; a public copy of the file: sajadn/Megatron-Bridge, `modeling_llada2_moe.py`). The method is
  taken from `--released` (the whole file, or any file holding that method) and bound to dFactory's model,
  whose `generate` loop is the released one's (only the returned slice differs: the release returns the prompt
  too). Compared with the engine at temperature 0.
- `dfactory`: dFactory's own sampler (inclusionAI/dFactory, `models/llada2_moe/modeling_llada2_moe.py`, no
  temperature-0 branch) at temperature 1, top-k 1. Compared with the engine at temperature 1, top-k 1.

Also the engine's earlier temperature-0 rule (`old`: the same released branch on logits with the mask
token at -inf, so the confidence renormalised without it), inside the same reference loop. For a request where
`old` and `released` decide differently at some step, the first such step is printed: the positions, their
confidences with and without the mask token's mass, the mask token's probability there, and the gap between
the k-th and (k+1)-th confidence when the step fell back to top-k.

The grid: checkpoints of `--seeds` (written by diffuserve.reference.llada2_checkpoint) at `--logit-scale`,
thresholds 0.5 / 0.9 / 0.95, two step settings (`default`: 32 steps, answers longer than a block; `capped`:
answers shorter than a block, so `steps = min(steps, gen_length)` caps them), `--prompts` prompts per setting
(random token ids, drawn per setting and seed): 72 requests per seed with the defaults. Prints one row per
seed and setting, the `old` rule's first differing steps, then a final JSON line.

Needs transformers 4.x (the reference file imports names that 5.x removed) ahead of the installed one, and a
dFactory checkout or bare clone (stand-ins for its `veomni` imports are defined here: a logger, expert
parallelism off, no Liger kernels, and the training-only loss and fused-MoE functions raising if reached):

    pip install --target /tmp/tf4 transformers==4.57.1
    git clone https://github.com/inclusionAI/dFactory /tmp/dFactory
    # the released modeling file, e.g. Megatron-Bridge's copy, saved as /tmp/released_modeling_llada2_moe.py
    PYTHONPATH=/tmp/tf4:$PWD python scripts/llada2_greedy_sweep.py --dfactory /tmp/dFactory \\
        --released /tmp/released_modeling_llada2_moe.py

About 20 minutes on 2 busy CPU cores with the defaults (one thread; the engine batched, the references one
request at a time).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import logging
import subprocess
import sys
import tempfile
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from diffuserve import LLM, SamplingParams
from diffuserve.model.loader import load_args
from diffuserve.reference.llada2_checkpoint import write_llada2_checkpoint

THRESHOLDS = (0.5, 0.9, 0.95)
PROMPT_LENGTHS = (1, 3, 5, 17, 31, 32, 33, 40, 47, 64, 70, 90)
"""Prompt lengths, cycled: inside the first block, at and around block edges, several blocks."""
SETTINGS = {"default": (33, 72), "capped": (6, 31)}
"""Step setting -> the range of max_tokens drawn (steps unset: one block's worth, capped by max_tokens)."""
BLOCK = 32
SAMPLER = "_sample_with_temperature_topk_topp"
DFACTORY_PACKAGE = "models/llada2_moe"
MODULE_FILES = ("__init__.py", "configuration_llada2_moe.py", "modeling_llada2_moe.py")


def install_veomni_stand_ins() -> None:
    """The veomni names dFactory's file imports: a logger, expert parallelism off, no Liger kernels; the loss
    and the fused MoE (training only) raise if ever called."""

    def unused(*args: object, **kwargs: object) -> None:
        raise NotImplementedError("a veomni training path was reached")

    def get_logger(name: str) -> logging.Logger:
        logger = logging.getLogger(name)
        logger.warning_once = logger.warning  # type: ignore[attr-defined]
        logger.info_rank0 = logger.info  # type: ignore[attr-defined]
        return logger

    names = {
        "veomni": {},
        "veomni.ops": {"causallm_loss_function": unused, "fused_moe_forward": unused},
        "veomni.distributed": {},
        "veomni.distributed.parallel_state": {"get_parallel_state": lambda: types.SimpleNamespace(ep_enabled=False)},
        "veomni.utils": {"logging": types.SimpleNamespace(get_logger=get_logger)},
        "veomni.utils.import_utils": {"is_liger_kernel_available": lambda: False},
    }
    for name, attrs in names.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        sys.modules[name] = module


def read_dfactory_file(checkout: Path, path: str) -> str:
    """A file of a dFactory checkout, or of a bare clone (`git show HEAD:path`)."""
    if (checkout / path).is_file():
        return (checkout / path).read_text()
    shown = subprocess.run(["git", "--git-dir", str(checkout), "show", f"HEAD:{path}"], capture_output=True, text=True)
    if shown.returncode != 0:
        sys.exit(f"--dfactory {checkout}: no {path} (a checkout or bare clone of inclusionAI/dFactory)")
    return shown.stdout


def import_dfactory(checkout: Path, into: Path) -> types.ModuleType:
    """dFactory's models/llada2_moe, copied to a temporary package and imported -> its modeling module."""
    import transformers

    if not transformers.__version__.startswith("4."):
        sys.exit(f"transformers {transformers.__version__}: the reference needs 4.x first on PYTHONPATH (see --help)")
    package = into / "llada2_reference"
    package.mkdir()
    for name in MODULE_FILES:
        (package / name).write_text(read_dfactory_file(checkout, f"{DFACTORY_PACKAGE}/{name}"))
    install_veomni_stand_ins()
    sys.path.insert(0, str(into))
    import llada2_reference.modeling_llada2_moe as modeling  # type: ignore[import-not-found]

    return modeling


def released_sampler(path: Path) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The `_sample_with_temperature_topk_topp` method defined in `path`, compiled on its own."""
    source = path.read_text()
    found = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == SAMPLER]
    if len(found) != 1:
        sys.exit(f"--released {path}: expected one def {SAMPLER}, found {len(found)}")
    namespace: dict[str, Any] = {"torch": torch, "F": F}
    exec(compile(ast.Module(body=[found[0]], type_ignores=[]), str(path), "exec"), namespace)
    return namespace[SAMPLER]


def load_reference_model(modeling: types.ModuleType, model_dir: Path) -> torch.nn.Module:
    """The reference class on our checkpoint's config and weights (SDPA attention, as the release runs)."""
    config = modeling.LLaDA2MoeConfig(**json.loads((model_dir / "config.json").read_text()))
    config.use_cache = False
    config._attn_implementation = "sdpa"
    model = modeling.LLaDA2MoeModelLM(config).eval()
    state = {k: v for f in sorted(model_dir.glob("*.safetensors")) for k, v in load_file(f).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.endswith("inv_freq")]
    if missing or unexpected:
        sys.exit(f"{model_dir}: the reference model does not take these weights: {missing} {unexpected}")
    return model


@dataclass
class Recorder:
    """Wraps a model's forward and sampler for one `generate` call: keeps every step's masked positions [32] and
    the block's fp32 logits [32, V], in call order."""

    mask_id: int
    steps: list[tuple[int, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    """(window end, masked [32] bool, logits [32, V])."""

    def attach(self, model: torch.nn.Module, sampler: Callable[..., Any]) -> None:
        forward = type(model).forward

        def recorded_forward(input_ids: torch.Tensor, **kwargs: Any) -> Any:
            self.steps.append((input_ids.shape[1], input_ids[0, -BLOCK:] == self.mask_id, torch.empty(0)))
            # generate builds its 0 / -inf block mask in bf16; SDPA on an fp32 model wants the query's dtype.
            # Both values are exact in either dtype, so the cast changes nothing.
            kwargs["attention_mask"] = kwargs["attention_mask"].to(model.dtype)
            out = forward(model, input_ids, **kwargs)
            end, masked, _ = self.steps[-1]
            self.steps[-1] = (end, masked, out.logits[0, -BLOCK:].float().clone())
            return out

        model.forward = recorded_forward  # type: ignore[method-assign]
        model._sample_with_temperature_topk_topp = types.MethodType(sampler, model)  # type: ignore[attr-defined]


def confidences(logits: torch.Tensor, mask_id: int, with_mask: bool) -> torch.Tensor:
    """[32, V] -> [32]: the argmax's probability, the mask token's mass kept (released) or removed (old)."""
    if not with_mask:
        logits = logits.clone()
        logits[:, mask_id] = float("-inf")
    return torch.softmax(logits, dim=-1).max(dim=-1).values


def choose(confidence: torch.Tensor, masked: torch.Tensor, threshold: float, k: int) -> list[int]:
    """generate's choice: every masked position above the threshold if at least k are, else the top k."""
    confidence = torch.where(masked, confidence, float("-inf"))
    high = confidence > threshold
    if int(high.sum()) >= k:
        return high.nonzero().flatten().tolist()
    return sorted(torch.topk(confidence, min(k, int(masked.sum()))).indices.tolist())


def first_rule_split(recorder: Recorder, prompt_length: int, threshold: float, schedule: list[int]) -> dict | None:
    """The first step of a released decode where the old rule, on the same logits, chooses other positions."""
    step_in_block, last_end = 0, -1
    for end, masked, logits in recorder.steps:
        step_in_block = step_in_block + 1 if end == last_end else 0
        last_end, k = end, schedule[step_in_block]
        new = confidences(logits, recorder.mask_id, with_mask=True)
        old = confidences(logits, recorder.mask_id, with_mask=False)
        chosen, old_chosen = choose(new, masked, threshold, k), choose(old, masked, threshold, k)
        if chosen == old_chosen:
            continue
        ranked = torch.where(masked, new, float("-inf")).sort(descending=True).values
        fallback = int((torch.where(masked, new, 0.0) > threshold).sum()) < k
        parted = sorted(set(chosen) ^ set(old_chosen))
        p_mask = torch.softmax(logits, dim=-1)[:, recorder.mask_id]
        return dict(
            answer_positions=[end - BLOCK - prompt_length + i for i in parted],
            step=step_in_block,
            k=k,
            fallback=fallback,
            released_takes=[i in chosen for i in parted],
            confidence=[new[i].item() for i in parted],
            confidence_without_mask=[old[i].item() for i in parted],
            p_mask=[p_mask[i].item() for i in parted],
            kth_gap=(ranked[k - 1] - ranked[k]).item() if fallback else None,
        )
    return None


@dataclass
class Row:
    seed: int
    threshold: float
    steps: str
    requests: int = 0
    released_equal: int = 0
    dfactory_equal: int = 0
    old_differs: int = 0
    splits: list[dict] = field(default_factory=list)


@dataclass(frozen=True)
class Reference:
    model: torch.nn.Module
    released: Callable[..., Any]
    dfactory: Callable[..., Any]
    mask_id: int
    eos_id: int

    def generate(self, sampler: Callable[..., Any], prompt: list[int], kw: dict) -> tuple[list[int], Recorder]:
        recorder = Recorder(self.mask_id)
        recorder.attach(self.model, sampler)
        torch.manual_seed(0)
        out = self.model.generate(torch.tensor([prompt]), eos_id=self.eos_id, mask_id=self.mask_id, **kw)
        return out[0].tolist(), recorder

    def old(self, model: torch.nn.Module, logits: torch.Tensor, **kw: Any) -> tuple[torch.Tensor, torch.Tensor]:
        logits = logits.clone()
        logits[..., self.mask_id] = float("-inf")
        return self.released(model, logits, **kw)


def run_setting(llm: LLM, ref: Reference, row: Row, prompts: int) -> Row:
    """One checkpoint, threshold and step setting: the engine batched, the references one request at a time."""
    gen = torch.Generator().manual_seed(row.seed * 1000 + int(row.threshold * 100) + len(row.steps))
    low, high = SETTINGS[row.steps]
    lengths = [PROMPT_LENGTHS[i % len(PROMPT_LENGTHS)] for i in range(prompts)]
    batch = [torch.randint(1, 250, (n,), generator=gen).tolist() for n in lengths]
    max_tokens = torch.randint(low, high, (prompts,), generator=gen).tolist()
    greedy = [SamplingParams(max_tokens=m, threshold=row.threshold, temperature=0.0) for m in max_tokens]
    top_k_1 = [dataclasses.replace(p, temperature=1.0, top_k=1, seed=0) for p in greedy]
    requests = [{"prompt_token_ids": p} for p in batch]
    engine_greedy = [list(o.outputs[0].token_ids) for o in llm.generate(requests, greedy)]
    engine_top_k_1 = [list(o.outputs[0].token_ids) for o in llm.generate(requests, top_k_1)]
    for i, prompt in enumerate(batch):
        kw = dict(block_length=BLOCK, steps=BLOCK, gen_length=max_tokens[i], threshold=row.threshold)
        released, recorder = ref.generate(ref.released, prompt, dict(kw, temperature=0.0))
        dfactory, _ = ref.generate(ref.dfactory, prompt, dict(kw, temperature=1.0, top_k=1))
        old, _ = ref.generate(ref.old, prompt, dict(kw, temperature=0.0))
        row.requests += 1
        row.released_equal += engine_greedy[i] == released
        row.dfactory_equal += engine_top_k_1[i] == dfactory
        row.old_differs += old != released
        steps = min(BLOCK, max_tokens[i])
        schedule = [BLOCK // steps + (1 if s < BLOCK % steps else 0) for s in range(steps)]
        split = first_rule_split(recorder, len(prompt), row.threshold, schedule)
        if split is not None:
            first = next((j for j, (a, b) in enumerate(zip(old, released)) if a != b), None)
            row.splits.append(
                dict(prompt_length=len(prompt), max_tokens=max_tokens[i], outputs_differ_from=first, **split)
            )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dfactory", type=Path, required=True, help="a checkout of inclusionAI/dFactory")
    parser.add_argument("--released", type=Path, required=True, help="the released modeling_llada2_moe.py")
    parser.add_argument("--seeds", type=int, nargs="+", default=[5, 6])
    parser.add_argument("--logit-scale", type=float, default=1.0)
    parser.add_argument("--prompts", type=int, default=12, help="prompts per threshold and step setting")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows: list[Row] = []
    print(f"{'seed':>4} {'threshold':>9} {'steps':>8} {'released':>9} {'dfactory':>9} {'old rule':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        modeling = import_dfactory(args.dfactory, Path(tmp))
        released = released_sampler(args.released)
        for seed in args.seeds:
            model_dir = write_llada2_checkpoint(Path(tmp) / f"seed{seed}", seed=seed, logit_scale=args.logit_scale)
            engine_args = load_args(str(model_dir))[1]
            ref = Reference(
                load_reference_model(modeling, model_dir),
                released,
                getattr(modeling.LLaDA2MoeModelLM, SAMPLER),
                engine_args.mask_token_id,
                engine_args.eos_token_ids[0],
            )
            llm = LLM(str(model_dir), num_pages=512, max_num_seqs=args.prompts)
            for threshold in THRESHOLDS:
                for steps in SETTINGS:
                    row = run_setting(llm, ref, Row(seed, threshold, steps), args.prompts)
                    n = row.requests
                    print(
                        f"{seed:>4} {threshold:>9} {steps:>8} {row.released_equal:>6}/{n} "
                        f"{row.dfactory_equal:>6}/{n} {row.old_differs:>6}/{n} differ",
                        flush=True,
                    )
                    rows.append(row)
    print("first steps where the old rule (confidence renormalised without the mask token) chose otherwise:")
    for row in rows:
        for split in row.splits:
            print(json.dumps(dict(seed=row.seed, threshold=row.threshold, steps=row.steps, **split)))
    totals = {
        k: sum(getattr(r, k) for r in rows) for k in ("requests", "released_equal", "dfactory_equal", "old_differs")
    }
    print(json.dumps({"logit_scale": args.logit_scale, **totals}))


if __name__ == "__main__":
    main()
