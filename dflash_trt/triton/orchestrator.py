"""The `dflash` Triton model's logic: a decoupled Python-backend model, thin over `DFlashService`.

`model.py` in the repository only forwards `initialize / execute / finalize` here. `execute`
validates each request (a bad one gets an error response and nothing else happens), submits it to
the continuous-batching scheduler and returns at once; the scheduler thread streams committed
tokens back through the request's response sender. `pb_utils` is passed in (it only exists inside
the Triton stub), so everything else here is importable and testable anywhere.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
from dataclasses import replace

import numpy as np

from dflash_trt.errors import DFlashTrtError
from dflash_trt.runtime.service import DFlashService, ServiceLimits
from dflash_trt.triton.ensemble import CANCEL_PREFIX
from dflash_trt.triton.protocol import RequestLimits, parse_request
from dflash_trt.triton.text_stream import TextStream

TIME_BUCKETS = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0]


class Metrics:
    """Prometheus metrics on Triton's metrics port (pb_utils.MetricFamily)."""

    def __init__(self, pb, block_size: int, model: str):
        fam, labels = pb.MetricFamily, {"model": model}
        # FOOTGUN: a MetricFamily garbage-collected before its Metric makes every observe() raise.
        self.families = {
            "acceptance": fam("dflash_acceptance_length", "Tokens committed per verify step", fam.HISTOGRAM),
            "draft": fam("dflash_draft_step_seconds", "Draft pass time per decode step", fam.HISTOGRAM),
            "verify": fam("dflash_verify_step_seconds", "Verify pass time per decode step", fam.HISTOGRAM),
            "width": fam("dflash_verify_width", "Tokens verified per row in a decode step, after the confidence "
                         "cut (1: a plain autoregressive step; the width policy's choices)", fam.HISTOGRAM),
            "tokens": fam("dflash_generated_tokens_total", "Tokens generated", fam.COUNTER),
            "batch": fam("dflash_batch_size", "Requests in the last decode step", fam.GAUGE),
            "running": fam("dflash_requests_running", "Requests holding a decode slot", fam.GAUGE),
            "waiting": fam("dflash_requests_waiting", "Requests queued for a slot", fam.GAUGE),
            "restarts": fam("dflash_server_restarts_total", "Times `dflash-trt serve` restarted the server",
                            fam.COUNTER),
            # vLLM's speculative-decoding counters (vllm:spec_decode_*), under our prefix
            "drafts": fam("dflash_spec_decode_num_drafts", "Verify steps of a request that carried drafts", fam.COUNTER),
            "draft_tokens": fam("dflash_spec_decode_num_draft_tokens", "Draft tokens proposed", fam.COUNTER),
            "accepted": fam("dflash_spec_decode_num_accepted_tokens", "Draft tokens accepted", fam.COUNTER),
            "per_pos": fam("dflash_spec_decode_num_accepted_tokens_per_pos",
                           "Draft tokens accepted at each draft position (1 = the first draft)", fam.COUNTER),
            # vLLM's request_success_total{finished_reason}; and the failures Triton's own counters miss
            # (a decoupled model's error response counts as a success there)
            "success": fam("dflash_request_success_total", "Requests finished, by finish reason", fam.COUNTER),
            "failure": fam("dflash_request_failure_total", "Requests refused (bad input) or failed while decoding",
                           fam.COUNTER),
            # vLLM's prefix-cache counters (in tokens), and what the cache holds
            "prefix_queries": fam("dflash_prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
                                  fam.COUNTER),
            "prefix_hits": fam("dflash_prefix_cache_hits", "Prompt tokens restored from the prefix cache",
                               fam.COUNTER),
            "prefix_evictions": fam("dflash_prefix_cache_evictions", "Prefix-cache blocks evicted", fam.COUNTER),
            "prefix_usage": fam("dflash_prefix_cache_usage_bytes", "Bytes of K/V the prefix cache holds", fam.GAUGE),
            # acceptance of requests that restored a cached prefix (warm) and of the others (cold): τ is
            # committed tokens / verify steps of each
            "steps_by_prefix": fam("dflash_verify_steps_by_prefix", "Verify steps, by warm / cold prompt",
                                   fam.COUNTER),
            "committed_by_prefix": fam("dflash_committed_tokens_by_prefix",
                                       "Tokens committed by verify steps, by warm / cold prompt", fam.COUNTER),
        }
        lengths = [float(i) for i in range(1, block_size + 1)]
        self.acceptance = self.families["acceptance"].Metric(labels=labels, buckets=lengths)
        self.draft_s = self.families["draft"].Metric(labels=labels, buckets=TIME_BUCKETS)
        self.verify_s = self.families["verify"].Metric(labels=labels, buckets=TIME_BUCKETS)
        self.width = self.families["width"].Metric(labels=labels, buckets=lengths)
        self.tokens = self.families["tokens"].Metric(labels=labels)
        self.batch = self.families["batch"].Metric(labels=labels)
        self.running = self.families["running"].Metric(labels=labels)
        self.waiting = self.families["waiting"].Metric(labels=labels)
        self.restarts = self.families["restarts"].Metric(labels=labels)
        self.restarts.increment(float(os.environ.get("DFLASH_TRT_SERVER_RESTARTS") or 0))  # set by the supervisor
        self.drafts = self.families["drafts"].Metric(labels=labels)
        self.draft_tokens = self.families["draft_tokens"].Metric(labels=labels)
        self.accepted = self.families["accepted"].Metric(labels=labels)
        self.per_pos = [self.families["per_pos"].Metric(labels={**labels, "position": str(i)})
                        for i in range(1, block_size)]
        self.outcomes = {**{("success", r): self.families["success"].Metric(labels={**labels, "finished_reason": r})
                            for r in ("stop", "length", "cancelled")},
                         **{("failure", r): self.families["failure"].Metric(labels={**labels, "reason": r})
                            for r in ("refused", "error")}}
        self.prefix = {name: self.families[name].Metric(labels=labels)
                       for name in ("prefix_queries", "prefix_hits", "prefix_evictions", "prefix_usage")}
        self.by_prefix = {(name, warm): self.families[name].Metric(labels={**labels, "prefix": warm})
                          for name in ("steps_by_prefix", "committed_by_prefix") for warm in ("warm", "cold")}
        self.prefix_seen = (0, 0, 0)  # the cache's queries, hits, evictions at the last step

    def release(self) -> None:
        """Drop every Metric, then the families: a family must outlive its metrics, and both must go
        while the stub is still connected (not at interpreter exit)."""
        for name in ("acceptance", "draft_s", "verify_s", "width", "tokens", "batch", "running", "waiting", "restarts",
                     "drafts", "draft_tokens", "accepted", "per_pos", "outcomes", "prefix", "by_prefix"):
            setattr(self, name, None)
        self.families.clear()

    def on_request(self, kind: str, reason: str) -> None:
        """One request ended: ("success", stop | length | cancelled) or ("failure", refused | error)."""
        metric = self.outcomes.get((kind, reason)) if self.outcomes else None
        if metric is not None:
            metric.increment(1.0)

    def on_step(self, step) -> None:
        self.running.set(float(step.running))
        self.waiting.set(float(step.waiting))
        self._on_prefix(step)
        if not step.batch:
            return
        self.draft_s.observe(step.draft_s)
        self.verify_s.observe(step.verify_s)
        self.width.observe(float(step.drafts + 1))
        self.batch.set(float(step.batch))
        for n in step.committed:
            if n:
                self.acceptance.observe(float(n))
        self.tokens.increment(float(sum(step.committed) + step.admitted))
        if step.drafts:
            self.drafts.increment(float(len(step.accepted)))
            self.draft_tokens.increment(float(step.drafts * len(step.accepted)))
            self.accepted.increment(float(sum(step.accepted)))
            for i, metric in enumerate(self.per_pos[: step.drafts], start=1):
                hits = sum(a >= i for a in step.accepted)
                if hits:
                    metric.increment(float(hits))
            for warm, n in zip(step.warm, step.committed):
                self.by_prefix["steps_by_prefix", "warm" if warm else "cold"].increment(1.0)
                self.by_prefix["committed_by_prefix", "warm" if warm else "cold"].increment(float(n))

    def _on_prefix(self, step) -> None:
        """The prefix cache's counters since the last step (the scheduler keeps totals)."""
        if step.prefix is None:
            return
        totals = (step.prefix.queries, step.prefix.hits, step.prefix.evictions)
        for name, now, before in zip(("prefix_queries", "prefix_hits", "prefix_evictions"), totals, self.prefix_seen):
            if now > before:
                self.prefix[name].increment(float(now - before))
        self.prefix_seen = totals
        self.prefix["prefix_usage"].set(float(step.prefix_bytes))


