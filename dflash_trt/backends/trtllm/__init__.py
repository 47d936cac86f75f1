"""The trtllm backend: paired TensorRT-LLM / TensorRT engines for DFlash, and the llmapi export.

Nothing here imports tensorrt, tensorrt_llm or onnxruntime at module level; the GPU stacks are
imported inside the functions that use them (`versions.require` raises a clear error naming the
package and the pinned version). Design, pins and upstream references: docs/trtllm-backend.md.

    versions      pins, lazy imports, installed-version probes
    plugin        the DFlashVerify plugin's registration metadata and library loading
    io_spec       engine / graph I/O specs, TensorRT profiles, dflash_engine.json
    onnx_graphs   the drafter as two export-friendly torch graphs (context K/V, propose)
    onnx_export   torch -> ONNX for those graphs
    sessions      onnxruntime (CPU) and TensorRT (GPU) sessions with one `run` signature
    draft_runner  DraftRunner over a session (onnxruntime in CI, TensorRT engines on GPUs)
    target_build  trtllm-build invocation for the target engine; target_model_cls: its model class
    build         TrtllmBackend: fills a bundle folder (engine/backend.py's contract)
    runner        TrtllmTargetRunner over TensorRT-LLM's Executor; load_trtllm_runners
    llmapi        Triton `llmapi` repository for TensorRT-LLM's native DFlash
"""
