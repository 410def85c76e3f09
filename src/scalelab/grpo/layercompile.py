"""The policy's decoder layers through torch.compile (optim.compile_layers).

The GRPO update of a small model can be bound by the host launching kernels rather than by the GPU running them:
each decoder layer of every pass launches a long run of small kernels (two RMSNorms, the rotary embedding, per
LoRA adapter two extra matmuls with their casts and the scaled add, SiLU * up, the residual adds), forward and
backward. torch.compile (TorchInductor) fuses the elementwise ones into a few kernels per layer, so fewer
launches per pass; the matmuls stay library calls.

Each layer is compiled on its own (the model's embedding, mask construction and head stay eager), with dynamic
shapes: a step's passes have different rows x lengths, and all layers share one code object, so one graph per
setting serves every layer and every pass width. A setting is what dynamo guards on: grad mode, autocast state,
train/eval and the adapters' on/off flag (peft's disable_adapter for the reference pass), so each of them gets a
graph of its own instead of reusing a stale one. Calls that carry a KV cache (generation by the trainer's own HF
engine, which shares the policy module) run eagerly: a cache that grows every decode step would only recompile.
A compiler failure warns once and leaves every layer eager, as grpo.head does for the LM head.

Dynamo caches graphs per code object, and every layer runs the one code object, so the update's settings multiply
into its cache: beside the ones above, the first layer's input has no grad (the embedding is frozen), and a pass of
one row (size 1 is never symbolic) or without padding (no attention mask) gets a graph of its own. That can pass
dynamo's default limit of 8 graphs, past which new settings run eagerly; compile_layers raises the process's
limit to RECOMPILE_LIMIT.
"""
from __future__ import annotations

import types
import warnings
from typing import Any

import torch

_COMPILED: dict[Any, "_Compiled"] = {}  # one compiled callable per backend, shared by every layer of the process
RECOMPILE_LIMIT = 32


def _eager(layer: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The layer's own forward (its class's, so a wrapped instance forward is skipped)."""
    return type(layer).forward(layer, *args, **kwargs)


class _Compiled:
    """torch.compile(_eager), or _eager itself once the compiler has failed: an optimization must not end a run
    on a lent GPU (a different torch there, a missing C++ compiler)."""

    def __init__(self, backend: Any):
        self.fn: Any = None
        try:
            self.fn = torch.compile(_eager, dynamic=True, backend=backend)
        except Exception as e:  # noqa: BLE001 - torch.compile itself refused (an unsupported Python, a bad backend)
            _warn(e)

    def __call__(self, layer: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
        if self.fn is not None:
            try:
                return self.fn(layer, *args, **kwargs)
            except torch.OutOfMemoryError:  # the pass's fault, not the compiler's: compiled passes stay on
                raise
            except Exception as e:  # noqa: BLE001 - any compiler error; a real fault fails again eagerly below
                self.fn = None
                _warn(e)
        return _eager(layer, *args, **kwargs)


def _warn(e: Exception) -> None:
    warnings.warn(f"optim.compile_layers: torch.compile of the decoder layers failed ({type(e).__name__}: "
                  f"{str(e)[:200]}); they run eagerly", RuntimeWarning, stacklevel=4)


def _compiled(backend: Any) -> _Compiled:
    if backend not in _COMPILED:  # created on the first pass, so the compiler is only touched when used
        _COMPILED[backend] = _Compiled(backend)
    return _COMPILED[backend]


def _forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The instance forward of a compiled layer. Bound with types.MethodType (not a closure over the layer) so
    a deep copy of the model binds it to the copy's layer."""
    if kwargs.get("cache") is not None or kwargs.get("past_key_values") is not None:  # name by transformers version
        return _eager(self, *args, **kwargs)
    return _compiled(self._compile_layers_backend)(self, args, kwargs)


def decoder_layers(model: Any) -> torch.nn.ModuleList | None:
    """The decoder's ModuleList of layers (an HF model's `model.layers`), found through a peft wrapper: the
    ModuleList named `layers` nearest the root."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    for name, module in base.named_modules():  # pre-order: a list inside a layer comes after the one holding it
        if isinstance(module, torch.nn.ModuleList) and name.rsplit(".", 1)[-1] == "layers" and len(module):
            return module
    return None


def is_compiled(layer: torch.nn.Module) -> bool:
    return getattr(layer.forward, "__func__", None) is _forward


def compile_layers(model: Any, backend: Any = "inductor") -> int:
    """Route each decoder layer of `model` through one shared torch.compile(dynamic=True); returns how many
    layers this call routed (0 the second time: a layer already routed is left alone). Compilation itself
    happens on the first pass. `backend`: torch.compile's (a name or a callable). A model without a `layers` list
    warns and stays eager."""
    layers = decoder_layers(model)
    if layers is None:
        warnings.warn(f"optim.compile_layers: no decoder layers found in {type(model).__name__}; it runs eagerly",
                      RuntimeWarning, stacklevel=2)
        return 0
    _raise_recompile_limit(RECOMPILE_LIMIT)
    routed = 0
    for layer in layers:
        if is_compiled(layer):
            continue
        layer._compile_layers_backend = backend
        layer.forward = types.MethodType(_forward, layer)
        routed += 1
    return routed


def _raise_recompile_limit(limit: int) -> None:
    """Dynamo's graphs-per-code-object limit to at least `limit` (`cache_size_limit` before torch renamed it)."""
    import torch._dynamo  # torch loads it lazily; explicit here, before its config is read

    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), limit))


def eager_layers(model: Any) -> int:
    """Undo compile_layers (the layers' own forward again); returns how many layers it restored. For A/B timing
    of one model in one process."""
    layers = decoder_layers(model)
    restored = 0
    for layer in layers if layers is not None else ():
        if is_compiled(layer):
            del layer.forward, layer._compile_layers_backend
            restored += 1
    return restored
