"""BF16 / FP32 TensorRT-LLM checkpoints: layout, names, TP shards, and the torch runner equals HF."""

import json
import shutil

import pytest
import torch
from click.testing import CliRunner
from convert_helpers import run_convert, with_random_biases
from safetensors.torch import load_file
from tiny_models import make_draft, make_target

from dflash_trt.backends.torch.parallel import load_trtllm_pair
from dflash_trt.checkpoint.hf import read_draft, read_target
from dflash_trt.checkpoint.trtllm import load_rank, read_trtllm
from dflash_trt.checkpoint.trtllm_config import read_trtllm_config
from dflash_trt.cli import cli
from dflash_trt.convert import CONFIG_FILE, ConvertConfig
from dflash_trt.decoding.requests import Request, StopCriteria
from dflash_trt.model.loader import load_pair
from dflash_trt.runtime.local import generate

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
REQUESTS = [Request((5, 6, 7, 8), stop=StopCriteria(24)), Request((100, 3, 9), stop=StopCriteria(17))]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def llama_pair(tmp_path_factory):
    """Tied Llama with llama3 RoPE, attention and MLP biases: every optional name in the map."""
    root = tmp_path_factory.mktemp("llama")
    hf = make_target(root / "target", "llama", seed=3, tie_word_embeddings=True, rope_scaling=LLAMA3_ROPE,
                     rope_theta=500000.0, attention_bias=True, mlp_bias=True)
    with_random_biases(hf, root / "target")
    make_draft(root / "draft", hf.config)
    return root / "target", root / "draft", hf


@pytest.fixture(scope="module")
def converted(tiny_pair, llama_pair, tmp_path_factory):
    root = tmp_path_factory.mktemp("converted")
    out = {"qwen3": root / "qwen3", "llama": root / "llama", "bf16": root / "bf16"}
    run_convert(tiny_pair[0], tiny_pair[1], out["qwen3"])
    run_convert(llama_pair[0], llama_pair[1], out["llama"])
    run_convert(tiny_pair[0], tiny_pair[1], out["bf16"], dtype="bf16")
    return out


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_fp32_checkpoint_logits_match_transformers(family, converted, tiny_pair, llama_pair):
    hf = tiny_pair[2] if family == "qwen3" else llama_pair[2]
    pair = load_trtllm_pair(converted[family] / "target", converted[family] / "draft", dtype="fp32", device="cpu")
    ids = torch.randint(0, 256, (3, 37), generator=torch.Generator().manual_seed(0))
    cache = pair.target.new_cache(3, 64)
    logits, _ = pair.target(ids, torch.arange(37)[None].expand(3, -1), cache, torch.arange(3))
    assert (logits - hf(ids).logits).abs().max() <= 1e-4


def test_converted_pair_decodes_exactly_like_the_hf_pair(converted, tiny_pair):
    ours = load_trtllm_pair(converted["qwen3"] / "target", converted["qwen3"] / "draft", dtype="fp32", device="cpu")
    reference = load_pair(tiny_pair[0], tiny_pair[1], dtype="fp32", device="cpu")
    for a, b in zip(generate(ours, REQUESTS, block_size=4)[0], generate(reference, REQUESTS, block_size=4)[0]):
        assert a.tokens == b.tokens and a.acceptance_lengths == b.acceptance_lengths


