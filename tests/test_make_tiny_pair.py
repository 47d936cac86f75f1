"""scripts/make_tiny_pair.py: depth up-scaling of a trained target (--target-init)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "make_tiny_pair.py"
pytestmark = pytest.mark.slow


def _script():
    spec = importlib.util.spec_from_file_location("make_tiny_pair", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _model(layers: int, seed: int) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, tie_word_embeddings=True)
    return Qwen3ForCausalLM(config)


def test_upscale_repeats_layers_in_order(tmp_path):
    shallow = _model(3, seed=0)
    shallow.save_pretrained(tmp_path / "shallow")
    deep = _model(6, seed=1)
    _script().upscale_from(deep, tmp_path / "shallow")
    old, new = shallow.state_dict(), deep.state_dict()
    for i in range(6):  # layer i <- layer i * 3 // 6: 0, 0, 1, 1, 2, 2
        for name in ("self_attn.q_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight"):
            assert torch.equal(new[f"model.layers.{i}.{name}"], old[f"model.layers.{i // 2}.{name}"])
    assert torch.equal(new["model.embed_tokens.weight"], old["model.embed_tokens.weight"])
    assert torch.equal(new["model.norm.weight"], old["model.norm.weight"])
    assert torch.equal(deep.lm_head.weight, deep.model.embed_tokens.weight)  # still tied


def test_upscale_rejects_a_different_shape(tmp_path):
    torch.manual_seed(0)
    other = Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=16, intermediate_size=48, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=8))
    other.save_pretrained(tmp_path / "other")
    with pytest.raises(SystemExit, match="model.embed_tokens.weight has shape"):
        _script().upscale_from(_model(4, seed=1), tmp_path / "other")


def test_adopt_init_copies_the_tokenizer_and_records_the_init_log(tmp_path):
    init = tmp_path / "shallow" / "target"
    init.mkdir(parents=True)
    (init / "tokenizer.json").write_text('{"tok": 1}')
    (init / "tokenizer_config.json").write_text("{}")
    (tmp_path / "shallow" / "make_log.json").write_text('{"target": {"layers": 12, "steps": 800}}')
    log = {}
    _script().adopt_init(tmp_path / "deep", init, log)
    assert (tmp_path / "deep" / "target" / "tokenizer.json").read_text() == '{"tok": 1}'
    assert log["target_init"] == {"layers": 12, "steps": 800}
