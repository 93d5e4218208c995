"""The reference model, challenges and the logit comparison, on a tiny random Qwen2 on the CPU."""

import inspect
import json
import math
import random
import shutil
import socket
import subprocess
import sys
import warnings

import pytest
import torch

from quasar import logits as L
from tiny_qwen import TINY_BOS, TINY_VOCAB, make_tiny_qwen2

LIMITS = L.ChallengeLimits(max_prompt_len=40, max_gen_len=10)
THRESHOLDS = L.LogitThresholds()


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return make_tiny_qwen2(root / "seed1", seed=1), make_tiny_qwen2(root / "seed2", seed=2)


@pytest.fixture(scope="module")
def model(model_dirs):
    return L.load_reference_model(str(model_dirs[0]), "cpu", "float32")


@pytest.fixture(scope="module")
def other_model(model_dirs):
    return L.load_reference_model(str(model_dirs[1]), "cpu", "float32")


def fresh_challenges(model, count):
    rng = random.Random()  # fresh inputs every run; the seed is in the failure message
    seed = random.SystemRandom().randrange(2**32)
    rng.seed(seed)
    return seed, [L.draw_challenge(model.ordinary_tokens, LIMITS, rng) for _ in range(count)]


def test_loaded_model_describes_itself(model):
    assert model.vocab_size == TINY_VOCAB and model.dtype == torch.float32 and model.dtype_name == "float32"
    assert model.ordinary_tokens == L.TokenRange(TINY_BOS)  # specials at the top end the ordinary range
    assert not model.module.training and not any(p.requires_grad for p in model.module.parameters())


def test_kv_cache_generation_matches_the_full_forward_reference(model):
    seed, challenges = fresh_challenges(model, 4)
    for challenge in challenges:
        fast = L.generate_with_logits(model, challenge.prompt, challenge.gen_len, challenge.logits_at_step)
        slow = L.generate_without_cache(model, challenge.prompt, challenge.gen_len, challenge.logits_at_step)
        assert fast.tokens == slow.tokens, f"seed {seed}: {challenge}"
        assert len(fast.tokens) == challenge.gen_len and fast.logits.dtype == torch.float32
        torch.testing.assert_close(fast.logits, slow.logits, atol=1e-4, rtol=1e-4, msg=f"seed {seed}")


def test_every_forward_runs_in_full_float32_whatever_the_process_set(model):
    """NVIDIA's PyTorch containers set TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 and some code sets
    ``torch.set_float32_matmul_precision("high")``: either made a validator's float32 logits TF32
    (0.11 off the CPU's on an H100, over the 0.1 limit). Each forward sets "highest" explicitly,
    which overrules both (tests/test_logits_gpu.py measures it), and puts the process's back."""
    seen = []
    hook = model.module.register_forward_pre_hook(lambda *_: seen.append(torch.get_float32_matmul_precision()))
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        challenge = fresh_challenges(model, 1)[1][0]
        L.generate_with_logits(model, challenge.prompt, challenge.gen_len, challenge.logits_at_step)
        L.generate_without_cache(model, challenge.prompt, challenge.gen_len, challenge.logits_at_step)
        L.path_logits(model, challenge.prompt, [1, 2, 3])
        assert torch.get_float32_matmul_precision() == "medium"
    finally:
        torch.set_float32_matmul_precision(previous)
        hook.remove()
    assert len(seen) >= 2 * challenge.gen_len + 1 and set(seen) == {"highest"}