def test_target_tensors_follow_trtllm_names(converted, tiny_pair):
    hf = tiny_pair[2].state_dict()
    rank = load_file(str(converted["qwen3"] / "target" / "rank0.safetensors"))
    layer = "transformer.layers.1."
    qkv = torch.cat([hf[f"model.layers.1.self_attn.{p}_proj.weight"] for p in "qkv"])
    assert torch.equal(rank[layer + "attention.qkv.weight"], qkv)  # fused [q | k | v]
    assert torch.equal(rank[layer + "mlp.fc.weight"], hf["model.layers.1.mlp.gate_proj.weight"])  # swapped
    assert torch.equal(rank[layer + "mlp.gate.weight"], hf["model.layers.1.mlp.up_proj.weight"])
    assert torch.equal(rank[layer + "mlp.proj.weight"], hf["model.layers.1.mlp.down_proj.weight"])
    assert torch.equal(rank[layer + "attention.dense.weight"], hf["model.layers.1.self_attn.o_proj.weight"])
    assert torch.equal(rank[layer + "attention.q_layernorm.weight"], hf["model.layers.1.self_attn.q_norm.weight"])
    assert torch.equal(rank[layer + "post_layernorm.weight"], hf["model.layers.1.post_attention_layernorm.weight"])
    assert torch.equal(rank["transformer.vocab_embedding.weight"], hf["model.embed_tokens.weight"])
    assert torch.equal(rank["transformer.ln_f.weight"], hf["model.norm.weight"])
    assert torch.equal(rank["lm_head.weight"], hf["lm_head.weight"])
    config = json.loads((converted["qwen3"] / "target" / "config.json").read_text())
    assert config["architecture"] == "Qwen3ForCausalLM" and config["qwen_type"] == "qwen3"
    # QWenDecoderLayer reads both unconditionally; QWenConfig sets seq_length only in from_hugging_face
    # (TensorRT-LLM tensorrt_llm/models/qwen/config.py@373970a, tensorrt_llm/models/qwen/model.py)
    assert config["seq_length"] == 8192 and config["use_logn_attn"] is False
    assert config["mapping"] == {"world_size": 1, "tp_size": 1, "pp_size": 1}
    assert config["quantization"]["quant_algo"] is None and config["dtype"] == "float32"
    assert read_trtllm_config(converted["qwen3"] / "target" / "config.json").model == read_target(tiny_pair[0]).config


def test_llama_biases_fuse_and_tied_lm_head_is_written(converted, llama_pair):
    hf = llama_pair[2].state_dict()
    rank = load_file(str(converted["llama"] / "target" / "rank0.safetensors"))
    qkv_bias = torch.cat([hf[f"model.layers.0.self_attn.{p}_proj.bias"] for p in "qkv"])
    assert torch.equal(rank["transformer.layers.0.attention.qkv.bias"], qkv_bias) and qkv_bias.abs().sum() > 0
    assert torch.equal(rank["transformer.layers.0.mlp.fc.bias"], hf["model.layers.0.mlp.gate_proj.bias"])
    assert torch.equal(rank["lm_head.weight"], hf["model.embed_tokens.weight"])
    config = json.loads((converted["llama"] / "target" / "config.json").read_text())
    assert config["architecture"] == "LlamaForCausalLM" and "qwen_type" not in config
    assert config["rotary_scaling"]["rope_type"] == "llama3" and config["rotary_base"] == 500000.0
    assert read_trtllm_config(converted["llama"] / "target" / "config.json").model == read_target(llama_pair[0]).config


def test_draft_checkpoint_naming_and_dflash_settings(converted, tiny_pair):
    folder = converted["qwen3"] / "draft"
    rank = load_file(str(folder / "rank0.safetensors"))
    zlab = tiny_pair[3].state_dict()
    assert torch.equal(rank["dflash.fc.weight"], zlab["fc.weight"])
    assert torch.equal(rank["dflash.hidden_norm.weight"], zlab["hidden_norm.weight"])
    assert torch.equal(rank["transformer.ln_f.weight"], zlab["norm.weight"])
    assert not any("vocab_embedding" in n or n.startswith("lm_head") for n in rank)
    assert read_trtllm_config(folder / "config.json").model == read_draft(tiny_pair[1]).config
    config = json.loads((folder / "config.json").read_text())  # the drafter is a qwen3-style stack too
    assert (config["qwen_type"], config["seq_length"], config["use_logn_attn"]) == ("qwen3", 8192, False)