log = logging.getLogger(__name__)


class Emitter:
    """One thread that talks to Triton for the scheduler: response sends, cancellation polls and
    metric updates are IPC round trips to the server process that would stall the scheduler thread
    under load, so the scheduler only queues them and goes on decoding. FIFO keeps each
    request's responses in order."""

    def __init__(self):
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="dflash-emitter", daemon=True)
        self.thread.start()

    def post(self, fn) -> None:
        self.queue.put(fn)

    def _run(self) -> None:
        while (fn := self.queue.get()) is not None:
            try:
                fn()
            except Exception:  # noqa: BLE001 - one failed delivery must not stop the others
                log.exception("emitter task failed")

    def close(self, timeout: float = 10.0) -> None:
        self.queue.put(None)
        self.thread.join(timeout)


class ResponseStream:
    """Scheduler sink for one request: turns events into Triton responses on its sender, on the
    emitter thread. A failed send or a client cancellation (polled after each send) sets `cancelled`,
    which the scheduler reads without any IPC."""

    def __init__(self, pb, sender, stream: bool, text: TextStream | None, emitter: Emitter, poll_cancelled=None,
                 prompt_tokens: int = 0, on_done=None):
        self.pb, self.sender, self.stream, self.text = pb, sender, stream, text
        self.emitter, self.poll_cancelled = emitter, poll_cancelled
        self.prompt_tokens = prompt_tokens
        self.on_done = on_done  # (kind, reason) when the request ends (metrics; on the emitter thread)
        self.cancelled = False

    def is_cancelled(self) -> bool:
        return self.cancelled

    def __call__(self, event) -> None:
        self.emitter.post(lambda: self._deliver_or_cancel(event))

    def _deliver_or_cancel(self, event) -> None:
        try:
            self._deliver(event)
            if not event.finished and self.poll_cancelled is not None and self.poll_cancelled():
                self.cancelled = True
        except Exception:  # noqa: BLE001 - the client is gone: the scheduler frees the slot
            self.cancelled = True
            log.info("response delivery failed; cancelling the request", exc_info=True)

    def _deliver(self, event) -> None:
        if event.error is not None:
            error = self.pb.InferenceResponse(output_tensors=[], error=self.pb.TritonError(event.error))
            self.sender.send(error, flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            if self.on_done is not None:
                self.on_done("failure", "error")
            return
        if not event.finished:
            if self.stream:
                delta = self.text.push(event.tokens) if self.text else ""
                self.sender.send(self._response(delta, event.tokens))
            return
        result = event.result
        if self.stream:
            text, ids = (self.text.finish() if self.text else ""), []
        else:
            text, ids = (self.text.full(result.tokens) if self.text else ""), result.tokens
        final = self._response(text, ids, result, event.stats)
        self.sender.send(final, flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        if self.on_done is not None:
            self.on_done("success", result.finish_reason or "stop")

    def _response(self, text: str, ids: list[int], result=None, stats=None):
        pb = self.pb
        lengths = result.acceptance_lengths if result else []
        tensors = [
            pb.Tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_)),
            pb.Tensor("output_ids", np.array(ids, dtype=np.int32)),
            pb.Tensor("finish_reason", np.array([(result.finish_reason if result else "").encode()], dtype=np.object_)),
            pb.Tensor("num_output_tokens", np.array([len(result.tokens) if result else 0], dtype=np.int32)),
            pb.Tensor("num_prompt_tokens", np.array([self.prompt_tokens], dtype=np.int32)),
            pb.Tensor("verify_steps", np.array([len(lengths)], dtype=np.int32)),
            pb.Tensor("mean_acceptance_length",
                      np.array([sum(lengths) / len(lengths) if lengths else 0.0], dtype=np.float32)),
            pb.Tensor("acceptance_lengths", np.array(lengths, dtype=np.int32)),
            *(pb.Tensor(name, value) for name, value in draft_statistics(result).items()),
            pb.Tensor("cached_tokens", np.array([result.cached_tokens if result else 0], dtype=np.int32)),
        ]
        return pb.InferenceResponse(output_tensors=tensors)