def test_decoding_passes_the_cache_under_the_name_the_installed_transformers_takes(model):
    """transformers 5.24 warns on ``past_key_values`` (and drops it in 5.40): the decoding loop must
    use the name of the installed version, so a validator's log carries no deprecation and the next
    release does not break the logit check."""
    seed, (challenge,) = fresh_challenges(model, 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.generate(challenge.prompt, 4, 2)
    assert not [str(w.message) for w in caught if "past_key_values" in str(w.message)], f"seed {seed}"
    assert model.cache_keyword in inspect.signature(model.module.forward).parameters


def test_the_cache_keyword_follows_the_forward_signature():
    def forward_4x(input_ids=None, past_key_values=None, use_cache=None, **kwargs): ...

    def forward_5x(input_ids=None, cache=None, use_cache=None, **kwargs): ...

    assert L.cache_keyword(forward_4x) == "past_key_values"
    assert L.cache_keyword(forward_5x) == "cache"


def test_step_one_is_the_logits_right_after_the_prompt_and_steps_follow_the_path(model):
    seed, (challenge,) = fresh_challenges(model, 1)
    gen_len = 6
    with torch.inference_mode():
        after_prompt = model.module(input_ids=torch.tensor([list(challenge.prompt)])).logits[0, -1]
    first = model.generate(challenge.prompt, gen_len, 1)
    torch.testing.assert_close(first.logits, after_prompt, atol=1e-4, rtol=1e-4, msg=f"seed {seed}")
    assert first.tokens[0] == int(after_prompt.argmax())
    path = L.path_logits(model, challenge.prompt, first.tokens)
    assert path.shape == (gen_len, TINY_VOCAB)
    for step in range(1, gen_len + 1):
        at_step = model.generate(challenge.prompt, gen_len, step)
        assert at_step.tokens == first.tokens
        torch.testing.assert_close(path[step - 1], at_step.logits, atol=1e-4, rtol=1e-4, msg=f"seed {seed} step {step}")
        assert int(path[step - 1].argmax()) == first.tokens[step - 1]
    assert not torch.allclose(path[0], path[1]), "consecutive steps must differ for the step check to mean anything"


@pytest.mark.parametrize(
    "prompt, gen_len, step, field",
    [
        ([], 3, 1, "prompt"),
        ([1, TINY_VOCAB], 3, 1, "prompt[1]"),
        ([1, -1], 3, 1, "prompt[1]"),
        ([1, True], 3, 1, "prompt[1]"),  # JSON's true is no token id, though Python's bool is an int
        ([1, 2], 0, 1, "gen_len: must be at least 1"),
        ([1, 2], 3, 4, "logits_at_step"),
        ([1, 2], 3, 0, "logits_at_step"),
        ([1] * 1000, 25, 1, "context"),
    ],
)
def test_requests_out_of_range_are_refused_naming_the_field(model, prompt, gen_len, step, field):
    with pytest.raises(L.ChallengeError, match=field.replace("[", r"\[")):
        model.generate(prompt, gen_len, step)


def test_challenges_stay_inside_the_limits_and_the_ordinary_vocabulary():
    tokens = L.TokenRange(20, frozenset({0, 7}))
    rng = random.Random(5)
    seen = set()
    for _ in range(300):
        challenge = L.draw_challenge(tokens, LIMITS, rng)
        assert LIMITS.min_prompt_len <= len(challenge.prompt) <= LIMITS.max_prompt_len
        assert 1 <= challenge.logits_at_step <= challenge.gen_len <= LIMITS.max_gen_len
        assert all(t in tokens for t in challenge.prompt)
        seen.update(challenge.prompt)
    assert seen == set(range(20)) - {0, 7}
    payload = challenge.payload()
    assert payload == {
        "prompt": list(challenge.prompt),
        "gen_len": challenge.gen_len,
        "logits_at_step": challenge.logits_at_step,
    }


def test_default_challenge_source_is_the_system_random():
    tokens = L.TokenRange(TINY_BOS)
    draws = {L.draw_challenge(tokens, LIMITS) for _ in range(5)}
    assert len(draws) == 5


def test_bad_limits_and_empty_ranges_are_refused():
    with pytest.raises(ValueError, match="empty"):
        L.ChallengeLimits(max_prompt_len=4, max_gen_len=3)  # below the minimum prompt length
    with pytest.raises(ValueError, match="max_gen_len"):
        L.ChallengeLimits(max_prompt_len=40, max_gen_len=0)
    with pytest.raises(ValueError, match="empty"):
        L.TokenRange(2, frozenset({0, 1}))
    assert L.ChallengeLimits(max_prompt_len=8, max_gen_len=1).min_prompt_len == 8  # one length: 8


def test_ordinary_range_matches_known_vocabularies():
    # Qwen2.5: bos/eos <|endoftext|> 151643, <|im_end|> 151645, 151936 embedding rows.
    qwen = L.ordinary_token_range({151643, 151645}, 151936)
    assert qwen == L.TokenRange(151643) and qwen.size == 151643
    # Llama 2: bos 1, eos 2, pad unset, 32000 rows: the bottom specials are excluded one by one.
    llama2 = L.ordinary_token_range({1, 2}, 32000)
    assert llama2.end == 32000 and llama2.excluded == {1, 2} and 1 not in llama2 and 3 in llama2
    assert L.ordinary_token_range(set(), 100) == L.TokenRange(100)


def test_the_ordinary_range_ends_at_a_special_id_in_the_upper_half_of_the_table():
    # Row 50 of 100 opens the upper half: a special id there ends the range; 49 is excluded alone.
    assert L.ordinary_token_range({50}, 100) == L.TokenRange(50)
    assert L.ordinary_token_range({49}, 100) == L.TokenRange(100, frozenset({49}))
    # Ids outside the embedding (a config's stray or negative id) neither end nor shrink the range.
    assert L.ordinary_token_range({200, -1}, 100) == L.TokenRange(100)


def test_a_token_range_holds_and_counts_only_its_ordinary_ids():
    tokens = L.TokenRange(10, frozenset({3, 20, -1}))
    assert tokens.size == 9  # 20 and -1 lie outside [0, 10): only 3 is taken out
    assert [i for i in range(-2, 12) if i in tokens] == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    assert L.TokenRange(1, frozenset({5})).size == 1


def test_the_models_special_ids_are_left_out_of_the_challenges(model_dirs, tmp_path):
    # bos, eos and pad of the config and of the generation config, id 0 and a list of eos ids included.
    folder = shutil.copytree(model_dirs[0], tmp_path / "model")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "pad_token_id": 0}))
    generation = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**generation, "eos_token_id": [TINY_BOS + 1, 3]}))
    loaded = L.load_reference_model(str(folder), "cpu", "float32")
    assert loaded.ordinary_tokens == L.TokenRange(TINY_BOS, frozenset({0, 3}))


