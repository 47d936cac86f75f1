"""The DFlash target model class for `trtllm-build --model_cls_file` (TensorRT-LLM 1.2.1).

`dflash-trt build` copies this file into the bundle (`target/dflash_target_model.py`) next to
`dflash_target.json` (its settings) and passes it to trtllm-build, which loads it with
`SourceFileLoader('models', path).load_module()` and takes `getattr(module, --model_cls_name)`
(tensorrt_llm/commands/build.py `main`). So this file is self-contained (stdlib, numpy, tensorrt,
tensorrt_llm; never dflash_trt) and defines its classes lazily through the module `__getattr__`:
it imports anywhere, and asking for a class without TensorRT-LLM raises an ImportError naming it.

The classes subclass the stock `QWenForCausalLM` / `LLaMAForCausalLM` and add no parameters (the
stock checkpoint loads unchanged). `forward` runs the stock network, then marks two or three outputs:

    dflash_taps        [T, n*H]            post-layer residual stream of target_layer_ids, per token
                                           (the last layer after ln_f, as Hugging Face returns it)
    dflash_accept      [R, 2 + K + 1] i32  [accepted, valid_rows, t_0 .. t_K] of DFlashVerify run on
                                           the request's last K+1 rows (greedy: T=0, top-k 0, top-p 1)
    dflash_tail_logits [R, (K+1)*V] f32    their logits; only in engines built for sampled requests
                                           (settings "sampled"): its buffers cost max_num_tokens rows

T = packed tokens of the step, R = requests. Tail rows of request b, whose packed rows are
[prev_b, last_b) (`last_token_ids` are cumulative ends): r_j = max(last_b - 1 - (K - j), prev_b),
valid_rows = min(K + 1, last_b - prev_b). `tail_rows_reference` is that rule in numpy.

FOOTGUN: nothing below `_make_class` has ever run on our CI machines (TensorRT-LLM cannot be
installed there); it is written against the 1.2.1 functional API and checked on a GPU only.
"""

import json
from pathlib import Path

import numpy as np

SETTINGS_FILE = "dflash_target.json"
TRTLLM_PIN = "tensorrt-llm==1.2.1"
BASES = {"DFlashQwen3ForCausalLM": "QWenForCausalLM", "DFlashLlamaForCausalLM": "LLaMAForCausalLM"}


def load_settings(folder=None) -> dict:
    """The build's settings (taps, K, mask token, plugin library), from dflash_target.json beside this file."""
    path = Path(folder or Path(__file__).resolve().parent) / SETTINGS_FILE
    return json.loads(path.read_text())


def tail_rows_reference(last_token_ids, num_drafts: int):
    """Packed row indices [R, K+1] of each request's last K+1 rows (clamped to its own rows), valid [R]."""
    last = np.asarray(last_token_ids, dtype=np.int64)
    prev = np.concatenate([[0], last[:-1]])
    offsets = np.arange(num_drafts, -1, -1)  # K .. 0
    rows = np.maximum(last[:, None] - 1 - offsets[None, :], prev[:, None])
    return rows, np.minimum(last - prev, num_drafts + 1)


def __getattr__(name):
    if name in BASES:
        cls = _make_class(name)
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _make_class(name: str):
    try:
        import tensorrt as trt
        from tensorrt_llm import functional as F
        from tensorrt_llm import models
        from tensorrt_llm._common import default_trtnet
    except ImportError as exc:
        raise ImportError(f"{name} needs TensorRT-LLM ({TRTLLM_PIN}) and TensorRT; install them or use the "
                          f"NGC TensorRT-LLM container ({exc})") from exc
    settings = load_settings()
    here = Path(__file__).resolve().parent
    load_plugin(trt.get_plugin_registry(), (here / settings["plugin_library"]).resolve(), settings["plugin"])
    graph = _Graph(trt, F, default_trtnet, settings)
    base = getattr(models, BASES[name])

    class DFlashTarget(base):
        def __init__(self, config):
            super().__init__(config)
            self._dflash_store = {}
            for layer_id in settings["target_layer_ids"]:
                _record(self.transformer.layers[layer_id], layer_id, self._dflash_store)
            _record(self.transformer.ln_f, "ln_f", self._dflash_store)

        def forward(self, *args, **kwargs):
            self._dflash_store.clear()
            out = super().forward(*args, **kwargs)
            graph.mark_outputs(self, self._dflash_store, kwargs)
            return out

    DFlashTarget.__name__ = DFlashTarget.__qualname__ = name
    return DFlashTarget


def load_plugin(registry, library: Path, plugin: dict):
    """Load the DFlashVerify library into TensorRT's registry; its creator, or an error saying what failed.

    `IPluginRegistry.load_library` returns None when the library cannot be loaded and `get_creator`
    returns None when nothing of that name / version / namespace is registered (TensorRT Python API);
    unchecked, either surfaces later as an opaque AttributeError on None."""
    if not library.is_file():
        raise FileNotFoundError(f"{library}: the DFlashVerify plugin library is missing (dflash_target.json "
                                "'plugin_library' points here); rebuild the bundle")
    if registry.load_library(str(library)) is None:
        raise RuntimeError(f"{library}: TensorRT could not load this plugin library (built against another "
                           "TensorRT, or its CUDA runtime is missing); see TensorRT's log above")
    return plugin_creator(registry, plugin, library)