def draft_statistics(result) -> dict[str, np.ndarray]:
    """TensorRT-LLM llmapi's total_draft_tokens, total_accepted_draft_tokens, acceptance_rate."""
    drafted = result.draft_tokens if result else 0
    accepted = sum(result.accepted_drafts) if result else 0
    return {"total_draft_tokens": np.array([drafted], dtype=np.int32),
            "total_accepted_draft_tokens": np.array([accepted], dtype=np.int32),
            "acceptance_rate": np.array([accepted / drafted if drafted else 0.0], dtype=np.float32)}


class Orchestrator:
    def __init__(self, pb, args: dict):
        from dflash_trt.engine.bundle import verify_published
        from dflash_trt.runtime.backends import open_runners

        self.pb = pb
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        if not pb.using_decoupled_model_transaction_policy(config):
            raise pb.TritonModelException("the dflash model must be decoupled (model_transaction_policy)")
        manifest = verify_published(params["bundle_path"], params.get("bundle_manifest_sha256"))
        runtime = manifest["config"]["runtime"]
        block_size = 1 if params.get("mode") == "autoregressive" else manifest["block_size"]
        schedule = {int(k): int(v) for k, v in runtime.get("block_size_schedule", {}).items()}
        self.limits = ServiceLimits(int(params.get("max_batch_size", runtime["max_batch_size"])),
                                    int(params.get("max_seq_len", runtime["max_seq_len"])), block_size,
                                    schedule if block_size > 1 else None,
                                    draft_confidence=float(runtime.get("draft_confidence", 0.0)),
                                    width_policy=params.get("width_policy") or runtime.get("width_policy", "auto"),
                                    prefix_cache_bytes=int(runtime.get("prefix_cache_bytes", 0)),
                                    cuda_graphs=bool(runtime.get("cuda_graphs", True)))
        self.metrics = Metrics(pb, self.limits.block_size, config["name"])
        self.emitter = Emitter()
        on_step = lambda step: self.emitter.post(lambda: self.metrics.on_step(step))  # noqa: E731
        runners = open_runners(params["bundle_path"], self.limits, params.get("device") or None, manifest)
        self.tokenizer, self.vocab_size, self.eos_ids = runners.tokenizer, runners.vocab_size, runners.eos_ids
        self.detokenize = runners.detokenize
        self.request_limits = replace(RequestLimits.for_tokenizer(self.tokenizer, self.limits.max_seq_len),
                                      sampled_requests=bool(runtime.get("sampled_requests", True)))
        self.forwarded: dict[str, ResponseStream] = {}  # ensemble adapter request id -> its sink
        self.service = DFlashService(None, self.limits, on_step=on_step, runners=(runners.target, runners.draft),
                                     detokenize=runners.detokenize)

    def execute(self, requests) -> None:
        for request in requests:
            self._submit(request)
        return None

    def _submit(self, request) -> None:
        pb = self.pb
        sender = request.get_response_sender()

        def get(name):
            tensor = pb.get_input_tensor_by_name(request, name)
            return None if tensor is None else tensor.as_numpy()

        if get("cancel_request_id") is not None:
            return self._cancel(get("cancel_request_id"), sender)
        try:
            parsed = parse_request(get, self.tokenizer, self.limits.max_seq_len, self.vocab_size, self.eos_ids,
                                   self.request_limits)
            text = None
            if self.tokenizer is not None:
                text = TextStream(self.detokenize, parsed.request.stop.stop_strings)
            request_id = request.request_id() if hasattr(request, "request_id") else ""
            forwarded = request_id.startswith(CANCEL_PREFIX)  # the ensemble adapter's: cancelled by id

            def on_done(kind, reason, request_id=request_id):
                if forwarded:
                    self.forwarded.pop(request_id, None)
                self.metrics.on_request(kind, reason)

            sink = ResponseStream(pb, sender, parsed.stream, text, self.emitter, _cancel_check(request, sender),
                                  len(parsed.request.prompt), on_done)
            if forwarded:
                self.forwarded[request_id] = sink
            self.service.submit(parsed.request, sink, is_cancelled=sink.is_cancelled)
        except (DFlashTrtError, ValueError) as exc:
            message = exc.format_message() if isinstance(exc, DFlashTrtError) else str(exc)
            sender.send(pb.InferenceResponse(output_tensors=[], error=pb.TritonError(message)),
                        flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            self.emitter.post(lambda: self.metrics.on_request("failure", "refused"))

    def _cancel(self, request_id, sender) -> None:
        """A `cancel_request_id` request (the ensemble adapter's): cancel that forwarded request."""
        pb = self.pb
        key = _utf8_value(request_id)
        sink = self.forwarded.get(key) if key.startswith(CANCEL_PREFIX) else None
        if sink is not None:
            sink.cancelled = True
        reason = np.array([b"cancelled" if sink is not None else b""], dtype=np.object_)
        sender.send(pb.InferenceResponse(output_tensors=[pb.Tensor("finish_reason", reason)]),
                    flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self) -> None:
        self.service.shutdown()
        self.emitter.close()
        self.metrics.release()  # while the stub can still talk to the server


def _utf8_value(array) -> str:
    flat = np.asarray(array, dtype=object).reshape(-1)
    item = flat[0] if flat.size else b""
    return item.decode("utf-8", errors="replace") if isinstance(item, bytes) else str(item)


def _cancel_check(request, sender):
    if hasattr(sender, "is_cancelled"):
        return sender.is_cancelled
    if hasattr(request, "is_cancelled"):
        return request.is_cancelled
    return None