def test_challenges_reach_every_bound_the_prompt_from_8_tokens():
    # docs/rules.md section 4 step 6: 8 to max_prompt_len prompt tokens, 1 to max_gen_len
    # generated, and any of their steps.
    limits = L.ChallengeLimits(max_prompt_len=10, max_gen_len=3)
    rng = random.Random(7)
    draws = [L.draw_challenge(L.TokenRange(20), limits, rng) for _ in range(400)]
    assert {len(challenge.prompt) for challenge in draws} == {8, 9, 10}
    assert {(challenge.gen_len, challenge.logits_at_step) for challenge in draws} == {
        (gen_len, step) for gen_len in (1, 2, 3) for step in range(1, gen_len + 1)
    }


def test_compare_logits_matches_the_plain_python_cosine_on_random_vectors():
    rng = random.Random(random.SystemRandom().randrange(2**32))
    for _ in range(20):
        n = rng.randint(2, 300)
        a = [rng.gauss(0, 3) for _ in range(n)]
        b = [x + rng.gauss(0, rng.choice([0.001, 0.05, 3.0])) for x in a]
        result = L.compare_logits(torch.tensor(a, dtype=torch.float64), b, 0.99, 0.1)
        assert math.isclose(result.cosine, L.cosine_reference(a, b), rel_tol=1e-9, abs_tol=1e-12)
        assert math.isclose(result.max_abs_diff, max(abs(x - y) for x, y in zip(a, b)), rel_tol=1e-9)
        assert result.passed == (result.cosine >= 0.99 and result.max_abs_diff <= 0.1)


def test_compare_logits_verdicts():
    ref = torch.randn(256, generator=torch.Generator().manual_seed(0)) * 3
    assert L.compare_logits(ref, ref.clone(), 0.99, 0.1).passed
    close = L.compare_logits(ref, ref + 0.05, 0.99, 0.1)
    assert close.passed and close.max_abs_diff == pytest.approx(0.05, abs=1e-6)
    shifted = L.compare_logits(ref, ref + 0.2, 0.99, 0.1)  # same ranking, cosine ~1, too far off
    assert not shifted.passed and shifted.cosine > 0.99 and "max |diff| 0.2 > 0.1" in shifted.reason
    scaled = L.compare_logits(ref, ref * 1.5, 0.99, 0.1)
    assert not scaled.passed and scaled.cosine == pytest.approx(1.0)
    assert not L.compare_logits(ref, -ref, 0.99, 10.0).passed
    assert "shape (255,)" in L.compare_logits(ref, ref[:-1], 0.99, 0.1).reason
    assert "shape (1, 256)" in L.compare_logits(ref, ref[None], 0.99, 0.1).reason
    assert "shape (2, 128)" in L.compare_logits(ref.reshape(2, 128), ref.reshape(2, 128), 0.99, 0.1).reason
    broken_reference = ref.clone()
    broken_reference[3] = float("inf")
    assert L.compare_logits(broken_reference, ref, 0.99, 0.1).reason == "the reference logits are not finite"
    for bad in (float("nan"), float("inf")):
        broken = ref.clone()
        broken[17] = bad
        result = L.compare_logits(ref, broken, 0.99, 0.1)
        assert not result.passed and "non-finite" in result.reason and "index 17" in result.reason
    assert "all zero" in L.compare_logits(ref, torch.zeros(256), 0.99, 0.1).reason


