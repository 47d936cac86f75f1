"""OpenAI's API on the front, driven by the real `openai` client against the real tritonserver.

Completions at T = 0 equal local autoregressive decoding token for token, seeded sampling equals local
sampling with the same seed, chat goes through the tokenizer's chat template, streams add up to the
non-streamed answer, and what the server cannot honour is refused in OpenAI's error shape.
"""

import pytest

pytestmark = pytest.mark.integration  # every test here talks to the `served` tritonserver

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def client(front):
    return openai.OpenAI(base_url=f"http://{front}/v1", api_key="unused", max_retries=0, timeout=120)


def _local(pair, ids: list[int], max_new: int, temperature: float = 0.0, seed: int = 0) -> list[int]:
    from dflash_trt.decoding.autoregressive import autoregressive_generate
    from dflash_trt.decoding.requests import Request, StopCriteria
    from dflash_trt.decoding.sampling import SamplingParams
    from dflash_trt.tokenizer import stop_token_ids

    stops = stop_token_ids(pair.tokenizer, pair.target.config.eos_token_ids)
    request = Request(tuple(ids), SamplingParams(temperature, 0, 1.0, seed), StopCriteria(max_new, stops))
    return autoregressive_generate(pair.target, [request])[0].tokens


def test_models_are_the_triton_model_names(client, served):
    ids = sorted(m.id for m in client.models.list().data)
    assert ids == sorted(set(served[0].models) - {"ensemble"}) and "dflash" in ids and "dflash_ar" in ids


@pytest.mark.parametrize("model", ["dflash", "dflash_ar"])
def test_completion_at_t0_is_local_greedy_decoding(client, served, model):
    pair = served[1]
    prompt = "def fibonacci(n):\n    "
    out = client.completions.create(model=model, prompt=prompt, max_tokens=24, temperature=0)
    ids = pair.tokenizer.encode(prompt, add_special_tokens=True)
    tokens = _local(pair, ids, 24)
    assert out.choices[0].text == pair.tokenizer.decode(tokens, skip_special_tokens=True)
    assert out.usage.completion_tokens == len(tokens) and out.usage.prompt_tokens == len(ids)
    assert out.object == "text_completion" and out.model == model
    assert out.choices[0].finish_reason == ("length" if len(tokens) == 24 else "stop")
    stats = out.model_extra["dflash"]
    assert (stats["mean_acceptance_length"] > 1) == (model == "dflash") and stats["verify_steps"] >= 1


def test_seeded_sampling_is_local_sampling_with_the_same_seed(client, served):
    pair = served[1]
    ids = pair.tokenizer.encode("import os\n", add_special_tokens=True)
    out = client.completions.create(model="dflash", prompt=ids, max_tokens=20, temperature=0.9, seed=7)
    assert out.choices[0].text == pair.tokenizer.decode(_local(pair, ids, 20, 0.9, 7), skip_special_tokens=True)
    again = client.completions.create(model="dflash", prompt=ids, max_tokens=20, temperature=0.9, seed=7)
    assert again.choices[0].text == out.choices[0].text


def test_streamed_chat_adds_up_to_the_answer_and_uses_the_chat_template(client, served):
    pair = served[1]
    messages = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def add(a, b):"}]
    whole = client.chat.completions.create(model="dflash", messages=messages, max_tokens=16, temperature=0)
    ids = pair.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    assert whole.choices[0].message.content == pair.tokenizer.decode(_local(pair, ids, 16), skip_special_tokens=True)
    assert whole.choices[0].message.role == "assistant" and whole.usage.prompt_tokens == len(ids)
    chunks = list(client.chat.completions.create(model="dflash", messages=messages, max_tokens=16, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens


def test_multi_turn_chat_restores_the_conversation_so_far(client, served):
    """Each turn resends the whole conversation (a long system prompt, the answers so far): every turn after
    the first reports the restored prefix in usage.prompt_tokens_details.cached_tokens, and every answer is
    local greedy decoding of that turn's chat-templated prompt."""
    pair = served[1]
    system = "You are a careful Python programmer. " * 12
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "def parse(text):"}]
    for turn in range(3):
        out = client.chat.completions.create(model="dflash", messages=messages, max_tokens=20, temperature=0)
        ids = pair.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        answer = out.choices[0].message.content
        assert answer == pair.tokenizer.decode(_local(pair, ids, 20), skip_special_tokens=True)
        cached = out.usage.prompt_tokens_details.cached_tokens
        assert cached <= out.usage.prompt_tokens - 1 and (turn == 0 or cached >= 64), (turn, cached)
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": f"def step_{turn}(x):"}]


def test_streamed_completion_with_stop(client, served):
    pieces = list(client.completions.create(model="dflash", prompt="for i in range(10):\n", max_tokens=40,
                                            temperature=0, stream=True, stop=["\n"]))
    text = "".join(p.choices[0].text for p in pieces)
    assert "\n" not in text and pieces[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize("kwargs,status,fragment", [
    (dict(model="nope", prompt="x"), 404, "does not exist"),
    (dict(model="dflash", prompt="x", n=2), 400, "'n'"),
    (dict(model="dflash", prompt="x", logprobs=2), 400, "'logprobs'"),
    (dict(model="dflash", prompt="x", temperature=3.0), 400, "'temperature'"),
    (dict(model="dflash", prompt="x", extra_body={"best_friend": 1}), 400, "best_friend"),
    (dict(model="dflash", prompt="x", max_tokens=100000), 400, "max_seq_len"),
])
def test_what_the_server_cannot_honour_is_refused_in_openai_s_shape(client, kwargs, status, fragment):
    with pytest.raises(openai.APIStatusError) as caught:
        client.completions.create(**kwargs)
    assert caught.value.status_code == status and fragment in caught.value.message
    assert isinstance(caught.value.body, dict) and "message" in caught.value.body


def test_generate_names_a_wrong_port_or_protocol_in_one_line(served):
    """gRPC at the HTTP port, HTTP at the gRPC port, a closed port: one line each, no traceback."""
    from click.testing import CliRunner

    from dflash_trt.cli import cli
    from dflash_trt.triton.server import free_port

    server = served[0]
    cases = [(["--url", server.url], "no Triton gRPC server"),  # the HTTP port, spoken to over gRPC
             (["--url", server.grpc_url, "--protocol", "http"], "no Triton HTTP server"),
             (["--url", f"127.0.0.1:{free_port()}"], "no Triton gRPC server")]
    for args, fragment in cases:
        result = CliRunner().invoke(cli, ["generate", *args, "--prompt", "x", "--max-new-tokens", "4"])
        assert result.exit_code == 1 and fragment in result.output, result.output
        assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    local = CliRunner().invoke(cli, ["generate", "--prompt", "x", "--max-new-tokens", "100000"])
    assert local.exit_code == 2 and "max_position_embeddings" in local.output
    assert CliRunner().invoke(cli, ["generate", "--prompt", "x", "--device", "tpu"]).exit_code == 1