def plugin_creator(registry, plugin: dict, library) -> object:
    creator = registry.get_creator(plugin["name"], plugin["version"], plugin["namespace"])
    if creator is None:
        raise RuntimeError(f"{library}: loaded, but TensorRT has no plugin creator {plugin['name']!r} version "
                           f"{plugin['version']!r} namespace {plugin['namespace']!r}; rebuild the library from "
                           "plugins/dflash_verify against this TensorRT")
    return creator


def _record(module, key, store: dict) -> None:
    """Wrap one module's forward so its output (first element of a tuple) lands in `store[key]`."""
    forward = module.forward

    def recorded(*args, **kwargs):
        out = forward(*args, **kwargs)
        store[key] = out[0] if isinstance(out, tuple) else out
        return out

    object.__setattr__(module, "forward", recorded)  # instance attribute; Module.__call__ calls self.forward


class _Graph:
    """The extra outputs, in TensorRT-LLM functional ops (see the module docstring for shapes)."""

    def __init__(self, trt, F, default_trtnet, settings: dict):
        self.trt, self.F, self.trtnet, self.s = trt, F, default_trtnet, settings
        self.k = settings["num_drafts"]

    def const(self, array):
        return self.F.constant(np.ascontiguousarray(array))

    def mark_outputs(self, model, store: dict, kwargs: dict) -> None:
        F, s, k = self.F, self.s, self.k
        last_layer = s["num_layers"] - 1
        taps = F.concat([store["ln_f"] if i == last_layer else store[i] for i in s["target_layer_ids"]], dim=1)
        taps.mark_output("dflash_taps", s["dtype"])  # [T, n*H]
        rows, valid = self.tail_rows(kwargs["last_token_ids"])  # [R, K+1], [R]
        flat = rows.view([-1])
        logits = F.cast(model.lm_head(F.index_select(store["ln_f"], 0, flat)), "float32")  # [R*(K+1), V]
        drafts = F.index_select(kwargs["input_ids"], 0, F.slice(rows, [0, 1], F.concat([F.shape(rows, 0), k]))
                                .view([-1])).view(F.concat([F.shape(rows, 0), k]))  # [R, K]
        start = F.index_select(kwargs["position_ids"], 0, F.slice(rows, [0, 0], F.concat([F.shape(rows, 0), 1]))
                               .view([-1]))  # [R]
        tokens, accepted = self.verify(logits.view(F.concat([F.shape(rows, 0), k + 1, s["vocab_size"]])), drafts, start)
        accept = F.concat([F.unsqueeze(accepted, 1), F.unsqueeze(valid, 1), F.cast(tokens, "int32")], dim=1)
        accept.mark_output("dflash_accept", "int32")  # [R, 2 + K + 1]
        if s.get("sampled"):
            logits.view(F.concat([F.shape(rows, 0), (k + 1) * s["vocab_size"]])).mark_output(
                "dflash_tail_logits", "float32")  # [R, (K+1)*V]

    def tail_rows(self, last_token_ids):
        """`tail_rows_reference` in functional ops: rows [R, K+1] int32, valid [R] int32."""
        F, k = self.F, self.k
        last = F.cast(last_token_ids, "int32")
        prev = F.slice(F.concat([self.const(np.zeros(1, np.int32)), last]), [0], F.shape(last, 0).view([1]))
        offsets = self.const(np.arange(k, -1, -1, dtype=np.int32))  # [K+1]
        rows = F.maximum(F.unsqueeze(last - 1, 1) - F.unsqueeze(offsets, 0), F.unsqueeze(prev, 1))
        valid = F.minimum(last - prev, self.const(np.array([k + 1], np.int32)))
        return rows, valid

    def verify(self, logits, drafts, start):
        """DFlashVerify (IPluginV3) on [R, K+1, V] logits with greedy constants -> tokens [R, K+1], accepted [R]."""
        trt, F, plugin = self.trt, self.F, self.s["plugin"]
        creator = plugin_creator(trt.get_plugin_registry(), plugin, self.s["plugin_library"])
        field = trt.PluginField("mask_token_id", np.array([self.s["mask_token_id"]], np.int64),
                                trt.PluginFieldType.INT64)
        layer_plugin = creator.create_plugin("dflash_verify", trt.PluginFieldCollection([field]), trt.TensorRTPhase.BUILD)
        if layer_plugin is None:
            raise RuntimeError(f"DFlashVerify create_plugin returned None (mask_token_id {self.s['mask_token_id']})")
        zeros = F.cast(start, "float32") * 0.0
        sampling = [zeros, F.cast(start, "int32") * 0, zeros + 1.0, F.cast(start, "int64") * 0]  # T, top_k, top_p, seed
        inputs = [logits, F.cast(drafts, "int32"), F.cast(start, "int32"), *sampling]
        layer = self.trtnet().add_plugin_v3([t.trt_tensor for t in inputs], [], layer_plugin)
        return F._create_tensor(layer.get_output(0), layer), F._create_tensor(layer.get_output(1), layer)