def test_bf16_checkpoint_holds_bf16_rounded_weights(converted, tiny_pair):
    ckpt = read_trtllm(converted["bf16"] / "target")
    state = load_rank(ckpt, 0).state
    for name, weight in tiny_pair[2].state_dict().items():
        assert torch.equal(state[name], weight.bfloat16().float()), name


@pytest.fixture(scope="module")
def mqa_tp2(tmp_path_factory):
    """One KV head and an odd vocabulary, split over 2 ranks: KV duplication and lm_head padding."""
    root = tmp_path_factory.mktemp("mqa")
    hf = make_target(root / "target", "qwen3", seed=5, num_key_value_heads=1, vocab_size=255)
    make_draft(root / "draft", hf.config)
    run_convert(root / "target", root / "draft", root / "out", tp=2)
    return root / "out", hf.state_dict()


def test_tp2_shards_duplicate_kv_heads_and_pad_the_vocabulary(mqa_tp2):
    out, hf = mqa_tp2
    ranks = [load_file(str(out / "target" / f"rank{r}.safetensors")) for r in range(2)]
    q, k = hf["model.layers.0.self_attn.q_proj.weight"], hf["model.layers.0.self_attn.k_proj.weight"]
    for r, rank in enumerate(ranks):
        qkv = rank["transformer.layers.0.attention.qkv.weight"]
        assert qkv.shape == (32 + 16 + 16, 64)  # 2 local q heads + the (duplicated) kv head
        assert torch.equal(qkv[:32], q[32 * r : 32 * (r + 1)]) and torch.equal(qkv[32:48], k)
        assert rank["transformer.layers.0.attention.dense.weight"].shape == (64, 32)  # row-parallel
        assert rank["transformer.layers.0.mlp.fc.weight"].shape == (64, 64)  # column-parallel
        assert rank["lm_head.weight"].shape == (128, 64)
    assert torch.equal(ranks[1]["lm_head.weight"][-1], torch.zeros(64))  # padding row 255
    assert torch.equal(ranks[1]["lm_head.weight"][:-1], hf["lm_head.weight"][128:])
    assert read_trtllm(out / "draft").config.tp_size == 2


def test_text_calibration_prompts_and_tokenizer_files_travel_with_the_target(tiny_pair, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    target = tmp_path / "target"
    shutil.copytree(tiny_pair[0], target)
    tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(256)}, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(target / "tokenizer.json"))
    (target / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    calib = tmp_path / "calib.jsonl"
    calib.write_text(json.dumps({"text": "w1 w2 w3 w4"}) + "\n" + json.dumps({"token_ids": [5, 6, 7]}) + "\n")
    run_convert(target, tiny_pair[1], tmp_path / "out", quant="fp8", calib_data=str(calib))
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in (tmp_path / "out" / "target").iterdir()}
    assert json.loads((tmp_path / "out" / "calibration.json").read_text())["prompts"] == 2
    pair = load_trtllm_pair(tmp_path / "out" / "target", tmp_path / "out" / "draft", device="cpu")
    assert pair.tokenizer.encode("w7 w8", add_special_tokens=False) == [7, 8]


def test_convert_config_round_trips_beside_the_artifact(converted, tiny_pair):
    saved = ConvertConfig.load(converted["bf16"] / CONFIG_FILE)
    assert saved == ConvertConfig(str(tiny_pair[0]), str(tiny_pair[1]), str(converted["bf16"]), dtype="bf16",
                                  calibrator="builtin", calib_samples=4, calib_seq_len=16, calib_new_tokens=8)


def test_cli_convert_writes_both_checkpoints(tiny_pair, tmp_path):
    args = ["convert", "--target", str(tiny_pair[0]), "--draft", str(tiny_pair[1]), "--out", str(tmp_path / "o"),
            "--tp", "2", "--dtype", "fp16"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "wrote" in result.output and "4 rank files" in result.output
    assert sorted(p.name for p in (tmp_path / "o" / "draft").iterdir()) == ["config.json", "rank0.safetensors",
                                                                           "rank1.safetensors"]
    assert "convert" in CliRunner().invoke(cli, ["--help"]).output
