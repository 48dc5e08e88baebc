"""Stand-ins for the imports of a reference's own Python files that cannot load on this machine, so that
`diffuserve verify` runs the files as released, unmodified.

Each stand-in is installed only when the files name it and the real one is missing, only while the reference is
built and run (`standing_in`), and is reported by name. What the files compute with is stood in for by what it
means (stand_in_ops.py: flash-attn's RMSNorm and attention, einops' `rearrange`); what only training reaches
(Triton kernels, veomni's loss and fused-MoE functions, flash-attn's variable-length entry points) raises if
reached; configuration-only names get their off value (veomni: no expert parallelism, no Liger kernels).
Names transformers removed are given back as they were (`LossKwargs`, a TypedDict; `DynamicCache[i]`, the
layer's (keys, values)). Knows nothing of models or of the comparison.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import logging
import re
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from diffuserve.verify import stand_in_ops
from diffuserve.verify.transformers_compat import restoring


def _unused(what: str) -> Callable[..., Any]:
    def raises(*args: object, **kwargs: object) -> None:
        raise NotImplementedError(f"{what} was reached; verify stands in for it only where eval never calls it")

    return raises


def _module(name: str, attrs: dict[str, Any], fallback: Callable[[str], Any] | None = None) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)  # importlib.util.find_spec reads it
    module.__dict__.update(attrs)
    if fallback is not None:  # PEP 562: any other attribute
        module.__dict__["__getattr__"] = fallback
    return module


def _decorator_factory(*args: object, **kwargs: object) -> Callable[[Any], Any]:
    return lambda fn: fn


def _triton() -> list[types.ModuleType]:
    """triton and triton.language as the decorators and annotations of a module that defines kernels. torch's
    own probes for Triton (which cache their answer; `torch.compile` at a module's top level reaches them) are
    made first, so that they see none."""
    import torch._dynamo.repro.after_dynamo
    import torch._inductor.runtime.triton_compat  # noqa: F401
    from torch.utils._triton import has_triton, has_triton_package

    has_triton_package(), has_triton()
    kernel = lambda fn: _unused(f"the Triton kernel {fn.__name__}")  # noqa: E731

    def any_name(name: str) -> Callable[..., Any]:
        if name.startswith("__"):  # not a package: `import triton.compiler` fails as without triton
            raise AttributeError(name)
        return _unused(f"triton {name}")

    return [
        _module(
            "triton",
            {"jit": kernel, "heuristics": _decorator_factory, "autotune": _decorator_factory, "Config": dict},
            any_name,
        ),
        _module("triton.language", {"constexpr": object}, any_name),
    ]


PADDING_NAMES = ("index_first_axis", "pad_input", "unpad_input")


def _flash_attn() -> list[types.ModuleType]:
    varlen = _unused("flash-attn's variable-length attention (training's packed sequences)")
    return [
        _module(
            "flash_attn",
            {"flash_attn_func": stand_in_ops.flash_attn_func, "flash_attn_varlen_func": varlen},
        ),
        _module("flash_attn.ops", {}),
        _module("flash_attn.ops.triton", {}),
        _module("flash_attn.ops.triton.layer_norm", {"rms_norm_fn": stand_in_ops.rms_norm_fn}),
        _module(
            "flash_attn.bert_padding",
            {
                name: _unused(f"flash_attn.bert_padding.{name}")
                for name in ("index_first_axis", "pad_input", "unpad_input")
            },
        ),
    ]


def _veomni_logger(name: str) -> logging.Logger:
    logger = logging.getLogger(name)
    logger.warning_once = logger.warning  # type: ignore[attr-defined]
    logger.info_rank0 = logger.info  # type: ignore[attr-defined]
    return logger


def _no_parallelism() -> types.SimpleNamespace:
    return types.SimpleNamespace(ep_enabled=False)


def _veomni() -> list[types.ModuleType]:
    return [
        _module("veomni", {}),
        _module(
            "veomni.ops",
            {"causallm_loss_function": _unused("veomni's loss"), "fused_moe_forward": _unused("veomni's fused MoE")},
        ),
        _module("veomni.distributed", {}),
        _module(
            "veomni.distributed.parallel_state", {"get_parallel_state": lambda: types.SimpleNamespace(ep_enabled=False)}
        ),
        _module("veomni.distributed.parallel_plan", {"ParallelPlan": _unused("veomni's ParallelPlan")}),
        _module("veomni.utils", {"logging": types.SimpleNamespace(get_logger=_veomni_logger)}),
        _module("veomni.utils.import_utils", {"is_liger_kernel_available": lambda: False}),
    ]


def _einops() -> list[types.ModuleType]:
    return [_module("einops", {"rearrange": stand_in_ops.rearrange})]


MODULES: dict[str, tuple[str, Callable[[], list[types.ModuleType]]]] = {
    "flash_attn": ("flash-attn (rms_norm_fn and flash_attn_func in PyTorch; its varlen path raises)", _flash_attn),
    "einops": ("einops (rearrange by permute and reshape)", _einops),
    "triton": ("triton (kernels raise if launched: training only)", _triton),
    "veomni": ("veomni (no expert parallelism, no Liger; its loss and fused MoE raise: training only)", _veomni),
}
"""Top-level module -> (what the report says, the modules standing in for it)."""


def _imports(source: str, name: str) -> bool:
    return re.search(rf"^\s*(?:from|import)\s+{name}\b", source, re.MULTILINE) is not None


def _missing(name: str) -> bool:
    return name not in sys.modules and importlib.util.find_spec(name) is None


@contextmanager
def standing_in(sources: list[str]) -> Iterator[list[str]]:
    """Installs what the files' text (`sources`) needs and this machine lacks, and gives back the transformers
    4.x names they use (transformers_compat.py); yields the report's lines (filled on entry); removes them all
    on exit (the reference's modules keep the objects they imported)."""
    said: list[str] = []
    installed: list[str] = []
    for top, (what, build) in MODULES.items():
        if any(_imports(s, top) for s in sources) and _missing(top):
            for module in build():  # parents first: each child is also its parent's attribute, as on import
                parent, _, child = module.__name__.rpartition(".")
                if parent:
                    setattr(sys.modules[parent], child, module)
                sys.modules[module.__name__] = module
                installed.append(module.__name__)
            said.append(what)
    try:
        with restoring(sources) as restored:
            yield said + restored
    finally:
        for name in installed:
            sys.modules.pop(name, None)
