"""Stop tokens from generation_config.json, joined with config.json's and the tokenizer's, as HF generate
stops (GenerationConfig.from_pretrained reads that file): locally, in a bundle and in the TensorRT-LLM
bundle's reader."""

import json

import pytest
import torch
from tiny_models import make_target

from dflash_trt.checkpoint.configs import generation_eos_ids
from dflash_trt.checkpoint.hf import read_target
from dflash_trt.errors import DFlashTrtError


@pytest.fixture(scope="module")
def target_with_generation_stop(tmp_path_factory):
    """A tiny target whose generation_config.json adds, as an EOS, a token its greedy output writes."""
    from transformers import GenerationConfig

    folder = tmp_path_factory.mktemp("gen-target")
    model = make_target(folder, eos_token_id=3)
    prompt = torch.tensor([[5, 17, 42, 9]])
    free = model.generate(prompt, generation_config=GenerationConfig(max_new_tokens=30, do_sample=False,
                                                                     eos_token_id=None, pad_token_id=0))[0, 4:].tolist()
    stop = next(t for t in free[3:] if t != 3)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [3, stop], "pad_token_id": 0}))
    return folder, model, prompt, stop


def test_local_decoding_stops_where_hf_generate_does(target_with_generation_stop):
    from transformers import GenerationConfig

    from dflash_trt.decoding.autoregressive import autoregressive_generate
    from dflash_trt.decoding.requests import Request, StopCriteria
    from dflash_trt.model.loader import load_pair

    folder, model, prompt, stop = target_with_generation_stop
    config = GenerationConfig.from_pretrained(folder)
    config.max_new_tokens, config.do_sample = 30, False
    hf = model.generate(prompt, generation_config=config)[0, 4:].tolist()
    assert hf[-1] == stop and len(hf) < 30  # HF stops on the generation config's id
    checkpoint = read_target(folder)
    assert checkpoint.config.eos_token_ids == (3, stop)
    target = load_pair(folder, dtype="fp32", device="cpu").target
    request = Request(tuple(prompt[0].tolist()), stop=StopCriteria(30, frozenset(target.config.eos_token_ids)))
    assert autoregressive_generate(target, [request])[0].tokens == hf


def test_a_bundle_carries_the_generation_config(target_with_generation_stop, tmp_path):
    from dflash_trt.engine.bundle import copy_model
    from dflash_trt.runtime.backends import _hf_eos

    folder, _, _, stop = target_with_generation_stop
    copy_model(folder, tmp_path / "target")
    assert read_target(tmp_path / "target").config.eos_token_ids == (3, stop)
    (tmp_path / "trt").mkdir()  # a TensorRT-LLM bundle's target folder: hf_config.json + generation_config.json
    (tmp_path / "trt" / "hf_config.json").write_text((folder / "config.json").read_text())
    (tmp_path / "trt" / "generation_config.json").write_text((folder / "generation_config.json").read_text())
    assert _hf_eos(tmp_path / "trt") == (3, stop)


def test_a_bad_generation_config_names_the_file_and_field(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": ["</s>"]}))
    with pytest.raises(DFlashTrtError, match="generation_config.json.*eos_token_id"):
        generation_eos_ids(tmp_path)
    assert generation_eos_ids(tmp_path / "missing") == ()