def test_compare_logits_passes_a_cosine_and_a_difference_of_exactly_the_thresholds():
    # docs/rules.md section 4 step 6: a cosine of at least, a difference of at most, the threshold.
    ref = torch.randn(256, generator=torch.Generator().manual_seed(1)) * 3
    candidate = ref + 0.03 * torch.randn(256, generator=torch.Generator().manual_seed(2))
    measured = L.compare_logits(ref, candidate, 0.0, math.inf)
    assert measured.cosine < 1 and measured.max_abs_diff > 0
    assert L.compare_logits(ref, candidate, measured.cosine, measured.max_abs_diff).passed


def test_verify_generation_passes_the_honest_answer_and_fails_the_dishonest_ones(model, other_model):
    seed, challenges = fresh_challenges(model, 3)
    for challenge in challenges:
        honest = model.generate(challenge.prompt, challenge.gen_len, challenge.logits_at_step)
        verdict = L.verify_generation(model, challenge, honest.tokens, honest.logits, THRESHOLDS)
        assert verdict.passed and verdict.cosine > 0.9999, f"seed {seed}: {verdict.reason}"

        other = other_model.generate(challenge.prompt, challenge.gen_len, challenge.logits_at_step)
        assert not L.verify_generation(model, challenge, other.tokens, other.logits, THRESHOLDS).passed
        # Honest tokens with another model's logits: caught by the comparison itself.
        mixed = L.verify_generation(model, challenge, honest.tokens, other.logits, THRESHOLDS)
        assert not mixed.passed and mixed.cosine is not None and mixed.cosine < 0.99

        longer = model.generate(challenge.prompt, challenge.gen_len + 1, challenge.logits_at_step + 1)
        shifted = L.verify_generation(model, challenge, longer.tokens[:-1], longer.logits, THRESHOLDS)
        assert not shifted.passed, f"seed {seed}: logits of step {challenge.logits_at_step + 1} passed"


def test_verify_generation_checks_the_tokens(model):
    seed, (challenge,) = fresh_challenges(model, 1)
    honest = model.generate(challenge.prompt, challenge.gen_len, challenge.logits_at_step)
    tokens = list(honest.tokens)
    assert "expected gen_len" in L.verify_generation(model, challenge, tokens + [1], honest.logits, THRESHOLDS).reason
    three = L.Challenge(prompt=tuple(range(1, 9)), gen_len=3, logits_at_step=1)
    answer = model.generate(three.prompt, three.gen_len, three.logits_at_step)
    fewer = L.verify_generation(model, three, answer.tokens[:-1], answer.logits, THRESHOLDS)
    assert not fewer.passed and fewer.reason == "returned 2 tokens, expected gen_len 3"
    true_id = L.verify_generation(model, three, [True, *answer.tokens[1:]], answer.logits, THRESHOLDS)
    assert not true_id.passed and "tokens[0]: True is outside the vocabulary" in true_id.reason
    bad_id = tokens[:-1] + [TINY_VOCAB]
    assert "outside the vocabulary" in L.verify_generation(model, challenge, bad_id, honest.logits, THRESHOLDS).reason
    path = L.path_logits(model, challenge.prompt, tokens)
    worst = int(path[-1].argmin())
    not_greedy = tokens[:-1] + [worst]
    result = L.verify_generation(model, challenge, not_greedy, honest.logits, THRESHOLDS)
    assert not result.passed and f"step {challenge.gen_len}" in result.reason and "not a greedy choice" in result.reason


