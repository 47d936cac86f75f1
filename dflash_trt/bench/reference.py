"""Our engine against z-lab's reference `dflash_generate` (PyPI dflash==0.1.0), side by side.

Both decode the same prompts greedily at batch 1 in fp32 on this machine, alternating prompt by
prompt (so machine noise hits both alike); the comparison checks the tokens are identical and
reports the wall-time ratio. The reference target is Hugging Face's model class loaded from the
same folder (safetensors, no remote code); the reference drafter is z-lab's `DFlashDraftModel`.
"""

from __future__ import annotations

import importlib.util
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from dflash_trt.decoding.requests import Request, StopCriteria
from dflash_trt.errors import MissingDependencyError
from dflash_trt.runtime.local import local_engine


@dataclass
class ReferenceComparison:
    block_size: int
    prompts: int
    generated_tokens: int
    identical_prompts: int  # prompts whose tokens equal the reference's
    ours_seconds: float
    reference_seconds: float

    @property
    def speedup(self) -> float:
        return self.reference_seconds / self.ours_seconds

    def to_dict(self) -> dict:
        return asdict(self) | {"speedup": self.speedup,
                               "ours_tokens_per_s": self.generated_tokens / self.ours_seconds,
                               "reference_tokens_per_s": self.generated_tokens / self.reference_seconds}


def require_reference() -> None:
    if importlib.util.find_spec("dflash") is None or importlib.util.find_spec("transformers") is None:
        raise MissingDependencyError("the reference comparison needs z-lab's package and transformers: "
                                     "pip install transformers && pip install --no-deps dflash==0.1.0")


def load_reference(target_dir: Path, draft_dir: Path):
    """(z-lab module, HF target, z-lab drafter) in fp32, or a clear error without `dflash`."""
    require_reference()
    import dflash.model as zlab
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, Qwen3Config

    zlab._cuda_time = time.perf_counter  # its stats timer calls torch.cuda.synchronize()
    target = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    draft = zlab.DFlashDraftModel(Qwen3Config(**json.loads((Path(draft_dir) / "config.json").read_text()))).eval()
    draft.load_state_dict(load_file(str(Path(draft_dir) / "model.safetensors")), strict=False)
    return zlab, target, draft.float()


@torch.inference_mode()
def compare_with_reference(pair, prompts: list[list[int]], block_size: int, max_new_tokens: int, progress=None,
                           min_confidence: float = 0.0, width_policy: str = "auto") -> ReferenceComparison:
    """Alternate ours and `dflash_generate` per prompt (the first prompt once more, untimed, to warm up)."""
    zlab, ref_target, ref_draft = load_reference(pair.target_dir, pair.draft_dir)
    engine = local_engine(pair, max(map(len, prompts)) + max_new_tokens, block_size, min_confidence=min_confidence,
                          width_policy=width_policy, max_batch_size=1)
    ours_s = ref_s = 0.0
    identical = tokens = 0
    for i, prompt in enumerate([prompts[0]] + prompts):
        request = Request(tuple(prompt), stop=StopCriteria(max_new_tokens))
        t0 = time.perf_counter()
        ours = engine.generate([request])[0].tokens
        t1 = time.perf_counter()
        ref = zlab.dflash_generate(ref_draft, ref_target, torch.tensor([prompt]), max_new_tokens, None, 0.0,
                                   block_size=block_size)[0, len(prompt):].tolist()
        t2 = time.perf_counter()
        if i == 0:
            continue
        ours_s, ref_s = ours_s + t1 - t0, ref_s + t2 - t1
        identical += ours == ref
        tokens += len(ours)
        if progress is not None:
            progress()
    return ReferenceComparison(block_size, len(prompts), tokens, identical, ours_s, ref_s)
