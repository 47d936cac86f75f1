"""The convert stage: a Hugging Face target + z-lab DFlash drafter -> a TensorRT-LLM checkpoint pair.

    pipeline.py   ConvertConfig, convert(): read, check, calibrate, quantize, shard, write atomically
    calibrate.py  activation / KV amaxes from decoding calibration prompts (builtin or Model Optimizer)

The formats it reads and writes (HF readers, TRT-LLM names / layout / writer, the quantization
handlers) live in `dflash_trt.checkpoint`; this stage is the one loop that joins them.
"""

from dflash_trt.convert.pipeline import CALIBRATION_FILE, CONFIG_FILE, ConvertConfig, ConvertResult, convert

__all__ = ["CALIBRATION_FILE", "CONFIG_FILE", "ConvertConfig", "ConvertResult", "convert"]