def test_a_token_is_a_greedy_choice_within_twice_the_difference_bound(model):
    # docs/rules.md section 4 step 6: a returned token scoring at most 2 x max_abs_diff under the
    # reference's best passes, one scoring more fails; the first step is held as every other.
    challenge = L.Challenge(prompt=tuple(range(1, 9)), gen_len=2, logits_at_step=2)
    second = int(L.path_logits(model, challenge.prompt, [0])[0].topk(2).indices[1])
    after = int(L.path_logits(model, challenge.prompt, [second, 0])[1].argmax())
    tokens = [second, after]
    path = L.path_logits(model, challenge.prompt, tokens)  # the rows the check computes
    gap, logits = float(path[0].max() - path[0, second]), path[1]
    assert gap > 0
    at_bound = L.LogitThresholds(min_cosine=0.99, max_abs_diff=gap / 2)
    assert L.verify_generation(model, challenge, tokens, logits, at_bound).passed
    under = L.LogitThresholds(min_cosine=0.99, max_abs_diff=gap / 2 * 0.99)
    result = L.verify_generation(model, challenge, tokens, logits, under)
    assert not result.passed and result.reason.startswith(f"token at step 1 is {second}, not a greedy choice")


def test_loading_errors_name_the_model_and_the_fix(tmp_path, monkeypatch):
    missing = tmp_path / "no-such-model"
    with pytest.raises(L.ModelLoadError, match=f"{missing} does not exist"):
        L.load_reference_model(str(missing))
    (tmp_path / "empty").mkdir()
    with pytest.raises(L.ModelLoadError, match="has no config.json"):
        L.load_reference_model(str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(L.ModelLoadError) as error:
        L.load_reference_model("quasar-tests/not-a-cached-model")
    assert "'quasar-tests/not-a-cached-model'" in str(error.value)
    assert "offline mode is on" in str(error.value) and "hf download quasar-tests/not-a-cached-model" in str(
        error.value
    )
    with pytest.raises(ValueError, match="unsupported dtype 'float8'"):
        L.load_reference_model(str(missing), dtype="float8")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    with pytest.raises(L.ModelLoadError, match="from its folder: .* must hold config.json and the weights"):
        L.load_reference_model(str(tmp_path / "broken"))


def test_a_local_folder_loads_in_offline_mode(model_dirs, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert L.load_reference_model(str(model_dirs[0])).vocab_size == TINY_VOCAB


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without CUDA")
def test_cuda_without_a_gpu_is_a_clear_error(model_dirs):
    with pytest.raises(L.ModelLoadError, match="no CUDA device"):
        L.load_reference_model(str(model_dirs[0]), "cuda")


def test_offline_mode_follows_either_variable():
    assert L.offline_mode({"HF_HUB_OFFLINE": "1"}) and L.offline_mode({"TRANSFORMERS_OFFLINE": "true"})
    assert not L.offline_mode({}) and not L.offline_mode({"HF_HUB_OFFLINE": "0"})


def test_lower_precision_loads_in_the_stated_dtype(model_dirs, model):
    half = L.load_reference_model(str(model_dirs[0]), "cpu", "bfloat16")
    assert half.dtype == torch.bfloat16 and next(half.module.parameters()).dtype == torch.bfloat16
    challenge = L.Challenge(tuple(range(1, 20)), 3, 2)
    result = half.generate(challenge.prompt, 3, 2)
    assert result.logits.dtype == torch.float32
    verdict = L.verify_generation(model, challenge, result.tokens, result.logits, THRESHOLDS)
    assert verdict.cosine is None or verdict.cosine > 0.99  # same model, only rounding differs


def test_a_model_neither_cached_nor_reachable_is_refused_at_once(tmp_path, monkeypatch):
    # No cache, and a hub that does not answer: one clear message within seconds, no retries.
    import socket
    import time

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache" / "hub"))
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    started = time.monotonic()
    with pytest.raises(L.ModelLoadError) as error:
        L.load_reference_model("quasar-tests/not-a-cached-model")
    assert time.monotonic() - started < 10
    message = str(error.value)
    assert "not in the local Hugging Face cache" in message and f"127.0.0.1:{port} cannot be reached" in message
    assert "hf download quasar-tests/not-a-cached-model" in message


def test_a_model_of_another_architecture_is_refused_at_start_on_a_public_network(model_dirs):
    """A validator or inference server on finney with REFERENCE_MODEL at another model started and
    failed every logit check (a miner's against the validators' Qwen2.5, a validator's against
    every honest miner); it is refused at start, naming each difference. A local network's
    stand-in model is taken."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from quasar import config
    from quasar.validator.logit_check import MinerLogitChecker

    def settings(network):
        values = {"network": network, "reference_model": str(model_dirs[0]), "device": "cpu"}
        return config.resolve(values, environ={}, dotenv_path=None)

    with pytest.raises(L.ModelLoadError) as error:
        MinerLogitChecker.from_settings(settings("finney"), None, "cpu")
    message = str(error.value)
    assert f"'{model_dirs[0]}' is not Qwen/Qwen2.5-0.5B-Instruct's architecture" in message
    assert f"vocab_size {TINY_VOCAB} (the reference's 151936)" in message and "hidden_size 64" in message
    assert "set REFERENCE_MODEL to Qwen/Qwen2.5-0.5B-Instruct" in message
    assert MinerLogitChecker.from_settings(settings("local"), None, "cpu").reference.vocab_size == TINY_VOCAB

    with torch.device("meta"):  # the reference's shape without its 2 GB of weights
        shaped = Qwen2ForCausalLM(Qwen2Config(**{k: v for k, v in L.REFERENCE_SHAPE.items() if k != "model_type"}))
    reference = L.ReferenceModel(
        "Qwen/Qwen2.5-0.5B-Instruct", shaped, torch.device("meta"), torch.float32, 151936, L.TokenRange(151643), 32768
    )
    L.check_reference_shape(reference, "finney")


def test_an_inference_server_on_finney_with_another_model_stops_at_start(model_dirs, tmp_path, monkeypatch, caplog):
    """A miner's inference server pointed at another model served and failed every validator's
    check; on finney it now ends its start with the one line naming the differences."""
    from quasar import config
    from quasar.chain import factory
    from quasar.chain.devchain import DevChain
    from quasar.inference import cli
    from quasar.localnet.host import make_wallet

    wallet = make_wallet(tmp_path / "wallets", "miner")
    chain = DevChain(tmp_path / "chain.sqlite3", netuid=3)
    chain.register_wallet(wallet)
    monkeypatch.setattr(factory, "connect", lambda settings: chain)  # finney itself: the outer boundary
    values = {
        "network": "finney",
        "netuid": "3",
        "wallet_path": str(tmp_path / "wallets"),
        "wallet_name": "miner",
        "reference_model": str(model_dirs[1]),
        "device": "cpu",
    }
    with socket.socket() as held:  # a server past its start fails to bind here instead of serving on
        held.bind(("127.0.0.1", 0))
        held.listen()
        values.update(inference_host="127.0.0.1", miner_inference_port=str(held.getsockname()[1]))
        settings = config.resolve(values, environ={}, dotenv_path=None)
        with caplog.at_level("ERROR", logger="quasar.inference"):
            assert cli.serve(settings) == 1
    assert f"'{model_dirs[1]}' is not Qwen/Qwen2.5-0.5B-Instruct's architecture" in caplog.text
    assert f"vocab_size {TINY_VOCAB} (the reference's 151936)" in caplog.text


def test_loading_the_reference_under_pm2_writes_no_progress_bar(tmp_path):
    """transformers drew its 'Loading weights' bar on stderr, under pm2 too, where a bar redrawn by
    carriage returns is one line growing in the log file; on a terminal it stays."""
    make_tiny_qwen2(tmp_path / "model")
    program = (
        "import sys\n"
        "from transformers.utils import logging as hf_logging\n"
        "from quasar.log import setup_logging\n"
        "from quasar.logits import load_reference_model\n"
        "setup_logging()\n"
        "load_reference_model(sys.argv[1], 'cpu', 'float32')\n"
        "print(hf_logging.is_progress_bar_enabled())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program, str(tmp_path / "model")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "reference model" in done.stderr and "loaded on cpu" in done.stderr, done.stderr
    assert "\r" not in done.stderr and "Loading weights" not in done.stderr, repr(done.stderr)
    assert done.stdout.strip() == "True"  # the bars are the library's again after the load
